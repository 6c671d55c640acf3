#!/usr/bin/env bash
# Data-parallel runs of the sample trainer over c10d's Gloo on 127.0.0.1, 2 and 4 ranks: for each
# distributed fault every live rank writes a signed capsule, `capsule triage` names the right rank
# and cause (exit 1), the hang cases end within 2x the watchdog period plus the group's timeout,
# each rank's capsule replays alone, and clean runs write nothing (or, captured by hand on every
# rank, triage to nothing: exit 0).
# Usage: distributed_e2e_test.sh TRAINER_BIN CAPSULE_BIN
set -euo pipefail
trainer=$1
capsule=$2
work=$(mktemp -d)
pids_to_end=()
cleanup() {
  for p in "${pids_to_end[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
"$capsule" keygen --out "$work/k" >/dev/null
fail=0
watchdog=1
timeout=3
bound=$((2 * watchdog + timeout))

# check NAME JSON EXPR...: each EXPR is a Python expression over the triage JSON `t` that must hold.
check() {
  local name=$1 json=$2
  shift 2
  local failed
  failed=$(/usr/bin/python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
def finding(check):
    return [f for f in t["findings"] if f["check"] == check]
for expr in sys.argv[2:]:
    try:
        ok = eval(expr, {"t": t, "finding": finding})
    except (KeyError, IndexError, TypeError) as e:
        ok = False
    if not ok:
        print(expr)' "$json" "$@") || failed="cannot parse $json"
  if [ -n "$failed" ]; then
    while IFS= read -r e; do echo "FAIL [$name]: triage --json: not $e"; done <<< "$failed"
    fail=1
  fi
}

# The wall-clock second (with fraction) now.
now() { date +%s.%N; }

# run_fault NAME WORLD FAULT RANK STEP: runs the trainer (in its own process group, ended by
# this script if a rank never exits), then checks the capsules and triage. Sets $dir and
# $ended_at (when every rank had exited or was ended).
run_fault() {
  local name=$1 world=$2 fault=$3 rank=$4 step=$5
  dir="$work/$name"
  setsid "$trainer" train --world-size "$world" --steps 8 --layers 2 --quiet \
    --fault "$fault" --fault-rank "$rank" --inject-step "$step" --timeout "$timeout" \
    --watchdog "$watchdog" --capsule-dir "$dir" --key "$work/k.key" > "$work/$name.log" 2>&1 &
  local pid=$!
  pids_to_end+=("$pid")
  # A rank that is stuck for good (stall) never exits: once every rank has written its capsule
  # and the others have failed out of the group, the test ends it, as an operator would.
  local deadline=$(($(date +%s) + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$fault" = stall ]; then
      local ranks_written
      ranks_written=$( (ls "$dir" 2>/dev/null || true) | sed -n 's/.*-rank\([0-9]*\)-.*/\1/p' |
        sort -u | wc -l)
      local errors
      errors=$( (ls "$dir" 2>/dev/null || true) | grep -c collective-error || true)
      if [ "$ranks_written" -eq "$world" ] && [ "$errors" -ge $((world - 1)) ]; then
        kill -KILL -- "-$pid" 2>/dev/null || true
        break
      fi
    fi
    if [ "$(date +%s)" -gt "$deadline" ]; then
      echo "FAIL [$name]: the trainer ran past 60 s; ending it"
      kill -KILL -- "-$pid" 2>/dev/null || true
      fail=1
      break
    fi
    sleep 0.1
  done
  wait "$pid" 2>/dev/null || true
  ended_at=$(now)
  local r
  for ((r = 0; r < world; ++r)); do
    if ! ls "$dir"/*-rank"$r"-*.capsule >/dev/null 2>&1; then
      echo "FAIL [$name]: rank $r wrote no capsule"
      sed 's/^/    /' "$work/$name.log" | tail -20
      fail=1
    fi
  done
  local f
  for f in "$dir"/*.capsule; do
    "$capsule" verify "$f" --pubkey "$work/k.pub" >/dev/null ||
      { echo "FAIL [$name]: capsule verify refused $f"; fail=1; }
  done
  local rc=0
  "$capsule" triage "$dir" --pubkey "$work/k.pub" --json > "$work/$name.json" || rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "FAIL [$name]: capsule triage exited $rc, not 1 (a finding)"
    "$capsule" triage "$dir" --pubkey "$work/k.pub" | sed 's/^/    /'
    fail=1
  fi
}

# The hang must end within 2x the watchdog period plus the group's timeout, counted from when
# the waiting ranks entered the collective that never completed (their capsules say when) to
# when every trainer process had exited or been ended.
check_hang_time() {
  local name=$1 finding=$2
  local start
  start=$(/usr/bin/python3 - "$work/$name.json" "$capsule" "$work/k.pub" "$finding" <<'PY'
import json, subprocess, sys
t = json.load(open(sys.argv[1]))
seq = int([f for f in t["findings"] if f["check"] == sys.argv[4]][0]["sequence"])
starts = []
for r in t["ranks"]:
    for path in r["capsules"]:
        d = json.loads(subprocess.run([sys.argv[2], "inspect", path, "--pubkey", sys.argv[3],
                                       "--json"], capture_output=True, check=True).stdout)
        for c in d.get("distributed", {}).get("collectives", []):
            if int(c.get("sequence", 0)) == seq:
                starts.append(int(c["enqueued_unix_micros"]) / 1e6)
print(min(starts))
PY
  ) || { echo "FAIL [$name]: no start of the hang in the capsules"; fail=1; return; }
  local took
  took=$(/usr/bin/python3 -c "print(f'{$ended_at - $start:.2f}')")
  if /usr/bin/python3 -c "import sys; sys.exit(0 if $took <= $bound else 1)"; then
    echo "ok [$name]: the hang ended ${took} s after it began (bound ${bound} s)"
  else
    echo "FAIL [$name]: the hang ended ${took} s after it began, over ${bound} s"
    fail=1
  fi
}

for world in 2 4; do
  r=$((world - 1))  # the faulty rank: the last one
  run_fault "nan$world" "$world" rank-nan "$r" 3
  check "nan$world" "$work/nan$world.json" \
    "finding('gradients.first_bad_rank')[0]['ranks'] == [$r]" \
    "int(finding('gradients.first_bad_rank')[0]['step']) == 3" \
    "'data-driven' in finding('gradients.first_bad_rank')[0]['detail']" \
    "'-rank$r-non-finite-loss.capsule' in t['next_command']"

  run_fault "skip$world" "$world" skip-collective "$r" 3
  check "skip$world" "$work/skip$world.json" \
    "finding('hang.skipped_collective')[0]['ranks'] == [$r]" \
    "int(finding('hang.skipped_collective')[0]['step']) == 3" \
    "'allreduce grads' in finding('hang.skipped_collective')[0]['detail']"

  run_fault "count$world" "$world" count-mismatch "$r" 3
  check "count$world" "$work/count$world.json" \
    "finding('hang.mismatch')[0]['ranks'] == [$r]" \
    "'numel' in finding('hang.mismatch')[0]['detail']"

  run_fault "noavg$world" "$world" no-average 0 3
  check "noavg$world" "$work/noavg$world.json" \
    "int(finding('scaling.sum_not_mean')[0]['step']) == 3" \
    "finding('scaling.sum_not_mean')[0]['value'] > 1"

  run_fault "desync$world" "$world" desync "$r" 3
  check "desync$world" "$work/desync$world.json" \
    "int(finding('desync.params')[0]['step']) == 0" \
    "$r in finding('desync.params')[0]['ranks']" \
    "len(finding('desync.params')[0]['ranks']) == 1"

  run_fault "uneven$world" "$world" uneven-data "$r" 3
  check "uneven$world" "$work/uneven$world.json" \
    "finding('hang.uneven_data')[0]['ranks'] == [$r]" \
    "'barrier end' in finding('hang.uneven_data')[0]['detail']"
  check_hang_time "uneven$world" hang.uneven_data

  run_fault "stall$world" "$world" stall "$r" 3
  check "stall$world" "$work/stall$world.json" \
    "finding('hang.stuck_rank')[0]['ranks'] == [$r]" \
    "'HANG' in [x['trigger'] for x in t['ranks'] if x['rank'] == $r]"
  check_hang_time "stall$world" hang.stuck_rank
done

# Every rank's capsule replays alone (no peers): the rank that went non-finite reproduces.
for f in "$work"/nan2/*-rank1-*.capsule "$work"/uneven2/*-rank1-hang.capsule; do
  rc=0
  "$trainer" replay "$f" --pubkey "$work/k.pub" > "$work/replay.log" 2>&1 || rc=$?
  # REPRODUCED or REPRODUCED_APPROX; "NOT_REPRODUCED" must not pass.
  if ! grep -Eq "^fidelity: REPRODUCED" "$work/replay.log"; then
    echo "FAIL [replay]: $f did not replay alone (exit $rc)"
    sed 's/^/    /' "$work/replay.log" | tail -10
    fail=1
  fi
done

# Clean runs of 100 steps write no capsule; a manual capture on every rank triages to nothing.
for world in 2 4; do
  dir="$work/clean$world"
  "$trainer" train --world-size "$world" --steps 100 --layers 1 --batch-size 2 --quiet \
    --capsule-dir "$dir" --key "$work/k.key" > "$work/clean$world.log" 2>&1 ||
    { echo "FAIL [clean$world]: the trainer failed"; tail "$work/clean$world.log"; fail=1; }
  if ls "$dir"/*.capsule >/dev/null 2>&1; then
    echo "FAIL [clean$world]: a clean run wrote $(ls "$dir")"
    fail=1
  fi
  dir="$work/manual$world"
  "$trainer" train --world-size "$world" --steps 12 --layers 1 --batch-size 2 --quiet \
    --capture-at-step 10 --capsule-dir "$dir" --key "$work/k.key" > "$work/manual.log" 2>&1 ||
    { echo "FAIL [manual$world]: the trainer failed"; fail=1; }
  rc=0
  "$capsule" triage "$dir" --pubkey "$work/k.pub" > "$work/manual.txt" || rc=$?
  if [ "$rc" -ne 0 ] || [ "$(ls "$dir"/*.capsule | wc -l)" -ne "$world" ]; then
    echo "FAIL [manual$world]: triage of a clean manual capture exited $rc"
    sed 's/^/    /' "$work/manual.txt"
    fail=1
  fi
done

if [ "$fail" -ne 0 ]; then exit 1; fi
echo "distributed e2e: ok"
