#!/usr/bin/env bash
# `capsule redact` on the golden full capsule: the output verifies with the re-signing key (and not
# with the source's), `inspect` reads it and shows what was dropped, the private key is never
# printed, and every refusal has the documented exit status.
# Usage: redact_cli_test.sh CAPSULE_BIN SOURCE_DIR
set -uo pipefail
capsule=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() { echo "FAIL [$1]: $2"; fail=1; }
full="$src/samples/golden/valid/full.capsule"
keys="$src/samples/keys"
install -m 0600 "$keys/test-only-other.key" "$work/other.key"

"$capsule" redact "$full" --drop text,tokens,paths,host --key "$work/other.key" -o "$work/r.capsule" \
  --pubkey "$keys/test-only.pub" > "$work/out" 2> "$work/err"
rc=$?
[ $rc -eq 0 ] || bad redact "exit $rc: $(cat "$work/err")"
grep -q "BEGIN\|PRIVATE" "$work/out" "$work/err" && bad redact "key material printed"
"$capsule" verify "$work/r.capsule" --pubkey "$keys/test-only-other.pub" --deep > /dev/null ||
  bad verify "redacted capsule does not verify with the re-signing key"
"$capsule" verify "$work/r.capsule" --pubkey "$keys/test-only.pub" > /dev/null 2>&1
[ $? -eq 3 ] || bad verify-source-key "redacted capsule verifies with the source's key"
"$capsule" inspect "$work/r.capsule" --pubkey "$keys/test-only-other.pub" > "$work/inspect" ||
  bad inspect "inspect failed"
grep -q "^redacted: text tokens paths host$" "$work/inspect" || bad inspect "$(cat "$work/inspect")"
json=$("$capsule" inspect "$work/r.capsule" --pubkey "$keys/test-only-other.pub" --json)
want_sha=$(sha256sum "$full" | cut -d' ' -f1)
echo "$json" | grep -q "\"source_sha256\":\"$want_sha\"" || bad inspect-json "no source_sha256"
echo "$json" | grep -q '"optional_flags":[13579]' || bad inspect-json "redacted flag not set"
echo "$json" | grep -q '"raw_text"' && bad inspect-json "raw_text survived"
echo "$json" | grep -q '"hostname"' && bad inspect-json "hostname survived"
echo "ok: redacted full.capsule verifies, inspects, records $(echo "$json" | grep -o '"dropped":[^]]*]')"

# Fields redaction cannot read are dropped, and inspect says how much. (The corpus capsule's
# signer is no key of ours: redact and what it writes need --allow-untrusted.)
"$capsule" redact "$src/tests/fuzz/corpus/ok-unknown-fields.capsule" --drop host --allow-untrusted \
  --key "$work/other.key" -o "$work/unknown.capsule" > /dev/null || bad unknown "redact failed"
"$capsule" inspect "$work/unknown.capsule" --pubkey "$keys/test-only-other.pub" --allow-untrusted |
  grep -q "^  unknown fields dropped by redaction: [0-9.]* [KMG]*i*B$" ||
  bad unknown "$("$capsule" inspect "$work/unknown.capsule" --pubkey "$keys/test-only-other.pub" --allow-untrusted)"

# Idempotent: redacting the redacted capsule again keeps the content.
"$capsule" redact "$work/r.capsule" --drop text,tokens,paths,host --key "$work/other.key" \
  -o "$work/rr.capsule" --pubkey "$keys/test-only-other.pub" > /dev/null || bad twice "exit $?"

refuse() {  # refuse NAME RC PATTERN ARGS...
  local name=$1 want=$2 pattern=$3
  shift 3
  "$capsule" redact "$@" > /dev/null 2> "$work/$name.err"
  local rc=$?
  if [ $rc -ne "$want" ] || ! grep -q -- "$pattern" "$work/$name.err"; then
    bad "$name" "exit $rc, stderr: $(cat "$work/$name.err")"
  else
    echo "ok: refused $name (exit $rc): $(head -c 120 "$work/$name.err")"
  fi
}
install -m 0644 "$keys/test-only-other.key" "$work/loose.key"
refuse loose-key 2 "readable" "$full" --drop host --key "$work/loose.key" -o "$work/x.capsule" \
  --pubkey "$keys/test-only.pub"
refuse unknown-item 2 "unknown item" "$full" --drop host,weights --key "$work/other.key" \
  -o "$work/x.capsule" --pubkey "$keys/test-only.pub"
refuse untrusted 3 "untrusted" "$full" --drop host --key "$work/other.key" -o "$work/x.capsule" \
  --pubkey "$keys/test-only-other.pub"
cp "$full" "$work/tampered.capsule"
printf '\xff' | dd of="$work/tampered.capsule" bs=1 seek=100 conv=notrunc status=none
refuse tampered 4 "corrupt" "$work/tampered.capsule" --drop host --key "$work/other.key" \
  -o "$work/x.capsule" --pubkey "$keys/test-only.pub"
[ -e "$work/x.capsule" ] && bad refusals "an output was written despite a refusal"
exit $fail
