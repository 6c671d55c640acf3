#!/usr/bin/env bash
# Verifies a capsule with stock tools only (bash, coreutils dd/od/stat/head/tail, openssl, zstd,
# protoc), running proto/FORMAT.md §6 "Reading" in its order: the envelope, the digest and the
# signature before anything is decompressed, then the zstd frame, then protobuf. It answers as
# `capsule verify` does, so the two can be compared on any file:
#   FILE: OK, signed by key <64 hex>                          exit 0
#   FILE: UNTRUSTED, valid signature by unknown key <64 hex>  exit 3 (no --pubkey names the signer)
#   FILE: UNTRUSTED, signed by key <64 hex>; made by ...     exit 3 (made from an untrusted capsule)
#   FILE: FAILED (DATA_LOSS)    exit 3 for UNAUTHENTICATED, 4 for DATA_LOSS, OUT_OF_RANGE and
#                               INVALID_ARGUMENT, else 2; always 2 when check 1 fails (the file
#                               was not judged)
# with the reason on stderr. Integers are read little-endian whatever the host (od --endian).
#
# Not checked (they need a protobuf wire parser or the schema's rules in code): the wire limits
# of checks 15-18 and the content rules of check 20 (FORMAT.md §6, §6.2). A capsule that breaks
# only those is OK here and refused by `capsule verify`.
#
# Usage: verify-with-stock-tools.sh FILE (--pubkey PUB.pem)... [--allow-unsigned] [--proto DIR]
#   --allow-unsigned  accept an unsigned capsule (`capsule inspect --allow-unsigned` reads it)
#   --proto DIR       the directory holding proto/capsule.proto (default: this script's repo)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
proto_root="$here/.."
file=""
pubkeys=()
allow_unsigned=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pubkey) pubkeys+=("$2"); shift 2 ;;
    --allow-unsigned) allow_unsigned=1; shift ;;
    --proto) proto_root=$2; shift 2 ;;
    -*) echo "usage: $0 FILE (--pubkey PUB)... [--allow-unsigned] [--proto DIR]" >&2; exit 2 ;;
    *) file=$1; shift ;;
  esac
done
if [ -z "$file" ]; then
  echo "usage: $0 FILE (--pubkey PUB)... [--allow-unsigned] [--proto DIR]" >&2
  exit 2
fi
for tool in dd od stat head tail openssl zstd protoc; do
  command -v "$tool" >/dev/null || { echo "verify-with-stock-tools: missing tool: $tool" >&2; exit 2; }
done
work=$(mktemp -d)
exit_status=0
trap 'rm -rf "$work"' EXIT

# fail CODE MESSAGE: prints the verdict as `capsule verify` does and exits with its status.
fail() {
  echo "verify-with-stock-tools: $2" >&2
  echo "$file: FAILED ($1)"
  case "$1" in
    UNAUTHENTICATED) exit 3 ;;
    DATA_LOSS | OUT_OF_RANGE | INVALID_ARGUMENT) exit 4 ;;
    *) exit 2 ;;
  esac
}
# unreadable CODE MESSAGE: as fail, for check 1: the file could not be read, so it was not judged.
unreadable() {
  echo "verify-with-stock-tools: $2" >&2
  echo "$file: FAILED ($1)"
  exit 2
}
# load NAME OFFSET COUNT: the bytes at OFFSET as decimal numbers in array NAME (one od call;
# a file is read a few times in all, not once per field).
load() {
  local -n into=$1
  # shellcheck disable=SC2207
  into=($(od -An -v -t u1 -j "$2" -N "$3" "$file"))
}
# le NAME INDEX COUNT: the unsigned little-endian integer of COUNT bytes of NAME from INDEX.
# 8-byte values of 2^63 and more come out negative: huge() catches them.
le() {
  local -n from=$1
  local v=0 k
  for ((k = $3 - 1; k >= 0; k--)); do v=$(((v << 8) | from[$2 + k])); done
  echo "$v"
}
# hexof NAME INDEX COUNT: the bytes as lowercase hex.
hexof() {
  local -n from=$1
  printf '%02x' "${from[@]:$2:$3}"
}
# More than any file this reads (1 GiB), or past bash's signed 64-bit arithmetic.
huge() { [ "$1" -lt 0 ] || [ "$1" -gt 1099511627776 ]; }
sha256_hex() { openssl dgst -sha256 -binary "$@" | od -An -v -t x1 | tr -d ' \n'; }

