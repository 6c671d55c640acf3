#!/usr/bin/env bash
# What the command line writes and where: no byte sequence from a capsule or a file name reaches
# the terminal raw (inspect, report, diff, verify, error messages), a lost write to standard
# output is exit status 2, -o never replaces an existing file without --force, never anything
# but a regular file, and never the command's own input; a FIFO as input never hangs a reader.
# Usage: output_safety_test.sh CAPSULE_BIN SOURCE_DIR
set -uo pipefail
capsule=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() { echo "FAIL [$1]: $2"; fail=1; }
hostile="$src/tests/fuzz/corpus/ok-hostile-text.capsule"
full="$src/samples/golden/valid/full.capsule"
keys="$src/samples/keys"
install -m 0600 "$keys/test-only-other.key" "$work/other.key"

# The bytes a terminal acts on: C0 but \n and \t (which only move forward), DEL, C1 (UTF-8 C2 80..9F), bidi controls (E2 80 8E/8F,
# E2 80 AA..AE, E2 81 A6..A9). Prints the first offending line, quoted, when there is one.
raw_controls() {
  /usr/bin/python3 - "$1" <<'PY'
import re, sys
data = open(sys.argv[1], 'rb').read()
bad = re.compile(rb'[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xaa-\xae\xa8\xa9]|\xe2\x81[\xa6-\xa9]')
m = bad.search(data)
if m:
    line = data[:m.start()].count(b'\n') + 1
    print(f"line {line}: {data.splitlines()[line - 1]!r}")
    sys.exit(1)
PY
}

check_clean() {  # NAME FILE...
  local name=$1; shift
  for f in "$@"; do
    if ! out=$(raw_controls "$f"); then bad "$name" "raw control in $(basename "$f"): $out"; fi
  done
}

# inspect: the forged signature line is shown escaped, and the real one is the only one.
"$capsule" inspect "$hostile" --allow-unsigned > "$work/inspect.out" 2> "$work/inspect.err"
rc=$?
[ $rc -eq 0 ] || bad inspect "exit $rc: $(cat "$work/inspect.err")"
check_clean inspect "$work/inspect.out" "$work/inspect.err"
grep -qF '\x1b[1A\r\x1b[2K  signature: verified' "$work/inspect.out" ||
  bad inspect "the forged text is not shown escaped: $(head -5 "$work/inspect.out")"
[ "$(grep -c '^  signature: ' "$work/inspect.out")" -eq 1 ] || bad inspect "more than one signature line"
grep -q '^  signature: unsigned$' "$work/inspect.out" || bad inspect "the real signature line is gone"
grep -qF '\u202egpj.exe' "$work/inspect.out" || bad inspect "bidi override not escaped"

# report (Markdown to stdout), diff and verify.
"$capsule" report "$hostile" --allow-unsigned > "$work/report.md" 2> "$work/report.err" ||
  bad report "exit $?: $(cat "$work/report.err")"
check_clean report "$work/report.md" "$work/report.err"
grep -q '@octocat' "$work/report.md" && bad report "a mention survived"
grep -q 'https://evil' "$work/report.md" && bad report "a link survived"
"$capsule" diff "$hostile" "$full" --allow-unsigned > "$work/diff.out" 2> "$work/diff.err"
[ $? -eq 1 ] || bad diff "expected exit 1 (differences): $(cat "$work/diff.err")"
check_clean diff "$work/diff.out" "$work/diff.err"
"$capsule" verify "$hostile" > "$work/verify.out" 2> "$work/verify.err"
check_clean verify "$work/verify.out" "$work/verify.err"

# A file name with escape sequences, in output and in error messages.
evil="$work/$(printf 'a\033[2Kb\rc\n')x.capsule"
cp "$hostile" "$evil"
"$capsule" inspect "$evil" --allow-unsigned > "$work/name.out" 2> "$work/name.err" ||
  bad name "exit $?"
"$capsule" verify "$evil" > "$work/name-verify.out" 2> "$work/name-verify.err"
"$capsule" inspect "$evil.missing" > "$work/name-missing.out" 2> "$work/name-missing.err"
check_clean file-name "$work/name.out" "$work/name.err" "$work/name-verify.out" \
  "$work/name-verify.err" "$work/name-missing.err"
[ "$(wc -l < "$work/name-missing.err")" -eq 1 ] || bad file-name "error message not on one line"
echo "ok: inspect, report, diff, verify and messages show hostile text escaped"

# Write errors on standard output.
if [ -w /dev/full ]; then
  "$capsule" report "$full" --pubkey "$keys/test-only.pub" > /dev/full 2> "$work/full.err"
  rc=$?
  [ $rc -eq 2 ] || bad dev-full "report > /dev/full exited $rc"
  grep -q "write error: standard output: No space left on device" "$work/full.err" ||
    bad dev-full "$(cat "$work/full.err")"
  "$capsule" inspect "$full" --pubkey "$keys/test-only.pub" --json > /dev/full 2> /dev/null
  [ $? -eq 2 ] || bad dev-full "inspect --json > /dev/full did not exit 2"
  echo "ok: a write error on standard output is exit 2"
else
  echo "skip: no writable /dev/full"
fi

# A reader that went away (`capsule report FILE | head -c 10`): the same write error, exit 2 with
# the reason, not a silent death by SIGPIPE (141). The reader is gone before anything is written.
for cmd in "report $full" "inspect $full --json" "verify $full"; do
  # shellcheck disable=SC2086
  ( sleep 0.5; exec "$capsule" $cmd --pubkey "$keys/test-only.pub" 2> "$work/pipe.err" ) | true
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 2 ] || bad closed-pipe "$cmd | (closed) exited $rc: $(cat "$work/pipe.err")"
  grep -q "write error: standard output: Broken pipe" "$work/pipe.err" ||
    bad closed-pipe "$cmd: $(cat "$work/pipe.err")"
