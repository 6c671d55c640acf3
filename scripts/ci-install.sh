#!/usr/bin/env bash
# CI mode: install capsule from a build directory into a fresh prefix, then configure, build and
# run tests/install/consumer against it, the way a project outside the tree would use the package
# (find_package(capsule) with only CMAKE_PREFIX_PATH set). Checks that the public headers are
# installed and nothing else (no internal/ header), that the `capsule` tool runs from the prefix,
# and that the consumer reads a golden capsule and (with LibTorch) writes one. Then the same
# consumer against the build tree itself (find_package(capsule) with capsule_DIR=<build>).
#   scripts/ci-install.sh                  # uses build/ (configured by scripts/test.sh)
#   BUILD_DIR=out scripts/ci-install.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
work=$(mktemp -d /tmp/capsule-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "ci-install: $build is not configured; run scripts/test.sh first" >&2
  exit 2
fi
cmake --build "$build" -j "$jobs"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"

fail=0
headers=$(cd "$prefix/include" && find capsule -name '*.h' | sort)
if echo "$headers" | grep -q '/internal/'; then
  echo "ci-install: internal headers were installed:" >&2
  echo "$headers" | grep '/internal/' >&2
  fail=1
fi
for h in capsule/base/status.h capsule/format/capsule_reader.h capsule/report/report.h \
  capsule/ranks/run_analysis.h \
  capsule/proto/capsule.pb.h; do
  [ -f "$prefix/include/$h" ] || { echo "ci-install: $h is not installed" >&2; fail=1; }
done
"$prefix/bin/capsule" --version
[ -f "$prefix/share/doc/capsule/capsule.md" ] ||
  { echo "ci-install: the manual is not installed" >&2; fail=1; }
grep -q '^\.TH capsule 1 ' "$prefix/share/man/man1/capsule.1" ||
  { echo "ci-install: the man page capsule(1) is not installed" >&2; fail=1; }
# The format commands run without LibTorch; replay and extract are handed to capsule-torch.
[ -x "$prefix/libexec/capsule/capsule-torch" ] ||
  { echo "ci-install: libexec/capsule/capsule-torch is not installed" >&2; fail=1; }
if ldd "$prefix/bin/capsule" | grep -q libtorch; then
  echo "ci-install: the installed capsule links LibTorch" >&2; fail=1
fi

# Without CLI11 and pkg-config: a capture-only trainer must not need them.
cmake -S "$root/tests/install/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=TRUE -DPKG_CONFIG_EXECUTABLE=/nonexistent/pkg-config \
  > "$work/consumer.log" ||
  { cat "$work/consumer.log" >&2; exit 1; }
cmake --build "$work/consumer" -j "$jobs"
"$work/consumer/read_capsule" "$root/samples/golden/valid/full.capsule" \
  "$root/samples/keys/test-only.pub" | grep -q '^## capsule report: ' ||
  { echo "ci-install: read_capsule did not print a report" >&2; fail=1; }
if [ -x "$work/consumer/arm_monitor" ]; then
  out=$("$work/consumer/arm_monitor" "$work/capsules")
  "$prefix/bin/capsule" inspect "$out" --allow-unsigned | grep -q 'NON_FINITE_LOSS' ||
    { echo "ci-install: the consumer's capsule does not inspect" >&2; fail=1; }
fi
# The build tree as a package: no install step.
cmake -S "$root/tests/install/consumer" -B "$work/consumer-build-tree" -G Ninja \
  -Dcapsule_DIR="$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$work/consumer-tree.log" ||
  { cat "$work/consumer-tree.log" >&2; exit 1; }
cmake --build "$work/consumer-build-tree" -j "$jobs"
"$work/consumer-build-tree/read_capsule" "$root/samples/golden/valid/full.capsule" \
  "$root/samples/keys/test-only.pub" | grep -q '^## capsule report: ' ||
  { echo "ci-install: read_capsule (build tree) did not print a report" >&2; fail=1; }
# A user's own model, plugin and trainer (samples/mlp), against the install and the build tree:
# the trainer hits its planted fault, and the installed `capsule` replays the capsule through the
# plugin and names the layer.
for pkg in "-DCMAKE_PREFIX_PATH=$prefix" "-Dcapsule_DIR=$build"; do
  dir="$work/mlp-$(echo "$pkg" | cut -c3-9)"
  cmake -S "$root/samples/mlp" -B "$dir" -G Ninja "$pkg" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    > "$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
  cmake --build "$dir" -j "$jobs"
  "$dir/mlp_train" "$dir/capsules" 5 1e30 > "$dir/train.log" ||
    { cat "$dir/train.log" >&2; fail=1; continue; }
  cap=$(ls "$dir"/capsules/*.capsule | head -n 1)
  rc=0  # 1: a divergence was found, as it should be
  "$prefix/bin/capsule" replay "$cap" --plugin "$dir/libmlp_plugin.so" --allow-unsigned --json \
    > "$dir/replay.json" 2> "$dir/replay.err" || rc=$?
  [ $rc -eq 1 ] || { echo "ci-install: replay exited $rc: $(cat "$dir/replay.err")" >&2; fail=1; }
  verdict=$(/usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(d["diagnosis"], d.get("first_divergent_layer"))' "$dir/replay.json")
  if [ "$verdict" != "NUMERICS fc2" ]; then
    echo "ci-install: samples/mlp ($pkg): replay says '$verdict': $(cat "$dir/replay.err")" >&2
    fail=1
  fi
done
[ $fail -eq 0 ] && echo "ci-install: $(echo "$headers" | wc -l) public headers; the consumer and samples/mlp built and ran against the install and the build tree"
exit $fail
