#!/usr/bin/env bash
# Trust, for every command (cli/capsule.md, "Trust"): each states the trust of each capsule it
# reads on a "trust:" line (and in its JSON); those that act on a capsule's content (diff, triage,
# redact; replay, gate, stress, extract, minimize with LibTorch) use only capsules a --pubkey key
# vouches for unless --allow-untrusted / --allow-unsigned says to go on, and refuse the rest with
# exit status 3; what redact, extract and minimize write records who signed their source, so
# re-signing with the team's key never makes a stranger's capsule trusted (format/derivation.h).
# Also: invalid Ed25519 keys are refused (a small-order key verifies forgeries), and a SHA-256
# OpenSSL cannot compute is an error, never a zero digest.
# Usage: trust_cli_test.sh CAPSULE_BIN SOURCE_DIR [TRAINER_BIN PLUGIN_SO [PYTHON_PACKAGE_DIR]]
set -uo pipefail
capsule=$(realpath "$1")
src=$(realpath "$2")
trainer=${3:+$(realpath "$3")}
plugin=${4:+$(realpath "$4")}
pydir=${5:+$(realpath "$5")}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
bad() { echo "FAIL [$1]: $2"; fail=1; }
keys="$src/samples/keys"
golden="$src/samples/golden"
cd "$work" || exit 1

# The team's key (the one --pubkey trusts) and a stranger's; a stranger's capsule is any the team's
# key did not sign: here the golden samples, signed with the TEST-ONLY key.
"$capsule" keygen --out team > /dev/null && "$capsule" keygen --out stranger > /dev/null ||
  { echo "keygen failed"; exit 1; }
cp "$golden/valid/full.capsule" "$work/stranger.capsule"
cp "$golden/valid/unsigned.capsule" "$work/unsigned.capsule"

# expect NAME RC PATTERN ARGS...: `capsule ARGS` exits RC and its stdout+stderr match PATTERN.
expect() {
  local name=$1 want=$2 pattern=$3
  shift 3
  "$capsule" "$@" > "$work/$name.out" 2> "$work/$name.err"
  local rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q -- "$pattern" "$work/$name.out" "$work/$name.err"; then
    bad "$name" "capsule $* exited $rc (want $want, /$pattern/): $(cat "$work/$name.out" "$work/$name.err" | head -c 1500)"
  fi
}
# json NAME EXPR: a Python expression over the JSON `capsule` printed for NAME (d).
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$work/$1.out" "$2"; }

# 1. Commands that act on content refuse a capsule no --pubkey key vouches for, exit 3, saying
# what it is and what would get round it; told to go on, they state its trust and go on.
unknown="refused: valid signature, unknown signer 0e9291e8"
expect diff-untrusted 3 "$unknown.* (not among --pubkey); diff uses only capsules a --pubkey key vouches for" \
  diff stranger.capsule stranger.capsule --pubkey team.pub
expect diff-no-key 3 "$unknown.* (no --pubkey given).*--allow-untrusted to use it anyway" \
  diff stranger.capsule stranger.capsule
expect diff-unsigned 3 "refused: unsigned; .*--allow-unsigned to use it anyway" \
  diff unsigned.capsule unsigned.capsule --allow-untrusted
expect diff-allowed 0 "^trust: stranger.capsule: valid signature, unknown signer 0e9291e8.* (not among --pubkey)$" \
  diff stranger.capsule stranger.capsule --pubkey team.pub --allow-untrusted
[ "$(grep -c '^trust: ' "$work/diff-allowed.err")" = 2 ] || bad diff-allowed "one trust line per capsule: $(cat "$work/diff-allowed.err")"
expect diff-json 1 '"a_trust"' diff stranger.capsule unsigned.capsule --allow-unsigned --json
[ "$(json diff-json '(d["a_trust"]["signature"], d["a_trust"]["trusted"], d["b_trust"]["signature"], d["b_trust"]["signer_key_id"])')" = \
  "('TRUST_VALID_UNKNOWN_SIGNER', False, 'TRUST_UNSIGNED', '')" ] || bad diff-json "$(cat "$work/diff-json.out")"
expect diff-trusted 0 "^trust: stranger.capsule: signed by trusted key 0e9291e8" \
  diff stranger.capsule stranger.capsule --pubkey "$keys/test-only.pub"
echo "ok: diff refuses untrusted capsules (exit 3) unless told, and states each one's trust"

