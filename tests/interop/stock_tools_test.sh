#!/usr/bin/env bash
# scripts/verify-with-stock-tools.sh (proto/FORMAT.md §8: bash, dd, od, openssl, zstd, protoc)
# agrees with `capsule verify` — same verdict line, same exit status — on every golden sample,
# valid and invalid, on flips of every byte and cuts at every region of a small capsule, on files
# that are not capsules at all, and on capsules signed with keys made by openssl itself.
# Usage: stock_tools_test.sh CAPSULE_BIN MAKE_GOLDEN_BIN SOURCE_DIR
set -uo pipefail
capsule_bin=$1
make_golden=$2
src=$3
stock="$src/scripts/verify-with-stock-tools.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for tool in dd od zstd protoc openssl; do
  command -v "$tool" >/dev/null || { echo "missing stock tool: $tool (run scripts/setup-deps.sh)"; exit 1; }
done

fail=0
checked=0
declare -A verdicts
# agree FILE PUB...: both verifiers give the same stdout and exit status.
agree() {
  local f=$1; shift
  local args=()
  for p in "$@"; do args+=(--pubkey "$p"); done
  local ours theirs ours_rc theirs_rc
  ours=$("$capsule_bin" verify "$f" "${args[@]}" 2>/dev/null); ours_rc=$?
  theirs=$(bash "$stock" "$f" "${args[@]}" --proto "$src" 2>"$work/stock.err"); theirs_rc=$?
  checked=$((checked + 1))
  if [ "$ours" != "$theirs" ] || [ "$ours_rc" != "$theirs_rc" ]; then
    echo "FAIL: $f: capsule verify says '$ours' (exit $ours_rc), stock tools '$theirs' (exit $theirs_rc): $(cat "$work/stock.err")"
    fail=1
  fi
  verdicts["${ours##*: }"]=1
}

# flip FILE OFFSET MASK OUT: a copy of FILE with one byte xor-ed.
flip() {
  cp "$1" "$4"
  local b
  b=$(od -An -t u1 -j "$2" -N 1 "$1" | tr -d ' ')
  printf "\\x$(printf %02x $((b ^ $3)))" | dd of="$4" bs=1 seek="$2" conv=notrunc status=none
}

