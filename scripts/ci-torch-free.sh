#!/usr/bin/env bash
# CI mode: the format layer alone, without LibTorch (-DCAPSULE_WITH_TORCH=OFF), as shared
# libraries (-DBUILD_SHARED_LIBS=ON; the main build is static), in its own build dir; builds
# everything that configuration has, runs its ctest, installs it into a fresh prefix and runs the
# installed `capsule` from there. Idempotent: reruns reuse the build dir and rebuild only what
# changed.
#   scripts/ci-torch-free.sh                       # build dir: build-ci-torchfree/
#   BUILD_DIR=out JOBS=4 scripts/ci-torch-free.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-ci-torchfree}
jobs=${JOBS:-$(nproc)}
werror=${CAPSULE_WERROR:-ON}

"$root/scripts/setup-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCAPSULE_WITH_TORCH=OFF -DBUILD_SHARED_LIBS=ON -DCAPSULE_WERROR="$werror" \
  -DCAPSULE_BUILD_TESTS=ON -DCAPSULE_BUILD_BENCH=ON
cmake --build "$build" -j "$jobs"
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 600)

# The installed shared build runs from its prefix: libcapsule_*.so found through its RPATH.
prefix=$(mktemp -d /tmp/capsule-shared.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
ls "$prefix"/lib*/libcapsule_format.so > /dev/null
"$prefix/bin/capsule" verify "$root/samples/golden/valid/full.capsule" \
  --pubkey "$root/samples/keys/test-only.pub"
echo "ci-torch-free: shared libraries built, tested, installed and run from $prefix"