# triage: a stranger's rank capsule is never merged into the run's evidence unless told; the
# folder is then exit 3, with the capsule listed as not used.
mkdir -p run && cp stranger.capsule run/run-step7-rank1-hang.capsule
expect triage-no-key 3 "not trusted and was not used" triage run
expect triage-untrusted 3 "not trusted and was not used" triage run --pubkey team.pub
grep -q "unreadable" "$work/triage-untrusted.out" && grep -q "refused: valid signature, unknown signer" "$work/triage-untrusted.out" ||
  bad triage-untrusted "the refused capsule is not listed: $(cat "$work/triage-untrusted.out")"
grep -q "^trust: run/run-step7-rank1-hang.capsule: valid signature, unknown signer" "$work/triage-untrusted.err" ||
  bad triage-untrusted "no trust line: $(cat "$work/triage-untrusted.err")"
"$capsule" triage run --pubkey team.pub --allow-untrusted --json > "$work/triage-json.out" 2> "$work/triage-json.err"
[ "$(json triage-json '(len(d["ranks"]), len(d.get("unreadable", [])), [t["signature"] for t in d["trust"]])')" = \
  "(1, 0, ['TRUST_VALID_UNKNOWN_SIGNER'])" ] || bad triage-json "$(cat "$work/triage-json.out" "$work/triage-json.err")"
echo "ok: triage uses an untrusted rank capsule only when told, exit 3 otherwise"

# inspect and report show a capsule: whoever signed it without --pubkey, with its trust stated;
# with --pubkey only a trusted one unless --allow-untrusted.
expect inspect-any 0 "^trust: stranger.capsule: valid signature, unknown signer" inspect stranger.capsule
expect inspect-asked 3 "with --pubkey, inspect reads only capsules those keys vouch for" \
  inspect stranger.capsule --pubkey team.pub
expect inspect-json 0 '"trust"' inspect stranger.capsule --pubkey team.pub --allow-untrusted --json
[ "$(json inspect-json 'd["envelope"]["trust"]["signature"]')" = TRUST_VALID_UNKNOWN_SIGNER ] ||
  bad inspect-json "$(head -c 600 "$work/inspect-json.out")"
expect report-json 0 '"trust"' report stranger.capsule --format json
[ "$(json report-json '(d["trust"]["trusted"], d["warning"].startswith("this capsule" + chr(39) + "s signature is valid"))')" = \
  "(False, True)" ] || bad report-json "$(head -c 600 "$work/report-json.out")"
echo "ok: inspect and report state the trust of what they show"

# 2. No laundering: redact refuses a stranger's capsule; told to go on, what it writes under the
# team's key records the stranger as its source, and the team's key does not make it trusted.
install -m 0600 team.key team0600.key
expect redact-untrusted 3 "redact uses only capsules a --pubkey key vouches for" \
  redact stranger.capsule --drop host --key team0600.key -o laundered.capsule --pubkey team.pub
[ -e laundered.capsule ] && bad redact-untrusted "wrote the output anyway"
expect redact-allowed 0 "^wrote laundered.capsule" \
  redact stranger.capsule --drop host --key team0600.key -o laundered.capsule --pubkey team.pub --allow-untrusted
made="made by redact from capsule $(sha256sum stranger.capsule | cut -c1-16), valid signature by key 0e9291e853913cb9, NOT trusted by its maker"
expect laundered-verify 3 "UNTRUSTED, signed by key .*; $made" verify laundered.capsule --pubkey team.pub
expect laundered-diff 3 "refused: signed by trusted key .*; $made" diff laundered.capsule laundered.capsule --pubkey team.pub
expect laundered-inspect 0 "derived .*: $made" inspect laundered.capsule --pubkey team.pub --allow-untrusted
expect laundered-report 0 "WARNING: this capsule was $made" report laundered.capsule --pubkey team.pub --allow-untrusted
expect laundered-json 0 '"derivations"' inspect laundered.capsule --pubkey team.pub --allow-untrusted --json
[ "$(json laundered-json '[(x["tool"], x["source_trust"], x["source_signer_key_id"][:16]) for x in d["derivations"]]')" = \
  "[('redact', 'TRUST_VALID_UNKNOWN_SIGNER', '0e9291e853913cb9')]" ] || bad laundered-json "$(head -c 900 "$work/laundered-json.out")"
