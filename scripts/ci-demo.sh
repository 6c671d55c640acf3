#!/usr/bin/env bash
# CI mode, run first on the clean clone: the README's first command, scripts/demo.sh, as a new
# user runs it (it installs, configures and builds what it needs), and its output holds the
# README's lines: the diagnosis naming the layer and the exact reproduction. The test build that
# follows reuses the demo's objects (both configure through scripts/configure.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=$(mktemp /tmp/capsule-ci-demo.XXXXXX)
trap 'rm -f "$out"' EXIT

BUILD_DIR="$build" "$root/scripts/demo.sh" 2>&1 | tee "$out"
# The README's abridged output, line by line where it has no paths or timings.
fail=0
for pattern in '^diagnosis: ' '^fidelity: ' '^bisect \(bisect\): '; do
  want=$(grep -E "$pattern" "$root/README.md" | head -n 1)
  if [ -z "$want" ]; then
    echo "ci-demo: README.md has no line matching '$pattern'" >&2; fail=1
  elif ! grep -qxF -- "$want" "$out"; then
    echo "ci-demo: the demo did not print the README's line: $want" >&2; fail=1
  fi
done
if grep -q '^\[[0-9]*/[0-9]*\] ' "$out"; then
  echo "ci-demo: the demo printed the build tool's step lines" >&2; fail=1
fi
exit $fail