# 1. A regular file within the 1 GiB file limit.
[ -e "$file" ] || unreadable NOT_FOUND "cannot open $file: No such file or directory"
[ -f "$file" ] || unreadable INVALID_ARGUMENT "$file is not a regular file"
size=$(stat -L -c %s "$file")
[ "$size" -le 1073741824 ] || unreadable RESOURCE_EXHAUSTED "$file is $size bytes, over the limit of 1073741824"

# 2. Magic. Empty is no capsule; a non-empty prefix of the magic is a capsule cut short.
magic=894350530d0a1a0a
[ "$size" -gt 0 ] || fail INVALID_ARGUMENT "empty file (0 bytes): not a capsule"
load H 0 48
head_hex=$(hexof H 0 8)
if [ "$size" -lt 8 ]; then
  [ "$head_hex" = "${magic:0:$((2 * size))}" ] && fail OUT_OF_RANGE "truncated capsule: $size bytes"
  fail INVALID_ARGUMENT "not a capsule (bad magic number)"
fi
[ "$head_hex" = "$magic" ] || fail INVALID_ARGUMENT "not a capsule (bad magic number)"
[ "$size" -ge 48 ] || fail OUT_OF_RANGE "truncated capsule: $size bytes"

# 3, 4. Version and required flags.
major=$(le H 8 2)
minor=$(le H 10 2)
[ "$major" -le 1 ] || fail UNIMPLEMENTED "format $major.$minor is newer than this reader (reads up to 1.x)"
[ "$major" -ne 0 ] || fail DATA_LOSS "corrupt header (format major version 0)"
required=$(le H 16 4)
[ "$required" -eq 0 ] || fail UNIMPLEMENTED "capsule needs features this reader lacks (required flags $required)"

# 5. The other header fields.
hs=$(le H 12 4)
ps=$(le H 24 8)
us=$(le H 32 8)
codec=$(le H 40 4)
[ "$hs" -ge 48 ] && [ "$hs" -le 1048576 ] || fail DATA_LOSS "corrupt header (header size $hs)"
[ "$codec" -eq 1 ] || fail DATA_LOSS "corrupt header (unknown payload codec $codec)"
[ "$(le H 44 4)" -eq 0 ] || fail DATA_LOSS "corrupt header (reserved field is not zero)"

# 6. Declared sizes against the file size; while the trailer's fixed 84 bytes are missing,
# sig_size is unknown and header_size + payload_size + 84 is the size reported.
{ huge "$ps" || [ "$ps" -gt "$size" ]; } && fail OUT_OF_RANGE "truncated capsule: $size bytes"
t=$((hs + ps))
[ "$size" -ge $((t + 84)) ] || fail OUT_OF_RANGE "truncated capsule: $size bytes, header declares $((t + 84))"
load T "$t" 72   # sig_alg, sig_size, reserved, key_id, digest
sig_alg=$(le T 0 2)
sig_size=$(le T 2 2)
total=$((t + 84 + sig_size))
[ "$size" -ge "$total" ] || fail OUT_OF_RANGE "truncated capsule: $size bytes, header declares $total"
[ "$size" -eq "$total" ] || fail DATA_LOSS "corrupt capsule ($((size - total)) bytes after the declared end)"

# 7. End magic, trailer size, trailer reserved field.
load E $((size - 12)) 12   # trailer_size, end magic
[ "$(hexof E 4 8)" = "89435053454e440a" ] || fail DATA_LOSS "corrupt trailer (bad end magic)"
[ "$(le E 0 4)" -eq $((84 + sig_size)) ] ||
  fail DATA_LOSS "corrupt trailer (trailer size does not match the signature size)"
