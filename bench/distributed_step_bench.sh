#!/usr/bin/env bash
# Armed vs unarmed data-parallel step on 2 ranks (c10d's Gloo on 127.0.0.1, one core per rank).
# Each run alternates blocks of 10 steps: armed (the Monitor with a Distributed attached: the
# collective ring, the per-step parameter fingerprint, gradient health around the reduction, the
# agreement rows riding in the step's last reduction) and unarmed (the trainer's gradient
# all-reduces straight on the group, nothing else). Within one run both see the same
# machine; step times move by up to 50% from run to run here, more than the difference measured.
# Prints each run's ratio of medians and the median of the runs' ratios. EXTRA (say
# --reduce-per-param: one gradient all-reduce per parameter, a collective-bound step) goes to the
# trainer as it is.
#   bench/distributed_step_bench.sh build/samples/capsule-tiny-gpt [RUNS] [STEPS] [BATCH] [EXTRA...]
set -euo pipefail
trainer=$1
runs=${2:-5}
steps=${3:-400}
batch=${4:-4}  # sequences of 32 tokens per rank and step
shift $(($# < 4 ? $# : 4))
extra=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lines=()
for ((i = 0; i < runs; ++i)); do
  line=$("$trainer" train --world-size 2 --steps "$steps" --batch-size "$batch" --quiet --timing \
    --capsule-dir "$work/c$i" "${extra[@]}" | grep '^rank 0: median step armed')
  echo "$line"
  lines+=("$(sed 's/.*: \([0-9.]*\)$/\1/' <<< "$line")")
done
/usr/bin/python3 - "${lines[*]}" <<'PY'
import statistics, sys
r = [float(x) for x in sys.argv[1].split()]
print(f"armed / unarmed: median of {len(r)} runs = {statistics.median(r):.3f} "
      f"(min {min(r):.3f}, max {max(r):.3f})")
PY
