#!/usr/bin/env bash
# Configures the build directory the way scripts/demo.sh and scripts/test.sh both build it, so that
# whichever runs second reuses every object the first compiled (CI runs the demo first).
#   scripts/configure.sh                   # build dir: build/ (or $BUILD_DIR)
#   CAPSULE_WITH_TORCH=OFF scripts/configure.sh
#   CAPSULE_WERROR=ON scripts/configure.sh  # warnings are errors (as CI builds)
# Prints only what goes wrong (CMake's own output is kept in <build>/configure.log).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
with_torch=${CAPSULE_WITH_TORCH:-ON}
werror=${CAPSULE_WERROR:-OFF}

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
mkdir -p "$build"
if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCAPSULE_WITH_TORCH="$with_torch" -DCAPSULE_WERROR="$werror" -DCAPSULE_BUILD_TESTS=ON \
  -DCAPSULE_BUILD_BENCH=ON > "$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "configure: cmake failed (log above, kept in $build/configure.log)" >&2
  exit 1
fi