[ "$(le T 4 4)" -eq 0 ] || fail DATA_LOSS "corrupt trailer (reserved field is not zero)"

# 8. The signature fields agree with the algorithm.
key_id=$(hexof T 8 32)
case "$sig_alg" in
  0) [ "$sig_size" -eq 0 ] && [ "$key_id" = "$(printf '0%.0s' $(seq 64))" ] ||
       fail DATA_LOSS "corrupt trailer (unsigned capsule with a key id or signature)" ;;
  1) [ "$sig_size" -eq 64 ] || fail DATA_LOSS "corrupt trailer (Ed25519 signature of $sig_size bytes)" ;;
  *) fail UNIMPLEMENTED "unknown signature algorithm $sig_alg" ;;
esac

# 9. Digest = SHA-256(signed message), signed message = domain tag | header | SHA-256(payload).
dd if="$file" of="$work/payload.zst" bs=4M iflag=skip_bytes,count_bytes skip="$hs" count="$ps" status=none
{ printf 'capsule/sign/v1\n'; head -c "$hs" "$file"; openssl dgst -sha256 -binary "$work/payload.zst"; } > "$work/msg.bin"
[ "$(hexof T 40 32)" = "$(sha256_hex "$work/msg.bin")" ] ||
  fail DATA_LOSS "corrupt capsule (digest mismatch: header or payload bytes changed)"

# 10, first (1.1). Optional flag bit 3: header bytes 48..80 are the signer's raw public key, whose
# SHA-256 is the key id. As a PEM file it is the fixed 12-byte DER prefix of an Ed25519
# SubjectPublicKeyInfo (RFC 8410) followed by those 32 bytes.
carried=""
if [ $(($(le H 20 4) & 8)) -ne 0 ]; then
  [ "$hs" -ge 80 ] || fail DATA_LOSS "corrupt header (signer key flag with a header of $hs bytes)"
  [ "$sig_alg" -eq 1 ] || fail DATA_LOSS "corrupt capsule (signer key in the header of an unsigned capsule)"
  dd if="$file" of="$work/key.raw" bs=32 iflag=skip_bytes skip=48 count=1 status=none
  [ "$(sha256_hex "$work/key.raw")" = "$key_id" ] ||
    fail DATA_LOSS "corrupt capsule (the header's signer key is not the trailer's key id)"
  # A key of small order verifies signatures anyone can make without its private key: refused
  # whatever the signature says (libsodium's list; the sign bit of x does not matter).
  y=$(od -An -tx1 -v "$work/key.raw" | tr -d ' \n')
  y="${y:0:62}$(printf %02x $((0x${y:62:2} & 0x7f)))"
  case "$y" in
    0000000000000000000000000000000000000000000000000000000000000000 | \
    0100000000000000000000000000000000000000000000000000000000000000 | \
    ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f | \
    edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f | \
    eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f | \
    26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05 | \
    c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a)
      fail UNAUTHENTICATED "capsule's signer key ${key_id:0:16} is not a valid Ed25519 public key: a point of small order" ;;
  esac
  { printf '\x30\x2a\x30\x05\x06\x03\x2b\x65\x70\x03\x21\x00'; cat "$work/key.raw"; } > "$work/key.der"
  openssl pkey -pubin -inform DER -in "$work/key.der" -out "$work/carried.pem" 2>/dev/null ||
    fail UNAUTHENTICATED "the header's signer key is not an Ed25519 public key"
  carried="$work/carried.pem"
fi

# 10. Signature: a trusted key's id, then Ed25519 over the signed message; without one, the key
# the capsule carries (above) checks the signature but is not trusted.
if [ "$sig_alg" -eq 0 ]; then
  [ "$allow_unsigned" -eq 1 ] || fail UNAUTHENTICATED "capsule is unsigned, so it cannot be verified"
  verdict="OK, unsigned"
