#!/usr/bin/env bash
# Builds one target of a configured build directory and shows one line for it instead of the
# compiler's: what it builds, how many steps, about how long, and (on a terminal) the step it is
# at. The compiler's output goes to <build>/build-TARGET.log, printed in full if the build fails.
#   scripts/build-quietly.sh TARGET "what it is"     # build dir: build/ (or $BUILD_DIR)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
target=$1
what=${2:-$1}
log="$build/build-$target.log"

# The steps still to run, as the build tool counts them (ninja; make gives no count).
steps=0
if [ -f "$build/build.ninja" ]; then
  steps=$(ninja -C "$build" -n "$target" 2>/dev/null | grep -c '^\[' || true)
fi
if [ -f "$build/build.ninja" ] && [ "$steps" -eq 0 ]; then
  echo "build: $target is up to date ($what)"
  exit 0
fi
# A step costs ~2.7 CPU-seconds on average here (a full demo build: 103 steps, 280 CPU-seconds on
# a 2-core Debian VM); the estimate is only meant to say "minutes, not seconds".
estimate=""
if [ "$steps" -gt 0 ]; then
  seconds=$(( steps * 27 / 10 / (jobs < 2 ? 1 : jobs) + 10 ))
  estimate=", about $(( (seconds + 30) / 60 )) min"
  [ "$seconds" -lt 90 ] && estimate=", about $seconds s"
  estimate=" ($steps steps on $jobs cores$estimate)"
fi
echo "build: $target: $what$estimate; log in $log"

start=$SECONDS
set +e
if [ -t 1 ]; then
  # One line, rewritten in place: [k/N] and the elapsed time.
  cmake --build "$build" --target "$target" -j "$jobs" 2>&1 | tee "$log" |
    while IFS= read -r line; do
      case "$line" in
        \[*/*\]*) printf '\r\033[Kbuild: %s %ds' "${line%%]*}]" $((SECONDS - start)) ;;
      esac
    done
  status=${PIPESTATUS[0]}
  printf '\r\033[K'
else
  cmake --build "$build" --target "$target" -j "$jobs" > "$log" 2>&1
  status=$?
fi
set -e
if [ "$status" -ne 0 ]; then
  grep -v '^\[' "$log" >&2 || true   # the compiler's messages, without the progress lines
  echo "build: $target failed after $((SECONDS - start)) s (compiler output above, kept in $log)" >&2
  exit "$status"
fi
echo "build: $target built in $((SECONDS - start)) s"
