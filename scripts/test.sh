#!/usr/bin/env bash
# The test command: installs the Debian packages (scripts/setup-deps.sh), configures, builds and
# runs every test with ctest. Exits non-zero on any failure.
#   scripts/test.sh            # build dir: build/
#   BUILD_DIR=out scripts/test.sh
#   CAPSULE_WITH_TORCH=OFF scripts/test.sh   # the format layer alone, without LibTorch
#   CAPSULE_WERROR=ON scripts/test.sh        # warnings are errors (as CI builds)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

"$root/scripts/setup-deps.sh"

BUILD_DIR="$build" "$root/scripts/configure.sh"
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" --timeout 1500
