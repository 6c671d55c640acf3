#!/usr/bin/env bash
# The sample trainer with each fault class writes exactly one capsule for the faulty step, and
# `capsule verify` / `capsule inspect --json` show what the capture promised.
# Usage: trainer_capture_test.sh TRAINER_BIN CAPSULE_BIN
set -euo pipefail
trainer=$1
capsule=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$capsule" keygen --out "$work/k" >/dev/null
fail=0

# expect NAME JSON_FILE CHECK...: each CHECK is a Python expression over the parsed
# `capsule inspect --json` output `d` that must be true.
expect() {
  local name=$1 json=$2
  shift 2
  local failed
  failed=$(/usr/bin/python3 -c '
import json, re, sys
d = json.load(open(sys.argv[1]))
for check in sys.argv[2:]:
    try:
        ok = eval(check, {"d": d, "re": re})
    except (KeyError, IndexError, TypeError) as e:
        ok = False
    if not ok:
        print(check)' "$json" "$@") || failed="cannot parse $json"
  if [ -n "$failed" ]; then
    while IFS= read -r check; do echo "FAIL [$name]: inspect --json: not $check"; done <<< "$failed"
    fail=1
  fi
}

run_case() {  # run_case NAME STEPS TRIGGER_FILE_SUFFIX TRAINER_ARGS...
  local name=$1 steps=$2 suffix=$3
  shift 3
  local dir="$work/$name"
  "$trainer" train --steps "$steps" --quiet --capsule-dir "$dir" --key "$work/k.key" "$@" \
    > "$work/$name.log" 2>&1
  local files=("$dir"/*.capsule)
  if [ ${#files[@]} -ne 1 ] || [ ! -f "${files[0]}" ]; then
    echo "FAIL [$name]: expected exactly one capsule, got: $(ls "$dir" 2>/dev/null | tr '\n' ' ')"
    fail=1
    return
  fi
  case "${files[0]}" in
    *"$suffix") ;;
    *) echo "FAIL [$name]: capsule ${files[0]} is not *$suffix"; fail=1 ;;
  esac
  "$capsule" verify "${files[0]}" --pubkey "$work/k.pub" >/dev/null ||
    { echo "FAIL [$name]: capsule verify refused it"; fail=1; }
  "$capsule" inspect "${files[0]}" --pubkey "$work/k.pub" --json > "$work/$name.json"
  # Present in every capsule: batch tokens, RNG blobs, cursor, identity, stats, environment.
  expect "$name" "$work/$name.json" \
    'all(s["token_ids"] for s in d["data"]["sequences"])' \
    '{"torch.cpu", "sampler"} <= {g["name"] for g in d["rng"]["generators"]}' \
    'd["data"]["cursor"]["sample_indices"]' \
    're.fullmatch("[0-9a-f]{64}", d["identity"]["model_sha256"])' \
    'any(f["role"] == "tokenizer" for f in d["identity"]["files"])' \
    'd["environment"]["torch_version"]' 'd["environment"]["intra_op_threads"] > 0' \
    'any(l["name"] == "lm_head" and l["phase"] == "FORWARD" for l in d["numerics"]["layers"])' \
    'd["model"]["registry_name"] == "tiny_gpt"'
  echo "ok: $name -> $(basename "${files[0]}")"
}

run_case nan 8 -step5-rank0-non-finite-loss.capsule \
  --inject nan --inject-layer blocks.2 --inject-step 5
expect nan "$work/nan.json" 'd["trigger"]["kind"] == "NON_FINITE_LOSS"' \
  'd["numerics"]["first_anomalous_layer"] == "blocks.2"' \
  'd["trigger"]["capture_rerun"] == "RERUN_REPRODUCED"'

run_case softmax-overflow 8 -step5-rank0-non-finite-loss.capsule \
  --inject softmax-overflow --inject-layer blocks.1 --inject-step 5
expect softmax-overflow "$work/softmax-overflow.json" 'd["trigger"]["kind"] == "NON_FINITE_LOSS"' \
  'd["numerics"]["first_anomalous_layer"] == "blocks.1"' \
  'd["trigger"]["capture_rerun"] == "RERUN_REPRODUCED"'

run_case bad-batch 57 -step55-rank0-loss-spike.capsule --inject bad-batch --inject-step 55
expect bad-batch "$work/bad-batch.json" 'd["trigger"]["kind"] == "LOSS_SPIKE"' \
  'd["trigger"]["capture_rerun"] == "RERUN_REPRODUCED"'

run_case transient 8 -step5-rank0-non-finite-loss.capsule \
  --inject transient --inject-layer blocks.2 --inject-step 5
expect transient "$work/transient.json" 'd["trigger"]["kind"] == "NON_FINITE_LOSS"' \
  'd["trigger"]["capture_rerun"] == "RERUN_NOT_REPRODUCED"'

# A finite fault is invisible to the triggers: --capture-at-step takes the capsule by hand.
run_case eps 8 -step6-rank0-manual.capsule --inject eps --inject-layer blocks.1 --inject-step 0 \
  --capture-at-step 6
expect eps "$work/eps.json" 'd["trigger"]["kind"] == "MANUAL"'

# A clean run writes nothing.
"$trainer" train --steps 50 --quiet --capsule-dir "$work/clean" --key "$work/k.key" > "$work/clean.log" 2>&1
if [ -n "$(ls -A "$work/clean" 2>/dev/null)" ]; then
  echo "FAIL [clean]: a clean 50-step run wrote $(ls "$work/clean")"; fail=1
else
  echo "ok: clean 50-step run wrote no capsule"
fi
exit $fail
