#!/usr/bin/env bash
# Runs the fuzzing campaign: every libFuzzer target of tests/fuzz for SECONDS (default 120) each,
# one after the other, seeded from tests/fuzz/corpus, then prints per target the executions, the
# corpus it grew and the findings (crash-, leak-, timeout-, oom- files, kept under the work
# directory with the command that reproduces each). Exit 1 when any target found something.
#
#   scripts/fuzz.sh          # 2 minutes per target
#   scripts/fuzz.sh 600      # longer, for a release
#
# Builds the targets in build-fuzz/ first (clang-14, sanitizers; FUZZ_BUILD overrides the
# directory, FUZZ_WORK the work directory, FUZZ_TARGETS the list, FUZZ_JOBS how many targets run at
# once: 2 on a 2-core machine halves the wall time).
set -uo pipefail
seconds=${1:-120}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
work=${FUZZ_WORK:-$(mktemp -d /tmp/capsule-fuzz.XXXXXX)}
targets=${FUZZ_TARGETS:-decode envelope read redact render checkpoint}
jobs=${FUZZ_JOBS:-1}

if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCAPSULE_WITH_TORCH=OFF \
    -DCAPSULE_BUILD_FUZZERS=ON -DCAPSULE_SANITIZE=ON -DCAPSULE_BUILD_BENCH=OFF >/dev/null || exit 2
fi
for t in $targets; do bins+=("capsule_${t}_fuzzer"); done
cmake --build "$build" --target "${bins[@]}" >/dev/null || { echo "fuzz: build failed"; exit 2; }

run_target() {
  local t=$1 dir="$work/$1"
  mkdir -p "$dir/corpus" "$dir/findings"
  # A fresh corpus directory per target, seeded read-only from the committed one (the checkpoint
  # reader from its own folder of it).
  local seeds="$root/tests/fuzz/corpus"
  [ "$t" = checkpoint ] && seeds="$root/tests/fuzz/corpus/checkpoint"
  "$build/tests/fuzz/capsule_${t}_fuzzer" "$dir/corpus" "$seeds" \
    -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$dir/findings/" \
    -rss_limit_mb=4096 -timeout=25 > "$dir/log.txt" 2>&1
}
running=0
for t in $targets; do
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

printf '%-10s %12s %10s %8s %s\n' target executions exec/s corpus findings
total=0
for t in $targets; do
  dir="$work/$t"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log.txt" | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$dir/log.txt" | grep -o '[0-9]*$')
  units=$(find "$dir/corpus" -type f | wc -l)
  found=$(find "$dir/findings" -type f | wc -l)
  total=$((total + found))
  printf '%-10s %12s %10s %8s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$units" "$found"
  for f in "$dir"/findings/*; do
    [ -e "$f" ] && echo "  finding: $f (reproduce: $build/tests/fuzz/capsule_${t}_fuzzer $f)"
  done
done
echo "logs in $work"
[ "$total" -eq 0 ]