# Redacted again by someone who trusts the team's key: the stranger is still the weakest link.
expect redact-twice 0 "wrote" redact laundered.capsule --drop text --key team0600.key -o twice.capsule \
  --pubkey team.pub --allow-untrusted
expect twice-verify 3 "$made" verify twice.capsule --pubkey team.pub
# From a capsule the maker trusted: trusted as its signer is.
expect redact-trusted 0 "wrote" redact stranger.capsule --drop host --key team0600.key -o clean.capsule \
  --pubkey "$keys/test-only.pub"
expect clean-verify 0 "OK, signed by key" verify clean.capsule --pubkey team.pub
expect clean-diff 0 "equivalent" diff clean.capsule clean.capsule --pubkey team.pub
echo "ok: redact records its source's signer; a stranger's capsule re-signed by the team stays untrusted"

# A 1.0 capsule carries no signer key: signed with any 64 bytes (zeros here) it reads as "not
# checked" without --pubkey. It is refused, and re-signed (when told) it says so.
cp "$golden/frozen-v1.0/valid/minimal.capsule" zero-sig.capsule
t=$(( $(od -An -t u4 --endian=little -j 12 -N 4 zero-sig.capsule) + $(od -An -t u8 --endian=little -j 24 -N 8 zero-sig.capsule) ))
dd if=/dev/zero of=zero-sig.capsule bs=1 seek=$((t + 72)) count=64 conv=notrunc status=none
expect zero-sig-redact 3 "refused: signed by key 0e9291e8.*, signature not checked (format 1.0" \
  redact zero-sig.capsule --drop host --key team0600.key -o zero-redacted.capsule
expect zero-sig-allowed 0 "wrote" redact zero-sig.capsule --drop host --key team0600.key \
  -o zero-redacted.capsule --allow-untrusted
expect zero-sig-verify 3 "UNTRUSTED, signed by key .*(format 1.0), signature NOT checked by its maker" \
  verify zero-redacted.capsule --pubkey team.pub
expect zero-sig-given-key 3 "bad signature" verify zero-sig.capsule --pubkey "$keys/test-only.pub"
echo "ok: a 1.0 capsule with a zero signature is not laundered by redact"

# 3. Invalid Ed25519 keys: the identity point (small order) as --pubkey, and as the key a capsule
# carries. Under it R = identity, s = 0 verifies any message: a forgery needing no private key.
python3 -c 'import base64,sys; sys.stdout.write("-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(bytes.fromhex("302a300506032b6570032100") + b"\x01" + bytes(31)).decode() + "\n-----END PUBLIC KEY-----\n")' > small.pub
python3 "$src/tests/cli/forge_small_order_key.py" "$golden/valid/minimal.capsule" forged.capsule
expect small-pubkey 2 "small.pub: not a valid Ed25519 public key: a point of small order" \
  verify forged.capsule --pubkey small.pub
expect small-pubkey-inspect 2 "not a valid Ed25519 public key" inspect stranger.capsule --pubkey small.pub
expect forged-verify 3 "signer key 01d0fabd251fcbbe is not a valid Ed25519 public key: a point of small order" \
  verify forged.capsule
expect forged-inspect 3 "a point of small order" inspect forged.capsule
echo "ok: small-order keys are refused, as --pubkey and as a capsule's signer key"

# 4. SHA-256 fails closed: with an OpenSSL that cannot hash, reading is an error (exit 2), never a
# verdict; an unsigned capsule whose digest is all zeros (what a failed hash used to compute) is
# not read as intact.
cp unsigned.capsule zero-digest.capsule
dd if=/dev/zero of=zero-digest.capsule bs=1 seek=$(( 48 + 67 + 40 )) count=32 conv=notrunc status=none
nosha="$src/tests/format/openssl_without_sha256.cnf"
OPENSSL_CONF=$nosha "$capsule" inspect zero-digest.capsule --allow-unsigned > "$work/nosha.out" 2> "$work/nosha.err"
rc=$?
[ $rc -eq 2 ] && grep -q "cannot compute SHA-256" "$work/nosha.err" ||
  bad nosha-zero-digest "exit $rc: $(cat "$work/nosha.out" "$work/nosha.err")"
OPENSSL_CONF=$nosha "$capsule" inspect unsigned.capsule --allow-unsigned > /dev/null 2> "$work/nosha2.err"
rc=$?
[ $rc -eq 2 ] && grep -q "cannot compute SHA-256" "$work/nosha2.err" ||
  bad nosha-good "a good capsule read as $rc: $(cat "$work/nosha2.err")"
