#!/usr/bin/env bash
# Decodes and verifies a capsule with stock tools only, following proto/FORMAT.md section
# "Decoding and verifying with stock tools": dd/od/head (coreutils), zstd, protoc, openssl.
# Usage: stock_tools_test.sh CAPSULE_BIN MAKE_GOLDEN_BIN SOURCE_DIR
set -euo pipefail
capsule_bin=$1
make_golden=$2
src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for tool in dd od zstd protoc openssl; do
  command -v "$tool" >/dev/null || { echo "missing stock tool: $tool (run scripts/setup-deps.sh)"; exit 1; }
done

check_capsule() {
  local f=$1 pub=$2
  # 1. Header fields (FORMAT.md "Header"): little-endian integers at fixed offsets.
  local magic header_size payload_size uncompressed_size
  magic=$(od -An -tx1 -N8 "$f" | tr -d ' \n')
  [ "$magic" = "894350530d0a1a0a" ] || { echo "FAIL: bad magic $magic"; return 1; }
  header_size=$(od -An -tu4 -j12 -N4 "$f" | tr -d ' ')
  payload_size=$(od -An -tu8 -j24 -N8 "$f" | tr -d ' ')
  uncompressed_size=$(od -An -tu8 -j32 -N8 "$f" | tr -d ' ')

  # 2. Payload: one zstd frame; zstd checks its content checksum.
  dd if="$f" of="$work/payload.zst" bs=1 skip="$header_size" count="$payload_size" status=none
  zstd -q -d -f "$work/payload.zst" -o "$work/payload.bin"
  [ "$(stat -c %s "$work/payload.bin")" = "$uncompressed_size" ] ||
    { echo "FAIL: uncompressed size differs from the header"; return 1; }

  # 3. Protobuf: decodes as capsule.v1.Capsule.
  protoc --decode=capsule.v1.Capsule -I "$src" "$src/proto/capsule.proto" \
    < "$work/payload.bin" > "$work/capsule.txt"
  grep -q '^trigger {' "$work/capsule.txt" || { echo "FAIL: protoc output has no trigger"; return 1; }

  # 4. Signed message: domain tag || header bytes || SHA-256(payload bytes).
  local trailer=$((header_size + payload_size))
  printf 'capsule/sign/v1\n' > "$work/msg.bin"
  head -c "$header_size" "$f" >> "$work/msg.bin"
  openssl dgst -sha256 -binary "$work/payload.zst" >> "$work/msg.bin"

  # 5. Digest (trailer offset 40, 32 bytes) is SHA-256 of the signed message.
  local digest want
  digest=$(od -An -tx1 -j$((trailer + 40)) -N32 "$f" | tr -d ' \n')
  want=$(openssl dgst -sha256 -binary "$work/msg.bin" | od -An -tx1 | tr -d ' \n')
  [ "$digest" = "$want" ] || { echo "FAIL: digest mismatch"; return 1; }

  # 6. Key id (trailer offset 8) is SHA-256 of the raw public key: the last 32 bytes of its DER.
  local key_id pub_id
  key_id=$(od -An -tx1 -j$((trailer + 8)) -N32 "$f" | tr -d ' \n')
  pub_id=$(openssl pkey -pubin -in "$pub" -outform DER | tail -c 32 | openssl dgst -sha256 -binary |
    od -An -tx1 | tr -d ' \n')
  [ "$key_id" = "$pub_id" ] || { echo "FAIL: key id is not SHA-256 of the public key"; return 1; }

  # 7. Ed25519 signature (trailer offset 72, 64 bytes).
  dd if="$f" of="$work/sig.bin" bs=1 skip=$((trailer + 72)) count=64 status=none
  openssl pkeyutl -verify -pubin -inkey "$pub" -rawin -in "$work/msg.bin" -sigfile "$work/sig.bin" \
    > "$work/verify.txt"
  grep -q "Signature Verified Successfully" "$work/verify.txt" ||
    { echo "FAIL: openssl did not verify the signature"; return 1; }
}


for f in "$src/samples/golden/valid/minimal.capsule" "$src/samples/golden/valid/full.capsule"; do
  check_capsule "$f" "$src/samples/keys/test-only.pub"
  echo "ok: $(basename "$f") decoded and verified with stock tools"
done

# Negative control: a flipped payload byte must make openssl refuse.
cp "$src/samples/golden/invalid/payload_flipped.capsule" "$work/flipped.capsule"
if check_capsule "$work/flipped.capsule" "$src/samples/keys/test-only.pub" >/dev/null 2>&1; then
  echo "FAIL: stock tools accepted a tampered capsule"; exit 1
fi
echo "ok: tampered capsule rejected by stock tools"

# Capsules signed by this library with keys made by openssl itself verify with openssl.
mkdir -p "$work/keys"
for k in test-only test-only-other; do
  openssl genpkey -algorithm ed25519 -out "$work/keys/$k.key" 2>/dev/null
  chmod 600 "$work/keys/$k.key"
  openssl pkey -in "$work/keys/$k.key" -pubout -out "$work/keys/$k.pub"
done
"$make_golden" "$work/keys" "$work/golden" >/dev/null
check_capsule "$work/golden/valid/full.capsule" "$work/keys/test-only.pub"
echo "ok: capsule signed with an openssl-made key verified by openssl"
"$capsule_bin" verify "$work/golden/valid/full.capsule" --pubkey "$work/keys/test-only.pub" >/dev/null
echo "ok: capsule verify accepts it with the openssl-made public key"

# Our verifier agrees with openssl's key: sign with the openssl-made key, verify with capsule.
"$capsule_bin" verify "$src/samples/golden/valid/minimal.capsule" --pubkey "$work/keys/test-only.pub" \
  >/dev/null 2>&1 && { echo "FAIL: capsule accepted a signature by another key"; exit 1; }
echo "ok: capsule verify refuses a key the capsule was not signed with"