else
  signer=""
  for pub in "${pubkeys[@]}"; do
    # The raw Ed25519 public key is the last 32 bytes of its DER SubjectPublicKeyInfo.
    if [ "$(openssl pkey -pubin -in "$pub" -outform DER 2>/dev/null | tail -c 32 | sha256_hex)" = "$key_id" ]; then
      signer=$pub
    fi
  done
  check=${signer:-$carried}
  if [ -n "$check" ]; then
    dd if="$file" of="$work/sig.bin" bs=64 iflag=skip_bytes skip=$((t + 72)) count=1 status=none
    openssl pkeyutl -verify -pubin -inkey "$check" -rawin -in "$work/msg.bin" \
      -sigfile "$work/sig.bin" >/dev/null 2>&1 ||
      fail UNAUTHENTICATED "bad signature: capsule was not signed by key ${key_id:0:16} or was altered"
  fi
  if [ -n "$signer" ]; then
    verdict="OK, signed by key $key_id"
  elif [ -n "$carried" ]; then
    verdict="UNTRUSTED, valid signature by unknown key $key_id"
    exit_status=3
  else
    verdict="UNTRUSTED, signed by key $key_id (format 1.0 carries no signer key; the signature needs --pubkey)"
    exit_status=3
  fi
fi

# 11. The uncompressed size within the 1 GiB cap (12, the ratio guard, is off by default).
{ huge "$us" || [ "$us" -gt 1073741824 ]; } &&
  fail RESOURCE_EXHAUSTED "payload declares $us bytes uncompressed, over the limit of 1073741824"

# 13. The zstd frame header (RFC 8878 §3.1.1), and exactly one frame filling the payload.
[ "$ps" -ge 5 ] || fail DATA_LOSS "payload is not a zstd frame (too short)"
load F "$hs" $((ps < 18 ? ps : 18))   # the frame header is at most 18 bytes
[ "$(hexof F 0 4)" = "28b52ffd" ] || fail DATA_LOSS "payload is not a zstd frame (bad magic)"
fhd=${F[4]}
fcs_flag=$((fhd >> 6)); single=$(((fhd >> 5) & 1)); checksum=$(((fhd >> 2) & 1)); did_flag=$((fhd & 3))
did_bytes=(0 1 2 4)
fcs_bytes=(0 2 4 8)
q=$((5 + (1 - single) + did_bytes[did_flag]))
fcs_len=${fcs_bytes[fcs_flag]}
[ "$fcs_flag" -eq 0 ] && [ "$single" -eq 1 ] && fcs_len=1
[ $(((fhd >> 3) & 1)) -eq 0 ] && [ $((q + fcs_len)) -le "$ps" ] ||
  fail DATA_LOSS "corrupt zstd frame header"
[ "$single" -eq 0 ] && wd=${F[5]} && window=$(((1 << (10 + (wd >> 3))) + ((1 << (10 + (wd >> 3))) / 8) * (wd & 7)))
did=$(le F $((q - did_bytes[did_flag])) "${did_bytes[did_flag]}")
fcs=$(le F "$q" "$fcs_len")
[ "$fcs_flag" -eq 1 ] && fcs=$((fcs + 256))
[ "$fcs_len" -gt 0 ] || fail DATA_LOSS "zstd frame does not declare its content size"
[ "$single" -eq 1 ] && window=$fcs
q=$((hs + q + fcs_len))   # file offset of the first block
# Blocks: a 3-byte header (last flag, type, size) each, then the 4-byte checksum.
end=$((hs + ps))
while :; do
  [ $((q + 3)) -le "$end" ] || fail DATA_LOSS "zstd frame is truncated or malformed"
  load B "$q" 3
  bh=$(le B 0 3)
  type=$(((bh >> 1) & 3)); bsize=$((bh >> 3))
  case "$type" in
    0 | 2) q=$((q + 3 + bsize)) ;;
    1) q=$((q + 4)) ;;
    3) fail DATA_LOSS "zstd frame is truncated or malformed" ;;
  esac
  [ $((bh & 1)) -eq 1 ] && break
