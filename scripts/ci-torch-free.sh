#!/usr/bin/env bash
# CI mode: the format layer alone, without LibTorch (-DCAPSULE_WITH_TORCH=OFF), in its own build
# dir; builds everything that configuration has and runs its ctest. Idempotent: reruns reuse the
# build dir and rebuild only what changed.
#   scripts/ci-torch-free.sh                       # build dir: build-ci-torchfree/
#   BUILD_DIR=out JOBS=4 scripts/ci-torch-free.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-ci-torchfree}
jobs=${JOBS:-$(nproc)}
werror=${CAPSULE_WERROR:-ON}

"$root/scripts/setup-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCAPSULE_WITH_TORCH=OFF -DCAPSULE_WERROR="$werror" -DCAPSULE_BUILD_TESTS=ON \
  -DCAPSULE_BUILD_BENCH=ON
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" --timeout 600
