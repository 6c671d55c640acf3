#!/usr/bin/env bash
# Renders `capsule report --format html` of the golden full capsule in headless Chromium: the page
# must load with no network and draw every chart mark. Asserts a non-trivial screenshot and counts
# the SVG bars and points in the DOM Chromium built (not just in our own output).
# Usage: html_browser_test.sh CAPSULE_BIN SOURCE_DIR ARTIFACT_DIR
# Exit 77 (ctest: skipped) when chromium is not installed.
set -uo pipefail
capsule_bin=$(realpath "$1")
src=$(realpath "$2")
artifacts=$3
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "skip: chromium not installed (scripts/setup-deps.sh installs it)"
  exit 77
fi
mkdir -p "$artifacts"
artifacts=$(realpath "$artifacts")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT

# The golden full capsule: 3 forward layers and 6 history steps; the replay fixture compares the
# same 3 forward layers.
expect_absmax_bars=3
expect_points=6
expect_divergence_bars=3

html="$artifacts/full.html"
png="$artifacts/full.png"
rm -f "$png" "$html"  # report -o never replaces an existing file
"$capsule_bin" report "$src/samples/golden/valid/full.capsule" \
  --pubkey "$src/samples/keys/test-only.pub" --format html \
  --replay-json "$src/tests/report/golden/full.replay.json" -o "$html" || {
  echo "FAIL: capsule report exited $?"; exit 1; }

flags=(--headless --no-sandbox --disable-gpu --disable-background-networking
       --disable-component-update --disable-sync --no-first-run --user-data-dir="$profile")
timeout 90 "$browser" "${flags[@]}" --screenshot="$png" --window-size=1200,2000 \
  "file://$html" > "$artifacts/screenshot.log" 2>&1
size=$(stat -c %s "$png" 2>/dev/null || echo 0)
if [ "$size" -lt 10000 ]; then
  echo "FAIL: screenshot $png is missing or trivial ($size bytes)"; cat "$artifacts/screenshot.log"
  exit 1
fi

timeout 90 "$browser" "${flags[@]}" --dump-dom "file://$html" > "$artifacts/dom.html" \
  2> "$artifacts/dump-dom.log"
chart() { sed -n "/<svg id=\"$1\"/,/<\/svg>/p" "$artifacts/dom.html"; }
count() { grep -o "$1" | wc -l; }
absmax_bars=$(chart chart-absmax | count '<rect class="bar')
loss_points=$(chart chart-history | count '<circle class="point loss')
grad_points=$(chart chart-history | count '<circle class="point grad-norm')
divergence_bars=$(chart chart-divergence | count '<rect class="bar')
echo "screenshot $png: $size bytes"
echo "absmax bars $absmax_bars, loss points $loss_points, grad-norm points $grad_points," \
     "divergence bars $divergence_bars"
fail=0
[ "$absmax_bars" -eq "$expect_absmax_bars" ] || { echo "FAIL: absmax bars"; fail=1; }
[ "$loss_points" -eq "$expect_points" ] || { echo "FAIL: loss points"; fail=1; }
[ "$grad_points" -eq "$expect_points" ] || { echo "FAIL: grad-norm points"; fail=1; }
[ "$divergence_bars" -eq "$expect_divergence_bars" ] || { echo "FAIL: divergence bars"; fail=1; }
[ "$fail" -eq 0 ] && echo "ok: chromium rendered every chart mark"
exit "$fail"