expect zero-digest 4 "digest mismatch" inspect zero-digest.capsule --allow-unsigned
echo "ok: a SHA-256 OpenSSL cannot compute is an error (exit 2), not a zero digest"

# 5. python3 -m capsule runs the same command line, so the same refusals.
if [ -n "$pydir" ] && [ -f "$pydir/capsule/__init__.py" ]; then
  PYTHONPATH=$pydir /usr/bin/python3 -m capsule diff stranger.capsule stranger.capsule --pubkey team.pub \
    > /dev/null 2> "$work/py.err"
  rc=$?
  [ $rc -eq 3 ] && grep -q "refused: valid signature, unknown signer" "$work/py.err" ||
    bad python "python3 -m capsule diff exited $rc: $(cat "$work/py.err")"
  PYTHONPATH=$pydir /usr/bin/python3 -m capsule diff stranger.capsule stranger.capsule --allow-untrusted \
    > /dev/null 2> "$work/py2.err" && grep -q "^trust: stranger.capsule" "$work/py2.err" ||
    bad python "python3 -m capsule diff --allow-untrusted: $(cat "$work/py2.err")"
  echo "ok: python3 -m capsule refuses and states trust as capsule does"
fi

# 6. With LibTorch: replay, gate, stress, extract and minimize on a tiny_gpt capsule a stranger
# signed: each refuses (exit 3) before any work, and goes on only when told.
if [ -n "$trainer" ] && [ -n "$plugin" ]; then
  install -m 0600 stranger.key stranger0600.key
  (cd "$work" && "$trainer" train --quiet --steps 4 --layers 2 --capture-at-step 2 --capsule-dir tiny \
    --key stranger0600.key > tiny.log 2>&1) || bad train "$(cat tiny.log)"
  tiny=$(ls "$work"/tiny/*.capsule | head -n 1)
  for cmd in "replay $tiny" "stress $tiny --layer blocks.0" \
             "extract $tiny --layer blocks.0 --key $work/team0600.key -o $work/x.capsule" \
             "minimize $tiny --key $work/team0600.key -o $work/m.capsule"; do
    name=torch-${cmd%% *}
    # shellcheck disable=SC2086
    expect "$name" 3 "refused: valid signature, unknown signer .*${cmd%% *} uses only capsules a --pubkey key vouches for" \
      $cmd --plugin "$plugin" --pubkey team.pub
  done
  [ -e x.capsule ] || [ -e m.capsule ] && bad torch-outputs "an output was written for an untrusted capsule"
  mkdir -p gate && cp "$tiny" gate/
  expect gate-untrusted 3 "not trusted" gate gate --plugin "$plugin" --pubkey team.pub --json
  [ "$(json gate-untrusted '(d["untrusted"], d["entries"][0]["error"])')" = "(1, 'not trusted (exit status 3)')" ] ||
    bad gate-untrusted "$(cat "$work/gate-untrusted.out")"
  # JSON is one line, as every command prints it (format/json.h).
  [ "$(wc -l < "$work/gate-untrusted.out")" = 1 ] ||
    bad gate-json-line "$(wc -l < "$work/gate-untrusted.out") lines"
  expect replay-allowed 0 '"capsule_trust"' replay "$tiny" --plugin "$plugin" --pubkey team.pub --allow-untrusted --json
  [ "$(json replay-allowed '(d["capsule_trust"]["signature"], d["capsule_trust"]["trusted"])')" = \
    "('TRUST_VALID_UNKNOWN_SIGNER', False)" ] || bad replay-allowed "$(head -c 600 "$work/replay-allowed.out")"
  expect gate-allowed 0 "^trust: .*valid signature, unknown signer" gate gate --plugin "$plugin" --pubkey team.pub --allow-untrusted
  expect extract-allowed 0 "wrote" extract "$tiny" --layer blocks.0 --key team0600.key -o x.capsule \
    --plugin "$plugin" --pubkey team.pub --allow-untrusted
  expect extract-verify 3 "made by extract from capsule .*NOT trusted by its maker" verify x.capsule --pubkey team.pub
  expect extract-replay 3 "refused: signed by trusted key .*; made by extract" \
    replay x.capsule --plugin "$plugin" --pubkey team.pub
  echo "ok: replay, stress, extract, minimize and gate refuse a stranger's capsule; an extract records it"
fi

exit $fail
