#!/usr/bin/env bash
# CI mode: the format layer built with clang-14, AddressSanitizer and UndefinedBehaviorSanitizer
# (-DCAPSULE_WITH_TORCH=OFF -DCAPSULE_SANITIZE=ON -DCAPSULE_BUILD_FUZZERS=ON), its ctest, then a
# short libFuzzer run of every fuzz target (scripts/fuzz.sh) seeded from tests/fuzz/corpus. New
# inputs go to a scratch directory, so the repository is never written; a crash fails the run and
# the summary names its input. Idempotent: reruns reuse the build dir.
#   scripts/ci-sanitize.sh                         # build dir: build-ci-asan/, 20 s per target
#   FUZZ_SECONDS=600 scripts/ci-sanitize.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-ci-asan}
jobs=${JOBS:-$(nproc)}
werror=${CAPSULE_WERROR:-ON}
fuzz_seconds=${FUZZ_SECONDS:-20}

"$root/scripts/setup-deps.sh"
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCAPSULE_WITH_TORCH=OFF -DCAPSULE_SANITIZE=ON -DCAPSULE_BUILD_FUZZERS=ON \
  -DCAPSULE_WERROR="$werror" -DCAPSULE_BUILD_TESTS=ON -DCAPSULE_BUILD_BENCH=OFF
cmake --build "$build" -j "$jobs"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 900)

echo "ci-sanitize: fuzzing every target for ${fuzz_seconds} s"
FUZZ_BUILD="$build" FUZZ_WORK="$build/fuzz-work" FUZZ_JOBS="$jobs" "$root/scripts/fuzz.sh" "$fuzz_seconds"
