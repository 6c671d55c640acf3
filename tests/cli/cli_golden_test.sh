#!/usr/bin/env bash
# Golden-output test of the `capsule` command line: runs each command, records stdout, stderr and
# the exit status into a transcript and compares it with tests/cli/golden/<name>.txt.
# Usage: cli_golden_test.sh CAPSULE_BIN SOURCE_DIR
# Set CAPSULE_UPDATE_GOLDEN=1 to rewrite the golden transcript after an intended change.
set -uo pipefail
capsule_bin=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
transcript="$work/transcript.txt"

# Paths in the transcript are relative to samples/ so it does not depend on where the tree lives.
cd "$src/samples"
run() {
  {
    echo "\$ capsule $*" | sed -e "s#$work#WORK#g"
    "$capsule_bin" "$@" > "$work/out" 2> "$work/err"
    local rc=$?
    sed -e "s#$work#WORK#g" "$work/out"
    sed -e "s#$work#WORK#g" -e 's/^/[stderr] /' "$work/err"
    echo "[exit $rc]"
    echo
  } >> "$transcript"
}

run --version
run inspect golden/valid/full.capsule --pubkey keys/test-only.pub
run inspect golden/valid/minimal.capsule --pubkey keys/test-only.pub --json
run inspect golden/valid/unsigned.capsule
run inspect golden/valid/unsigned.capsule --allow-unsigned
for f in golden/valid/*.capsule golden/invalid/*.capsule; do
  run verify "$f" --pubkey keys/test-only.pub
done
run verify golden/valid/full.capsule --pubkey keys/test-only.pub --deep
run verify golden/valid/full.capsule --pubkey keys/test-only-other.pub
run verify golden/does-not-exist.capsule --pubkey keys/test-only.pub
run verify golden/valid/full.capsule
run inspect golden/valid/full.capsule
# Trust on first use: the key a 1.1 capsule carries, saved and then trusted; a 1.0 capsule has none.
run verify golden/valid/minimal.capsule --save-signer "$work/signer.pub"
cmp -s "$work/signer.pub" keys/test-only.pub && echo "saved signer key = keys/test-only.pub" >> "$transcript"
run verify golden/valid/minimal.capsule --pubkey "$work/signer.pub"
run verify golden/valid/minimal.capsule --save-signer "$work/signer.pub"
run verify golden/frozen-v1.0/valid/minimal.capsule
run verify golden/frozen-v1.0/valid/minimal.capsule --save-signer "$work/v10.pub"
run inspect golden/frozen-v1.0/valid/minimal.capsule
run frobnicate
run report --help

# report and diff (the report's full Markdown/JSON/HTML is golden-tested in tests/report/).
run report golden/valid/unsigned.capsule --allow-unsigned
run report golden/valid/unsigned.capsule
run report golden/valid/full.capsule --pubkey keys/test-only.pub --format html -o "$work/r.html"
echo "html: $(grep -c '<rect class="bar' "$work/r.html") bars, $(grep -c '<circle class="point' "$work/r.html") points" >> "$transcript"
run report golden/valid/full.capsule --pubkey keys/test-only.pub --redact text,passwords
run diff golden/valid/full.capsule golden/valid/full.capsule --pubkey keys/test-only.pub
run diff golden/valid/full.capsule golden/valid/minimal.capsule --pubkey keys/test-only.pub
run diff golden/valid/minimal.capsule golden/valid/unsigned.capsule --allow-unsigned --json
run diff golden/valid/full.capsule golden/does-not-exist.capsule --pubkey keys/test-only.pub

# Trust: every command states each capsule's trust on a "trust:" line; those that act on content
# (diff here; replay, triage, gate, ... in trust_cli_test.sh) use only trusted capsules unless told
# otherwise, and a capsule made from an untrusted one is no more trusted than its source.
run diff golden/valid/full.capsule golden/valid/minimal.capsule
run diff golden/valid/full.capsule golden/valid/full.capsule --allow-untrusted
run inspect golden/valid/derived-from-untrusted.capsule --pubkey keys/test-only.pub
run inspect golden/valid/derived-from-untrusted.capsule --pubkey keys/test-only.pub --allow-untrusted
run report golden/valid/derived-from-untrusted.capsule --pubkey keys/test-only.pub --allow-untrusted

# keygen: the key id is random, so normalise it; the modes are part of the contract.
run keygen --out "$work/k"
sed -i -E 's/key id [0-9a-f]{64}/key id <64 hex>/' "$transcript"
echo "modes: $(stat -c '%a' "$work/k.key") $(stat -c '%a' "$work/k.pub")" >> "$transcript"
run keygen --out "$work/k"
run verify golden/valid/full.capsule --pubkey "$work/k.pub"

golden="$src/tests/cli/golden/transcript.txt"
if [ "${CAPSULE_UPDATE_GOLDEN:-0}" = "1" ]; then
  cp "$transcript" "$golden"
  echo "updated $golden"
  exit 0
fi
if ! diff -u "$golden" "$transcript"; then
  echo "FAIL: CLI output differs from $golden (CAPSULE_UPDATE_GOLDEN=1 to accept an intended change)"
  exit 1
fi
echo "ok: CLI output matches the golden transcript"