keys=$src/samples/keys
# 1. Every golden sample.
for f in "$src"/samples/golden/valid/*.capsule "$src"/samples/golden/invalid/*.capsule; do
  agree "$f" "$keys/test-only.pub"
done
echo "ok: golden samples: the same verdict from both"

# 2. Flips in every field of the minimal capsule (every byte of the header and of the trailer's
# fixed fields, every 4th elsewhere), and cuts at every region boundary.
min="$src/samples/golden/valid/minimal.capsule"
size=$(stat -c %s "$min")
t=$(( $(od -An -t u4 --endian=little -j 12 -N 4 "$min") + $(od -An -t u8 --endian=little -j 24 -N 8 "$min") ))
for ((i = 0; i < size; i++)); do
  if [ "$i" -lt 80 ] || { [ "$i" -ge "$t" ] && [ "$i" -lt $((t + 8)) ]; } ||
     [ "$i" -ge $((size - 12)) ] || [ $((i % 4)) -eq 0 ]; then
    flip "$min" "$i" 1 "$work/flip.capsule"
    agree "$work/flip.capsule" "$keys/test-only.pub"
  fi
done
for n in 0 1 7 8 20 47 48 60 79 80 114 146 147 162 199 250 286 287 294; do
  head -c "$n" "$min" > "$work/cut.capsule"
  agree "$work/cut.capsule" "$keys/test-only.pub"
done
cp "$min" "$work/longer.capsule" && printf 'x' >> "$work/longer.capsule"
agree "$work/longer.capsule" "$keys/test-only.pub"
echo "ok: flips in every field and cuts of minimal.capsule: the same verdict from both"

# 3. A major version and a signature algorithm changed in place, and trusting another key.
flip "$min" 8 3 "$work/major.capsule"   # major 1 -> 2
agree "$work/major.capsule" "$keys/test-only.pub"
flip "$min" "$t" 3 "$work/alg.capsule"  # sig_alg 1 -> 2
agree "$work/alg.capsule" "$keys/test-only.pub"
agree "$min" "$keys/test-only-other.pub"
agree "$min" "$keys/test-only-other.pub" "$keys/test-only.pub"
# No key given: 1.1 carries the signer's key, so both check the signature and trust nobody.
agree "$min"
agree "$src/samples/golden/valid/full.capsule"
flip "$min" $((t + 72 + 9)) 16 "$work/badsig.capsule"
agree "$work/badsig.capsule"
# Format 1.0 capsules carry no key: the signature is checked only with --pubkey.
frozen="$src/samples/golden/frozen-v1.0"
for f in "$frozen"/valid/*.capsule "$frozen"/invalid/*.capsule; do
  agree "$f"
  agree "$f" "$frozen/test-only.pub"
  agree "$f" "$keys/test-only-other.pub"
done
echo "ok: no key, another key, and format 1.0: the same verdict from both"

# 4. Files that are not capsules.
: > "$work/empty.capsule"
agree "$work/empty.capsule" "$keys/test-only.pub"
agree "$work" "$keys/test-only.pub"
mkfifo "$work/fifo.capsule"
agree "$work/fifo.capsule" "$keys/test-only.pub"
agree /dev/null "$keys/test-only.pub"
agree "$work/missing.capsule" "$keys/test-only.pub"
echo "ok: empty file, directory, fifo, device, missing file: the same verdict from both"

# 5. Capsules signed by this library with keys made by openssl itself.
mkdir -p "$work/keys"
for k in test-only test-only-other; do
  openssl genpkey -algorithm ed25519 -out "$work/keys/$k.key" 2>/dev/null
  chmod 600 "$work/keys/$k.key"
  openssl pkey -in "$work/keys/$k.key" -pubout -out "$work/keys/$k.pub"
done
"$make_golden" "$work/keys" "$work/golden" >/dev/null
for f in "$work"/golden/valid/*.capsule "$work"/golden/invalid/*.capsule; do
  agree "$f" "$work/keys/test-only.pub"
done
bash "$stock" "$work/golden/valid/full.capsule" --pubkey "$work/keys/test-only.pub" --proto "$src" \
  > /dev/null 2>&1 || { echo "FAIL: stock tools refused a capsule signed with an openssl-made key"; fail=1; }
agree "$work/golden/valid/full.capsule"
echo "ok: capsules signed with openssl-made keys: the same verdict from both"

# 6. A capsule "signed" by a small-order key, a forgery anyone can make: refused by both, with or
# without a key (the goldens made from other capsules are in step 1).
command -v python3 >/dev/null || { echo "missing python3"; exit 1; }
python3 "$src/tests/cli/forge_small_order_key.py" "$min" "$work/small-order.capsule"
agree "$work/small-order.capsule"
agree "$work/small-order.capsule" "$keys/test-only.pub"
echo "ok: a small-order signer key: the same verdict from both"

# The comparison proves something only if the verdicts differ among themselves.
for want in "OK, signed by key" "UNTRUSTED, valid signature by unknown key" \
            "UNTRUSTED, signed by key" "FAILED (DATA_LOSS)" "FAILED (OUT_OF_RANGE)" "FAILED (UNAUTHENTICATED)" \
            "FAILED (INVALID_ARGUMENT)" "FAILED (UNIMPLEMENTED)" "FAILED (RESOURCE_EXHAUSTED)" \
            "FAILED (NOT_FOUND)"; do
  found=0
  for v in "${!verdicts[@]}"; do [ "${v#"$want"}" != "$v" ] && found=1; done
  [ "$found" = 1 ] || { echo "FAIL: no case gave '$want'"; fail=1; }
done
echo "$checked files compared"
exit $fail