done
[ "$checksum" -eq 1 ] && q=$((q + 4))
[ "$q" -le "$end" ] || fail DATA_LOSS "zstd frame is truncated or malformed"
[ "$fcs" = "$us" ] || fail DATA_LOSS "zstd frame declares $fcs bytes but the header says $us"
[ "$checksum" -eq 1 ] || fail DATA_LOSS "zstd frame has no content checksum"
[ "$q" -eq "$end" ] || fail DATA_LOSS "payload holds bytes after its zstd frame"
[ "$did" -eq 0 ] || fail DATA_LOSS "zstd frame needs dictionary $did; capsules use none"
{ huge "$window" || [ "$window" -gt 134217728 ]; } &&
  fail RESOURCE_EXHAUSTED "zstd frame needs a window of $window bytes, over the limit of 134217728"

# 14. Decompression; zstd checks the content checksum.
zstd -q -d -c "$work/payload.zst" > "$work/payload.bin" 2> "$work/zstd.err" ||
  fail DATA_LOSS "corrupt payload: zstd: $(tr '\n' ' ' < "$work/zstd.err")"
[ "$(stat -c %s "$work/payload.bin")" = "$us" ] || fail DATA_LOSS "zstd frame decompressed to the wrong size"

# 19. Protobuf: the bytes parse as capsule.v1.Capsule.
protoc --decode=capsule.v1.Capsule -I "$proto_root" "$proto_root/proto/capsule.proto" \
  < "$work/payload.bin" > "$work/capsule.txt" 2> "$work/protoc.err" ||
  fail DATA_LOSS "corrupt payload (not a capsule.v1.Capsule message)"

# 21. What the capsule was made from (Capsule.derivations, FORMAT.md §3.1): the least trusted
# source whose maker did not verify its signer, the first of the weakest. The capsule is trusted
# no further: a source that was unsigned is refused as an unsigned capsule is, and a signature
# by a trusted key over a capsule made from an untrusted one is not trusted.
rank_of() {
  case "$1" in
    TRUST_VALID_UNKNOWN_SIGNER) echo 1 ;; TRUST_NOT_CHECKED) echo 2 ;; TRUST_UNSIGNED) echo 3 ;;
    *) echo 0 ;;
  esac
}
unquote() { local v=${1#\"}; echo "${v%\"}"; }
weakest=0; in_derivation=0
while IFS= read -r line; do
  case "$line" in
    "derivations {") in_derivation=1; d_tool=""; d_sha=""; d_trust=""; d_key="" ;;
    "}")
      if [ "$in_derivation" -eq 1 ] && [ "$(rank_of "$d_trust")" -gt "$weakest" ]; then
        weakest=$(rank_of "$d_trust"); w_tool=$d_tool; w_sha=$d_sha; w_key=$d_key
      fi
      in_derivation=0 ;;
    "  tool: "*) d_tool=$(unquote "${line#  tool: }") ;;
    "  source_sha256: "*) d_sha=$(unquote "${line#  source_sha256: }") ;;
    "  source_trust: "*) d_trust=${line#  source_trust: } ;;
    "  source_signer_key_id: "*) d_key=$(unquote "${line#  source_signer_key_id: }") ;;
  esac
done < "$work/capsule.txt"
if [ "$weakest" -gt 0 ]; then
  made="made by $w_tool from capsule ${w_sha:0:16}"
  case "$weakest" in
    1) made="$made, valid signature by key ${w_key:0:16}, NOT trusted by its maker" ;;
    2) made="$made, signed by key ${w_key:0:16} (format 1.0), signature NOT checked by its maker" ;;
    3) made="$made, which was UNSIGNED" ;;
  esac
  [ "$weakest" -lt 3 ] || [ "$allow_unsigned" -eq 1 ] || fail UNAUTHENTICATED "capsule was $made"
  if [ "$exit_status" -eq 0 ] && [ "${verdict#OK, signed by key}" != "$verdict" ]; then
    verdict="UNTRUSTED, signed by key $key_id; $made"
    exit_status=3
  fi
fi

echo "$file: $verdict"
exit "$exit_status"