done
echo "ok: a closed pipe on standard output is exit 2 with the reason"

# -o: never over an existing file without --force, never over anything but a regular file.
echo old > "$work/r.md"
"$capsule" report "$full" --pubkey "$keys/test-only.pub" -o "$work/r.md" 2> "$work/o.err"
rc=$?
[ $rc -eq 2 ] || bad no-force "report -o EXISTING exited $rc"
grep -q "already exists.*--force to replace it" "$work/o.err" || bad no-force "$(cat "$work/o.err")"
[ "$(cat "$work/r.md")" = old ] || bad no-force "the existing file was replaced"
"$capsule" report "$full" --pubkey "$keys/test-only.pub" -o "$work/r.md" --force ||
  bad force "report -o EXISTING --force exited $?"
grep -q "capsule report" "$work/r.md" || bad force "not replaced with --force"
mkfifo "$work/fifo"
timeout 20 "$capsule" report "$full" --pubkey "$keys/test-only.pub" -o "$work/fifo" --force \
  2> "$work/fifo.err"
rc=$?
[ $rc -eq 2 ] || bad fifo-out "report -o FIFO --force exited $rc"
[ -p "$work/fifo" ] || bad fifo-out "the FIFO was replaced"
for cmd in redact extract; do
  [ "$cmd" = extract ] && ! "$capsule" --help | grep -q '^  extract' && continue
  cp "$full" "$work/in.capsule"
  before=$(sha256sum "$work/in.capsule")
  if [ "$cmd" = redact ]; then
    args=(redact "$work/in.capsule" --drop host --key "$work/other.key")
  else
    args=(extract "$work/in.capsule" --layer blocks.0 --key "$work/other.key")
  fi
  "$capsule" "${args[@]}" --pubkey "$keys/test-only.pub" -o "$work/in.capsule" --force \
    2> "$work/self.err"
  rc=$?
  [ $rc -eq 2 ] || bad "$cmd-self" "$cmd -o INPUT --force exited $rc"
  [ "$(sha256sum "$work/in.capsule")" = "$before" ] || bad "$cmd-self" "the input was replaced"
done
"$capsule" redact "$full" --drop host --key "$work/other.key" --pubkey "$keys/test-only.pub" \
  -o "$work/r.md" 2> "$work/redact.err"
[ $? -eq 2 ] || bad redact-no-force "redact -o EXISTING did not exit 2"
grep -q -- "--force" "$work/redact.err" || bad redact-no-force "$(cat "$work/redact.err")"
"$capsule" redact "$full" --drop host --key "$work/other.key" --pubkey "$keys/test-only.pub" \
  -o "$work/r.md" --force > /dev/null || bad redact-force "redact -o EXISTING --force failed"
"$capsule" verify "$work/r.md" --pubkey "$keys/test-only-other.pub" > /dev/null ||
  bad redact-force "the forced output does not verify"
echo "ok: -o needs --force to replace, refuses a FIFO and the input itself"

# Usage errors name what was wrong, briefly.
"$capsule" frobnicate 2> "$work/unknown.err"
[ $? -eq 2 ] || bad unknown-command "exit status"
grep -q "unknown command 'frobnicate'" "$work/unknown.err" || bad unknown-command "$(cat "$work/unknown.err")"
# (replay runs in capsule-torch, beside capsule in a LibTorch build.)
if [ -x "$(dirname "$capsule")/capsule-torch" ]; then
  "$capsule" replay "$full" --pubkey "$keys/test-only.pub" --atol -1 2> "$work/atol.err"
  [ $? -eq 2 ] || bad atol "exit status"
  grep -q -- "--atol: -1 is not a number >= 0" "$work/atol.err" || bad atol "$(cat "$work/atol.err")"
  [ "$(wc -c < "$work/atol.err")" -lt 200 ] || bad atol "a $(wc -c < "$work/atol.err")-byte message"
fi

# On a terminal, a progress line is redrawn in place: its own carriage return and erase-line
# reach the terminal as they are (the filter lets nothing else through), its text stays escaped.
if [ -x "$(dirname "$capsule")/capsule-torch" ] && command -v script > /dev/null; then
  script -qec "$(printf '%q ' "$capsule" replay "$full" --pubkey "$keys/test-only.pub")" \
    /dev/null > "$work/tty.out" 2>&1
  grep -qF $'\r\033[K[replay] ' "$work/tty.out" ||
    bad progress "no progress line redrawn in place: $(od -c "$work/tty.out" | head -5)"
  grep -qF '\x1b[K' "$work/tty.out" && bad progress "its control sequence is shown escaped"
  echo "ok: a progress line on a terminal is redrawn in place"
fi

# A FIFO as input is refused at once, by every reader.
for cmd in inspect verify report; do
  timeout 20 "$capsule" "$cmd" "$work/fifo" --pubkey "$keys/test-only.pub" > /dev/null \
    2> "$work/fifo-in.err"
  rc=$?
  [ $rc -eq 124 ] && bad fifo-in "$cmd hangs on a FIFO"
  [ $rc -eq 2 ] || bad fifo-in "$cmd FIFO exited $rc"
  grep -q "not a regular file" "$work/fifo-in.err" || bad fifo-in "$(cat "$work/fifo-in.err")"
done
echo "ok: a FIFO as input is refused without blocking"
exit $fail
