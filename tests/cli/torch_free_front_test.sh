#!/usr/bin/env bash
# `capsule` starts without LibTorch: it links none of LibTorch's libraries, answers the format
# commands itself, and hands replay and extract to capsule-torch beside it (cli/torch_forward.h),
# never to one in the current directory; without capsule-torch it says what is missing instead of
# "unknown command".
# Usage: torch_free_front_test.sh CAPSULE_BIN SOURCE_DIR
set -uo pipefail
capsule=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() { echo "FAIL [$1]: $2"; fail=1; }

libs=$(ldd "$capsule")
if echo "$libs" | grep -q -E 'libtorch|libc10'; then
  bad links "capsule links LibTorch: $(echo "$libs" | grep -E 'libtorch|libc10' | tr '\n' ' ')"
else
  echo "ok: capsule links $(echo "$libs" | wc -l) shared libraries, none of LibTorch's"
fi
"$capsule" --help | grep -q "^  replay " || bad help "capsule --help does not list replay"
"$capsule" --help | grep -q "^  extract " || bad help "capsule --help does not list extract"

# Forwarded: the help of replay comes from capsule-torch when it is there.
if [ -x "$(dirname "$capsule")/capsule-torch" ]; then
  "$capsule" replay --help | grep -q -- "--bisect" || bad forward "replay --help has no --bisect"
  "$capsule" replay "$src/samples/golden/valid/minimal.capsule" \
    --pubkey "$src/samples/keys/test-only.pub" > /dev/null 2> "$work/err"
  rc=$?
  # Read, then refused by the replayer itself: the golden names no model (exit 2, the reason).
  [ $rc -eq 2 ] && grep -q "names no model" "$work/err" ||
    bad forward "replay of the golden exited $rc: $(cat "$work/err")"
  echo "ok: replay and extract are handed to capsule-torch"
fi

# Alone, without capsule-torch: a clear refusal, exit 2; the format commands still work.
cp "$capsule" "$work/capsule"
"$work/capsule" replay x.capsule > /dev/null 2> "$work/alone.err"
rc=$?
[ $rc -eq 2 ] && grep -q "needs capsule-torch" "$work/alone.err" ||
  bad alone "replay without capsule-torch exited $rc: $(cat "$work/alone.err")"
"$work/capsule" verify "$src/samples/golden/valid/minimal.capsule" \
  --pubkey "$src/samples/keys/test-only.pub" > /dev/null || bad alone "verify failed"
[ $fail -eq 0 ] && echo "ok: without capsule-torch: $(head -c 160 "$work/alone.err")"

# capsule-torch is looked for beside this executable only, never in the current directory: not
# even when this executable's own path cannot be read in one go (here: over 5,000 bytes long).
mkdir "$work/cwd"
printf '#!/bin/sh\necho POISONED: capsule-torch ran from the current directory\n' \
  > "$work/cwd/capsule-torch"
chmod +x "$work/cwd/capsule-torch"
(
  cd "$work" || exit 1
  part=$(printf 'd%.0s' $(seq 1 250))
  for _ in $(seq 1 20); do mkdir "$part" && cd "$part" || exit 1; done
  cp "$capsule" capsule || exit 1
  exec 3< capsule  # run it through its descriptor: a path this long is not accepted by execve
  cd "$work/cwd" || exit 1
  /proc/self/fd/3 replay x.capsule > "$work/long.out" 2>&1
  echo $? > "$work/long.rc"
)
rc=$(cat "$work/long.rc" 2>/dev/null || echo none)
if grep -q POISONED "$work/long.out"; then
  bad long-path "ran capsule-torch from the current directory: $(cat "$work/long.out")"
elif [ "$rc" != 2 ] || ! grep -q "capsule-torch" "$work/long.out"; then
  bad long-path "exit $rc: $(cat "$work/long.out")"
else
  echo "ok: a long path never sends it to the current directory: $(head -c 200 "$work/long.out")"
fi
exit $fail
