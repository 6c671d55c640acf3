#!/usr/bin/env bash
# Record -> replay -> diagnose, end to end, on capsules written by the sample trainer: every fault
# class is diagnosed and located, clean captures show no divergence, and every refusal is exit 2
# with a message naming the cause. Replay runs in a fresh process, in another working directory,
# from the capsule and the plugin alone.
# Usage: replay_e2e_test.sh TRAINER_BIN CAPSULE_BIN PLUGIN_SO
set -uo pipefail
trainer=$(realpath "$1")
capsule=$(realpath "$2")
plugin=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$capsule" keygen --out "$work/k" >/dev/null
"$capsule" keygen --out "$work/other" >/dev/null
mkdir -p "$work/elsewhere"
fail=0
bad() { echo "FAIL [$1]: $2"; fail=1; }

# record NAME TRAINER_ARGS... -> prints the capsule path
record() {
  local name=$1
  shift
  (cd "$work" && "$trainer" train --quiet --capsule-dir "$work/$name" --key "$work/k.key" "$@" \
    > "$work/$name.train.log" 2>&1)
  ls "$work/$name"/*.capsule 2>/dev/null | head -n 1
}

# replay_json NAME CAPSULE EXTRA_ARGS... -> writes $work/NAME.json, returns replay's exit status
replay_json() {
  local name=$1 cap=$2
  shift 2
  (cd "$work/elsewhere" && "$capsule" replay "$cap" --plugin "$plugin" --pubkey "$work/k.pub" \
    --json "$@" > "$work/$name.json" 2> "$work/$name.err")
}

# field NAME EXPR -> EXPR, a Python expression over the replay report `d` in $work/NAME.json
# (e.g. 'd["bisect"]["probes"]'); None prints as null, booleans as true/false.
field() {
  /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = eval(sys.argv[2], {"d": d})
print("null" if v is None else str(v).lower() if isinstance(v, bool) else v)' "$work/$1.json" "$2"
}

check_fault() {  # check_fault KIND LAYERS LAYER CAPTURE_ARGS...
  local kind=$1 layers=$2 layer=$3
  shift 3
  local name="$kind-L$layers"
  local cap
  cap=$(record "$name" --layers "$layers" --inject "$kind" --inject-layer "$layer" "$@")
  [ -n "$cap" ] || { bad "$name" "no capsule written"; return; }
  local n=$((layers + 4)) bound
  bound=$(/usr/bin/python3 -c "import math; print(math.ceil(math.log2($n)) + 1)")
  for strategy in bisect linear; do
    replay_json "$name.$strategy" "$cap" --bisect="$strategy"
    local rc=$?
    [ $rc -eq 1 ] || bad "$name.$strategy" "exit $rc, expected 1 ($(cat "$work/$name.$strategy.err"))"
    [ "$(field "$name.$strategy" 'd["diagnosis"]')" = NUMERICS ] ||
      bad "$name.$strategy" "diagnosis $(field "$name.$strategy" 'd["diagnosis"]')"
    [ "$(field "$name.$strategy" 'd.get("first_divergent_layer")')" = "$layer" ] ||
      bad "$name.$strategy" "first divergent layer $(field "$name.$strategy" 'd.get("first_divergent_layer")')"
    [ "$(field "$name.$strategy" 'd["bisect"]["first_bad_layer"]')" = "$layer" ] ||
      bad "$name.$strategy" "bisect first bad layer $(field "$name.$strategy" 'd["bisect"]["first_bad_layer"]')"
  done
  # The next step names the extract of that layer and its replay.
  [ "$(field "$name.bisect" '" --layer '"$layer"' " in d["next_commands"][0] and d["next_commands"][0].startswith("capsule extract ")')" = true ] &&
    [ "$(field "$name.bisect" 'd["next_commands"][1].startswith("capsule replay '"$layer"'.capsule ")')" = true ] ||
    bad "$name" "next commands: $(field "$name.bisect" 'd.get("next_commands")')"
  local probes
  probes=$(field "$name.bisect" 'd["bisect"]["probes"]')
  [ -n "$probes" ] && [ "$probes" -le "$bound" ] || bad "$name" "bisect made $probes probes > $bound"
  [ "$(field "$name.linear" 'd["bisect"]["monotonic"]')" = true ] || bad "$name" "linear scan not monotonic"
  echo "ok: $kind at $layer of a $layers-block model: NUMERICS, bisect $probes probes (bound $bound)"
}

for cfg in "4 blocks.1" "8 blocks.6"; do
  set -- $cfg
  check_fault nan "$1" "$2" --steps 5 --inject-step 3
  check_fault softmax-overflow "$1" "$2" --steps 5 --inject-step 3
  check_fault tail-block "$1" "$2" --steps 5 --inject-step 2 --capture-at-step 3
  check_fault eps "$1" "$2" --steps 5 --inject-step 2 --capture-at-step 3
done

# --bisect=features: each fault is tied to one of tiny_gpt's three kernel switches, and the
# search names it within ceil(log2 3) + 1 = 3 replays.
for cfg in "nan fused_gelu" "softmax-overflow fused_softmax" "tail-block fused_softmax" \
  "eps fused_layer_norm"; do
  set -- $cfg
  src=$(ls "$work/$1-L4"/*.capsule | head -n 1)
  replay_json "$1-features" "$src" --bisect=features
  [ "$(field "$1-features" 'd["features"]["outcome"]')" = FOUND ] &&
    [ "$(field "$1-features" '",".join(d["features"]["culprits"])')" = "$2" ] &&
    [ "$(field "$1-features" 'd["features"]["replays"] <= d["features"]["replay_bound"] == 3')" = true ] ||
    bad "features-$1" "$(field "$1-features" 'd.get("features")') $(cat "$work/$1-features.err")"
  echo "ok: --bisect=features names $2 for $1 in $(field "$1-features" 'd["features"]["replays"]') replays"
done
# The switches the search named, off by hand: the layer agrees again.
replay_json eps-nofused "$(ls "$work"/eps-L4/*.capsule | head -n 1)" --features fused_softmax,fused_gelu
[ $? -eq 0 ] && [ "$(field eps-nofused 'd["diagnosis"]')" = NO_DIVERGENCE ] ||
  bad eps-nofused "with fused_layer_norm off: $(field eps-nofused 'd["diagnosis"]') $(cat "$work/eps-nofused.err")"

# A fault in a hand-written backward: the forward bisect finds nothing, the backward one names it.
cap=$(record gelu-grad --layers 4 --inject gelu-grad --inject-layer blocks.2 --steps 3 --capture-at-step 2)
replay_json gelu-grad "$cap" --phase both --bisect
[ $? -eq 1 ] && [ "$(field gelu-grad 'd["first_divergent_layer"], d["first_divergent_phase"]')" = "('blocks.2', 'BACKWARD')" ] &&
  [ "$(field gelu-grad 'd["bisect"].get("first_bad_layer", ""), d["backward_bisect"].get("first_bad_layer", "")')" = "('', 'blocks.2')" ] ||
  bad gelu-grad "$(field gelu-grad '(d.get("first_divergent_layer"), d["bisect"], d.get("backward_bisect"))') $(cat "$work/gelu-grad.err")"
echo "ok: gelu-grad: the backward bisect names blocks.2, the forward bisect nothing"

# stress: on the tail-block layer the lengths past one tile with a tail diverge and T <= 16 does
# not; the clean layer before it diverges on nothing, exit 0.
src=$(ls "$work"/tail-block-L4/*.capsule | head -n 1)
stress() {  # stress NAME LAYER EXTRA_ARGS...
  local name=$1 layer=$2
  shift 2
  (cd "$work/elsewhere" && "$capsule" stress "$src" --layer "$layer" --plugin "$plugin" \
    --pubkey "$work/k.pub" "$@" > "$work/$name.json" 2> "$work/$name.err")
}
stress stress-tail blocks.1 --json
rc=$?
[ $rc -eq 1 ] &&
  [ "$(field stress-tail 'sorted({c["name"] for c in d["results"] if c["family"] == "shape" and c["name"].startswith("T=") and c["diverged"]}, key=lambda n: int(n[2:]))')" = "['T=17', 'T=31', 'T=32']" ] ||
  bad stress-tail "exit $rc: $(head -c 600 "$work/stress-tail.json") $(cat "$work/stress-tail.err")"
stress stress-clean blocks.0 --json
rc=$?
[ $rc -eq 0 ] && [ "$(field stress-clean 'd["diverged"]')" = 0 ] &&
  [ "$(field stress-clean 'd["cases"] >= 15')" = true ] ||
  bad stress-clean "exit $rc: $(field stress-clean '[c["name"] for c in d["results"] if c["diverged"]]') $(cat "$work/stress-clean.err")"
stress stress-text blocks.1
grep -q "^T=16 .* ok$" "$work/stress-text.json" && grep -q "^T=17 .* DIVERGED$" "$work/stress-text.json" ||
  bad stress-text "$(cat "$work/stress-text.json" "$work/stress-text.err")"
echo "ok: stress: T=17, 31, 32 diverge at the tail-block layer; nothing at the clean layer"

# gate: a regressions folder of fixed faults passes; with one fault still in the build, it fails
# and names that capsule ($CAPSULE_TINY_GPT_FIXED simulates the build after a fix).
mkdir -p "$work/regressions"
cp "$(ls "$work"/nan-L4/*.capsule | head -n 1)" "$work/regressions/nan.capsule"
cp "$(ls "$work"/eps-L4/*.capsule | head -n 1)" "$work/regressions/eps.capsule"
gate() {  # gate NAME FIXED_KINDS EXTRA_ARGS...
  local name=$1 fixed=$2
  shift 2
  (cd "$work/elsewhere" && CAPSULE_TINY_GPT_FIXED=$fixed "$capsule" gate "$work/regressions" \
    --plugin "$plugin" --pubkey "$work/k.pub" "$@" > "$work/$name.json" 2> "$work/$name.err")
}
gate gate-fixed nan,eps --json
rc=$?
[ $rc -eq 0 ] && [ "$(field gate-fixed 'd["passed"]')" = 2 ] ||
  bad gate-fixed "exit $rc: $(cat "$work/gate-fixed.json" "$work/gate-fixed.err")"
gate gate-eps nan --json
rc=$?
[ $rc -eq 1 ] && [ "$(field gate-eps '[e["capsule"] for e in d["entries"] if not e["passed"]]')" = "['eps.capsule']" ] ||
  bad gate-eps "exit $rc: $(cat "$work/gate-eps.json" "$work/gate-eps.err")"
echo "ok: gate passes the fixed faults' capsules and names the one still failing"

# minimize: each layer fault shrinks to a smaller batch that replays to the same first bad layer,
# in a smaller signed capsule; tail-block says how long a sequence the failure needs.
for cfg in "nan blocks.1" "softmax-overflow blocks.1" "tail-block blocks.1" "eps blocks.1"; do
  set -- $cfg
  src=$(ls "$work/$1-L4"/*.capsule | head -n 1)
  (cd "$work/elsewhere" && "$capsule" minimize "$src" --key "$work/k.key" -o "$work/$1-small.capsule" \
    --plugin "$plugin" --pubkey "$work/k.pub" > "$work/$1-min.out" 2> "$work/$1-min.err")
  rc=$?
  replay_json "$1-small" "$work/$1-small.capsule"
  [ $rc -eq 0 ] && [ "$(field "$1-small" 'd.get("first_divergent_layer")')" = "$2" ] &&
    [ "$(stat -c %s "$work/$1-small.capsule")" -lt "$(stat -c %s "$src")" ] &&
    grep -q "^minimized: 8 -> [1-7] sequences" "$work/$1-min.out" ||
    bad "minimize-$1" "exit $rc: $(cat "$work/$1-min.out" "$work/$1-min.err"), replays to $(field "$1-small" 'd.get("first_divergent_layer")')"
  echo "ok: minimize $1: $(head -n 1 "$work/$1-min.out")"
done
grep -q "^needs: the failure needs T >= 17 (T = 16 does not fail alike)" "$work/tail-block-min.out" &&
  grep -q "^needs: the thread count does not matter" "$work/tail-block-min.out" ||
  bad minimize-tail-block "no length the failure needs: $(cat "$work/tail-block-min.out")"

# Triage before the numerics (replay/internal/triage.h): one corrupt sample of the batch is named
# by the data stage; a batch corrupt throughout has no sample that stands out, and the reference
# path fails too.
# data_finding NAME -> "check sample_index" of the data stage's first failed finding
data_finding() {
  field "$1" '" ".join(str(x) for x in next(([f["check"], f.get("sample_index")] for s in d["stages"] if s["stage"] == "STAGE_DATA" for f in s["findings"] if f["failed"]), ["none"]))'
}
objective_checks() {
  field "$1" '",".join(f["check"] for s in d["stages"] if s["stage"] == "STAGE_OBJECTIVE" for f in s["findings"] if f["failed"])'
}
for cfg in "55 1" "70 2"; do
  set -- $cfg
  cap=$(record "bad-data-$1" --steps $(($1 + 2)) --batch-size 2 --seed "$2" --inject bad-data --inject-step "$1")
  replay_json "bad-data-$1" "$cap" --bisect
  rc=$?
  [ $rc -eq 1 ] && [ "$(field "bad-data-$1" 'd["diagnosis"]')" = DATA ] &&
    [ "$(data_finding "bad-data-$1")" = "data.bad_sample 0" ] ||
    bad "bad-data-$1" "exit $rc, diagnosis $(field "bad-data-$1" 'd["diagnosis"]'), finding $(data_finding "bad-data-$1")"
  echo "ok: bad-data at step $1 -> DATA, $(data_finding "bad-data-$1")"
done
cap=$(record bad-batch --steps 57 --inject bad-batch --inject-step 55)
replay_json bad-batch "$cap" --bisect
rc=$?
[ $rc -eq 1 ] && [ "$(field bad-batch 'd["diagnosis"]')" = DATA_OR_MODEL ] ||
  bad bad-batch "exit $rc, diagnosis $(field bad-batch 'd["diagnosis"]')"
echo "ok: bad-batch -> $(field bad-batch 'd["diagnosis"]')"
# Objective faults do not spike: captured on request, at two steps and seeds each.
for cfg in "loss-sum 12 1 objective.reduction_sum" "loss-sum 40 2 objective.reduction_sum" \
           "labels-unshifted 12 1 objective.labels_equal_inputs" \
           "labels-unshifted 40 2 objective.labels_equal_inputs"; do
  set -- $cfg
  name="$1-$2"
  cap=$(record "$name" --steps $(($2 + 1)) --seed "$3" --inject "$1" --inject-step 5 --capture-at-step "$2")
  replay_json "$name" "$cap"
  rc=$?
  [ $rc -eq 1 ] && [ "$(field "$name" 'd["diagnosis"]')" = OBJECTIVE ] &&
    [ "$(objective_checks "$name" | tr ',' '\n' | grep -c -x "$4")" = 1 ] ||
    bad "$name" "exit $rc, diagnosis $(field "$name" 'd["diagnosis"]'), checks $(objective_checks "$name")"
  echo "ok: $1 at step $2 -> OBJECTIVE ($(objective_checks "$name"))"
done
# A detach() that cuts one block's MLP branch: the forward is unchanged, so only the gradients
# stage sees it, and names the block.
for cfg in "blocks.1 12 1" "blocks.3 40 2"; do
  set -- $cfg
  name="disconnected-$1"
  cap=$(record "$name" --steps $(($2 + 1)) --seed "$3" --inject disconnected --inject-layer "$1" \
    --inject-step 5 --capture-at-step "$2")
  replay_json "$name" "$cap"
  rc=$?
  finding=$(field "$name" '" ".join(f["detail"].split(":")[0] for s in d["stages"] if s["stage"] == "STAGE_GRADIENTS" for f in s["findings"] if f["failed"])')
  [ $rc -eq 1 ] && [ "$(field "$name" 'd["diagnosis"]')" = GRADIENTS ] && [ "$finding" = "layer $1" ] ||
    bad "$name" "exit $rc, diagnosis $(field "$name" 'd["diagnosis"]'), finding '$finding'"
  echo "ok: disconnected at $1 -> GRADIENTS ($finding)"
done

# The trainer's own faults (samples/tiny_gpt/faults.h): each named by its stage and check, at two
# steps (or layers) and two seeds. stage_case NAME DIAGNOSIS CHECK TRAINER_ARGS...
failed_checks() {
  field "$1" '",".join(f["check"] for s in d["stages"] for f in s["findings"] if f["failed"])'
}
stage_case() {
  local name=$1 want=$2 check=$3
  shift 3
  local cap
  cap=$(record "$name" "$@")
  [ -n "$cap" ] || { bad "$name" "no capsule written"; return; }
  replay_json "$name" "$cap"
  local rc=$?
  [ $rc -eq 1 ] && [ "$(field "$name" 'd["diagnosis"]')" = "$want" ] &&
    [ "$(failed_checks "$name" | tr ',' '\n' | grep -c -x "$check")" = 1 ] ||
    bad "$name" "exit $rc, diagnosis $(field "$name" 'd["diagnosis"]'), failed checks $(failed_checks "$name")"
  echo "ok: $name -> $want ($(failed_checks "$name"))"
}
for cfg in "12 1" "40 2"; do
  set -- $cfg
  stage_case "pad-in-loss-$1" OBJECTIVE objective.padding_in_loss --steps $(($1 + 1)) --seed "$2" \
    --inject pad-in-loss --inject-step 5 --capture-at-step "$1"
  stage_case "accum-scale-$1" OBJECTIVE objective.accumulation_mean_of_means --steps $(($1 + 1)) \
    --seed "$2" --batch-size 2 --accum 4 --inject accum-scale --inject-step 5 --capture-at-step "$1"
  stage_case "decay-on-norm-$1" OPTIMIZER optimizer.decay_on_excluded --steps $(($1 + 1)) \
    --seed "$2" --weight-decay 0.1 --inject decay-on-norm --capture-at-step "$1"
  stage_case "clip-before-unscale-$1" OPTIMIZER optimizer.clip_before_unscale \
    --steps $(($1 + 1)) --seed "$2" --loss-scale 1024 --clip 1 --inject clip-before-unscale \
    --inject-step 5 --capture-at-step "$1"
done
stage_case frozen-updated-blocks.1 OPTIMIZER optimizer.frozen_updated --steps 13 --seed 1 \
  --weight-decay 0.1 --inject frozen-updated --inject-layer blocks.1 --inject-step 5 --capture-at-step 12
stage_case frozen-updated-blocks.3 OPTIMIZER optimizer.frozen_updated --steps 41 --seed 2 \
  --inject frozen-updated --inject-layer blocks.3 --inject-step 20 --capture-at-step 40
stage_case step-on-overflow-blocks.1 OPTIMIZER optimizer.step_on_overflow --steps 7 --seed 1 \
  --inject step-on-overflow --inject-layer blocks.1 --inject-step 5
stage_case step-on-overflow-blocks.2 OPTIMIZER optimizer.step_on_overflow --steps 11 --seed 2 \
  --inject step-on-overflow --inject-layer blocks.2 --inject-step 9
# A clean trainer with every feature the faults need (padding, accumulation, weight decay, a loss
# scale and clipping): every stage runs and passes.
clean_all=$(record clean-all --steps 13 --seed 3 --pad --accum 3 --weight-decay 0.1 \
  --loss-scale 1024 --clip 1 --capture-at-step 12)
replay_json clean-all "$clean_all"
rc=$?
[ $rc -eq 0 ] && [ "$(field clean-all 'd["diagnosis"]')" = NO_DIVERGENCE ] &&
  [ "$(field clean-all '[s["stage"] for s in d["stages"] if s["ran"] and not s["explains"]]')" = "['STAGE_DATA', 'STAGE_OBJECTIVE', 'STAGE_GRADIENTS', 'STAGE_OPTIMIZER', 'STAGE_NUMERICS']" ] ||
  bad clean-all "exit $rc, diagnosis $(field clean-all 'd["diagnosis"]'), failed checks $(failed_checks clean-all)"
echo "ok: clean capture with padding, 3 micro-batches, weight decay, a loss scale and clipping: every stage passes"

cap=$(record transient --steps 5 --inject transient --inject-layer blocks.2 --inject-step 3)
replay_json transient "$cap"
rc=$?
[ $rc -eq 1 ] && [ "$(field transient 'd["fidelity"]')" = NOT_REPRODUCED ] &&
  [ "$(field transient 'd["diagnosis"]')" = TRANSIENT ] ||
  bad transient "exit $rc, fidelity $(field transient 'd["fidelity"]'), diagnosis $(field transient 'd["diagnosis"]')"
echo "ok: transient -> $(field transient 'd["fidelity"]') -> $(field transient 'd["diagnosis"]')"
# --repeat: the transient capsule does not reproduce in any of 5 fresh replays; a deterministic
# one replays bitwise alike 5 times.
replay_json transient-repeat "$cap" --repeat 5
[ "$(field transient-repeat 'd["repeat"]["runs"]')" = 5 ] &&
  [ "$(field transient-repeat 'd["repeat"].get("reproduced_runs", 0)')" = 0 ] &&
  [ "$(field transient-repeat 'd["diagnosis"]')" = TRANSIENT ] ||
  bad transient-repeat "repeat $(field transient-repeat 'd.get("repeat")')"
echo "ok: transient --repeat 5 -> reproduced in 0 of 5"


clean=$(record clean --steps 5 --capture-at-step 3)
replay_json clean "$clean" --phase both --bisect
rc=$?
[ $rc -eq 0 ] && [ "$(field clean 'd["diagnosis"]')" = NO_DIVERGENCE ] &&
  [ "$(field clean 'd["fidelity"]')" = REPRODUCED_EXACT ] &&
  [ "$(field clean 'd.get("first_divergent_layer")')" = null ] &&
  [ "$(field clean 'any(l["phase"] == "BACKWARD" for l in d["layers"])')" = true ] &&
  [ "$(field clean '[s["stage"] for s in d["stages"] if s["ran"] and not s["explains"]]')" = "['STAGE_DATA', 'STAGE_OBJECTIVE', 'STAGE_GRADIENTS', 'STAGE_OPTIMIZER', 'STAGE_NUMERICS']" ] ||
  bad clean "exit $rc, diagnosis $(field clean 'd["diagnosis"]'), fidelity $(field clean 'd["fidelity"]')"
echo "ok: clean manual capture -> NO_DIVERGENCE forward and backward, every stage passes, exit 0"
replay_json clean-repeat "$clean" --repeat 5
[ "$(field clean-repeat 'd["repeat"]["bitwise_identical"]')" = true ] &&
  [ "$(field clean-repeat 'd["repeat"]["reproduced_runs"]')" = 5 ] ||
  bad clean-repeat "repeat $(field clean-repeat 'd.get("repeat")')"
echo "ok: clean --repeat 5 -> bitwise identical, reproduced in 5 of 5"

# Refusals: the exit status every command gives for the cause (3 untrusted, 4 invalid, 2 cannot
# re-run; cli/capsule.md, EXIT STATUS) and a message naming it.
refuse() {  # refuse NAME RC PATTERN ARGS...
  local name=$1 want=$2 pattern=$3
  shift 3
  (cd "$work/elsewhere" && "$capsule" replay "$@" > /dev/null 2> "$work/$name.err")
  local rc=$?
  if [ $rc -ne "$want" ] || ! grep -q -- "$pattern" "$work/$name.err"; then
    bad "$name" "exit $rc, stderr: $(cat "$work/$name.err")"
  else
    echo "ok: refused $name: $(head -c 150 "$work/$name.err")"
  fi
}
refuse wrong-key 3 "refused: valid signature, unknown signer .* (not among --pubkey)" "$clean" --plugin "$plugin" --pubkey "$work/other.pub"
(cd "$work" && "$trainer" train --quiet --steps 4 --capture-at-step 2 --capsule-dir "$work/unsigned" \
  > /dev/null 2>&1)
refuse unsigned 3 "unsigned" "$(ls "$work"/unsigned/*.capsule)" --plugin "$plugin" --pubkey "$work/k.pub"
cp "$clean" "$work/tampered.capsule"
printf '\xff' | dd of="$work/tampered.capsule" bs=1 seek=200 conv=notrunc status=none
refuse tampered 4 "corrupt" "$work/tampered.capsule" --plugin "$plugin" --pubkey "$work/k.pub"
other_model=$(cd "$work" && "$trainer" train --quiet --steps 4 --seed 7 --capture-at-step 2 \
  --capsule-dir "$work/seed7" --key "$work/k.key" > /dev/null 2>&1; ls "$work"/seed7/*.capsule)
refuse other-weights 2 "another model's weights; --force to replay anyway" "$clean" --plugin "$plugin" --pubkey "$work/k.pub" \
  --weights "$other_model"
refuse other-weights-named 2 "tensor '[a-z_.0-9]*' differs: sha256" "$clean" --plugin "$plugin" \
  --pubkey "$work/k.pub" --weights "$other_model"
refuse plugin-missing 2 "does not exist" "$clean" --plugin "$work/nope.so" --pubkey "$work/k.pub"
refuse not-registered 2 "not registered; registered: none; load the model's plugin with --plugin" \
  "$clean" --pubkey "$work/k.pub"
exit $fail
