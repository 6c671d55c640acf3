#!/usr/bin/env bash
# Record -> extract one layer -> replay the extract alone: for every fault class at blocks.6 of an
# 8-block model, the extract gives the full replay's verdict and the same errors for that layer,
# holds only that layer's tensors, and a clean layer gives NO_DIVERGENCE. Also: a
# capsule whose tokens were redacted is refused by replay (exit 2) with a message saying why.
# Usage: extract_e2e_test.sh TRAINER_BIN CAPSULE_BIN PLUGIN_SO
set -uo pipefail
trainer=$(realpath "$1")
capsule=$(realpath "$2")
plugin=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$capsule" keygen --out "$work/k" >/dev/null
mkdir -p "$work/elsewhere"
fail=0
bad() { echo "FAIL [$1]: $2"; fail=1; }

record() {  # record NAME TRAINER_ARGS... -> prints the capsule path
  local name=$1
  shift
  (cd "$work" && "$trainer" train --quiet --capsule-dir "$work/$name" --key "$work/k.key" "$@" \
    > "$work/$name.train.log" 2>&1)
  ls "$work/$name"/*.capsule 2>/dev/null | head -n 1
}

replay_json() {  # replay_json OUT_JSON CAPSULE -> replay's exit status
  (cd "$work/elsewhere" && "$capsule" replay "$2" --plugin "$plugin" --pubkey "$work/k.pub" \
    --json > "$1" 2> "$1.err")
}

# json FILE EXPR [ARG] -> EXPR, a Python expression over the JSON `d` in FILE (and `arg`); None
# prints as null, booleans as true/false, a list one item per line.
json() {
  /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = eval(sys.argv[2], {"d": d, "arg": sys.argv[3] if len(sys.argv) > 3 else None})
for x in (v if isinstance(v, list) else [v]):
    print("null" if x is None else str(x).lower() if isinstance(x, bool) else x)' "$@"
}

# The forward entry of LAYER in a report: "max_abs_err max_rel_err verdict".
layer_entry() {
  json "$1" '[" ".join(str(l[k]) for k in ("max_abs_err", "max_rel_err", "verdict"))
              for l in d["layers"] if l["name"] == arg and l["phase"] == "FORWARD"]' "$2"
}

check() {  # check NAME CAPSULE LAYER EXPECTED_DIAGNOSIS
  local name=$1 cap=$2 layer=$3 want=$4
  local x="$work/$name.$layer.extract"
  if ! "$capsule" extract "$cap" --layer "$layer" --key "$work/k.key" -o "$x" --plugin "$plugin" \
       --pubkey "$work/k.pub" > "$work/$name.extract.log" 2>&1; then
    bad "$name" "extract failed: $(cat "$work/$name.extract.log")"
    return
  fi
  replay_json "$work/$name.full.json" "$cap"
  replay_json "$work/$name.x.json" "$x"
  local full_entry x_entry
  full_entry=$(layer_entry "$work/$name.full.json" "$layer")
  x_entry=$(layer_entry "$work/$name.x.json" "$layer")
  [ -n "$x_entry" ] && [ "$full_entry" = "$x_entry" ] ||
    bad "$name" "full replay's $layer: '$full_entry', extract's: '$x_entry' ($(cat "$work/$name.x.json.err"))"
  # Fidelity is judged (the captured output of the first anomalous layer) or says it was not:
  # never left unspecified.
  local fidelity
  fidelity=$(json "$work/$name.x.json" 'd.get("fidelity")')
  case "$fidelity" in
    REPRODUCED_EXACT | REPRODUCED_APPROX | NOT_CHECKED) ;;
    *) bad "$name" "extract fidelity '$fidelity'" ;;
  esac
  local d
  d=$(json "$work/$name.x.json" 'd["diagnosis"]')
  [ "$d" = "$want" ] || bad "$name" "extract diagnosis $d, expected $want"
  if [ "$want" = NUMERICS ]; then
    local full_layer x_layer
    full_layer=$(json "$work/$name.full.json" 'd.get("first_divergent_layer")')
    x_layer=$(json "$work/$name.x.json" 'd.get("first_divergent_layer")')
    [ "$x_layer" = "$layer" ] && [ "$full_layer" = "$layer" ] &&
      [ "$(json "$work/$name.full.json" 'd["diagnosis"]')" = NUMERICS ] &&
      [ "$(json "$work/$name.x.json" 'd["extract_layer"]')" = "$layer" ] ||
      bad "$name" "first divergent layer: full $full_layer, extract $x_layer"
  fi
  "$capsule" inspect "$x" --pubkey "$work/k.pub" > "$work/$name.inspect" 2>&1 ||
    bad "$name" "inspect of the extract failed"
  # Only the layer's own tensors (and the small batch masks) travel.
  local others
  "$capsule" inspect "$x" --pubkey "$work/k.pub" --json > "$work/$name.x.inspect.json"
  others=$(json "$work/$name.x.inspect.json" '[t["name"] for t in d["tensors"]
    if t.get("layer") != arg and t["name"] not in ("attention_mask", "loss_mask")]' "$layer")
  [ -z "$others" ] || bad "$name" "extract holds tensors of other layers: $others"
  # One block holds 11.5% (1/8.7) of this model's parameters, so 10x is out of reach for a lossless
  # extract of a block; what remains beside them is the FP64 reference input and, for the first
  # anomalous layer, the captured optimized input and output. 3.5x leaves room for those.
  local full_size x_size
  full_size=$(stat -c %s "$cap")
  x_size=$(stat -c %s "$x")
  [ $((x_size * 7)) -le $((full_size * 2)) ] ||
    bad "$name" "extract $x_size bytes, full $full_size: not 3.5x smaller"
  echo "ok: $name $layer: $d, errors '$x_entry', full $full_size bytes, extract $x_size bytes, fidelity $(json "$work/$name.x.json" 'd["fidelity"]')"
}

check_fault() {  # check_fault KIND CAPTURE_ARGS...
  local kind=$1
  shift
  local cap
  cap=$(record "$kind" --layers 8 --inject "$kind" --inject-layer blocks.6 "$@")
  [ -n "$cap" ] || { bad "$kind" "no capsule written"; return; }
  check "$kind" "$cap" blocks.6 NUMERICS
  if [ "$kind" = eps ]; then
    check "$kind-clean" "$cap" blocks.2 NO_DIVERGENCE
    # The text report of an extract has no loss to show, and says so.
    (cd "$work/elsewhere" && "$capsule" replay "$work/$kind-clean.blocks.2.extract" \
      --plugin "$plugin" --pubkey "$work/k.pub" > "$work/x.txt" 2>&1)
    grep -qx "loss: none (the extract runs blocks.2 alone); 1 intra-op threads" "$work/x.txt" ||
      bad "$kind-clean" "extract's loss line: $(grep '^loss' "$work/x.txt")"
  fi
}

check_fault nan --steps 5 --inject-step 3
check_fault softmax-overflow --steps 5 --inject-step 3
check_fault tail-block --steps 5 --inject-step 2 --capture-at-step 3
check_fault eps --steps 5 --inject-step 2 --capture-at-step 3

# A capsule without its token ids cannot be re-run; replay says so.
clean=$(record clean --layers 2 --steps 4 --capture-at-step 2)
"$capsule" redact "$clean" --drop tokens --key "$work/k.key" -o "$work/redacted.capsule" \
  --pubkey "$work/k.pub" > /dev/null 2>&1 || bad redact "redact failed"
replay_json "$work/redacted.json" "$work/redacted.capsule"
rc=$?
[ $rc -eq 2 ] && grep -q "token ids were redacted" "$work/redacted.json.err" ||
  bad redacted-replay "exit $rc: $(cat "$work/redacted.json.err")"
echo "ok: replay of a tokens-redacted capsule: exit $rc, $(cat "$work/redacted.json.err")"
exit $fail
