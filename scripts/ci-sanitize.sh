#!/usr/bin/env bash
# CI mode: the format layer built with clang-14, AddressSanitizer and UndefinedBehaviorSanitizer
# (-DCAPSULE_WITH_TORCH=OFF -DCAPSULE_SANITIZE=ON -DCAPSULE_BUILD_FUZZERS=ON), its ctest, then a
# short libFuzzer run of capsule_decode_fuzzer seeded from tests/fuzz/corpus. New inputs go to a
# scratch corpus in the build dir, so the repository is never written; a crash fails the run and
# leaves its input in BUILD_DIR/fuzz-artifacts/. Idempotent: reruns reuse the build dir.
#   scripts/ci-sanitize.sh                         # build dir: build-ci-asan/, 60 s of fuzzing
#   FUZZ_SECONDS=600 scripts/ci-sanitize.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-ci-asan}
jobs=${JOBS:-$(nproc)}
werror=${CAPSULE_WERROR:-ON}
fuzz_seconds=${FUZZ_SECONDS:-60}

"$root/scripts/setup-deps.sh"
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCAPSULE_WITH_TORCH=OFF -DCAPSULE_SANITIZE=ON -DCAPSULE_BUILD_FUZZERS=ON \
  -DCAPSULE_WERROR="$werror" -DCAPSULE_BUILD_TESTS=ON -DCAPSULE_BUILD_BENCH=OFF
cmake --build "$build" -j "$jobs"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 900)

scratch="$build/fuzz-corpus"
artifacts="$build/fuzz-artifacts"
mkdir -p "$scratch" "$artifacts"
echo "ci-sanitize: fuzzing capsule_decode_fuzzer for ${fuzz_seconds} s"
log="$build/fuzz.log"
if ! "$build/tests/fuzz/capsule_decode_fuzzer" "$scratch" "$root/tests/fuzz/corpus" \
  -max_total_time="$fuzz_seconds" -artifact_prefix="$artifacts/" -print_final_stats=1 \
  -close_fd_mask=1 >"$log" 2>&1; then
  cat "$log" >&2
  echo "ci-sanitize: the fuzzer failed; its input is in $artifacts" >&2
  exit 1
fi
grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::new_units_added)' "$log" || tail -n 5 "$log"
