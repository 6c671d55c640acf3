#!/usr/bin/env bash
# The main job: a sample trainer hits a fault, writes a signed capsule, and replay names the bad
# layer. Builds what it needs first (scripts/setup-deps.sh installs the Debian packages).
#   scripts/demo.sh                         # nan injected at blocks.2 from step 5
#   FAULT=eps LAYER=blocks.1 scripts/demo.sh   # a finite fault, captured by hand at step 6
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
fault=${FAULT:-nan}
layer=${LAYER:-blocks.2}

"$root/scripts/setup-deps.sh"
BUILD_DIR="$build" "$root/scripts/configure.sh"
BUILD_DIR="$build" JOBS="$jobs" "$root/scripts/build-quietly.sh" capsule-demo \
  "the capsule command line, its LibTorch half, the tiny_gpt trainer and its replay plugin"
capsule="$build/cli/capsule"
trainer="$build/samples/capsule-tiny-gpt"
plugin="$build/samples/libcapsule_tiny_gpt_plugin.so"
demo="$build/demo"
rm -rf "$demo" && mkdir -p "$demo"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "capsule keygen: a signing key for the trainer"
"$capsule" keygen --out "$demo/trainer"

capture=()
if [ "$fault" = eps ] || [ "$fault" = tail-block ]; then capture=(--capture-at-step 6); fi
step "train tiny_gpt with a '$fault' fault in $layer from step 5; the Monitor writes a capsule"
"$trainer" train --steps 12 --layers 4 --inject "$fault" --inject-layer "$layer" --inject-step 5 \
  --capsule-dir "$demo/capsules" --key "$demo/trainer.key" "${capture[@]}"
file=$(ls "$demo"/capsules/*.capsule | head -n 1)

step "capsule verify: intact and signed by the trainer's key"
"$capsule" verify "$file" --pubkey "$demo/trainer.pub"

step "capsule inspect"
"$capsule" inspect "$file" --pubkey "$demo/trainer.pub"

step "capsule replay --bisect: does it reproduce, and where do the paths diverge?"
set +e
"$capsule" replay "$file" --plugin "$plugin" --pubkey "$demo/trainer.pub" --bisect
rc=$?
set -e
echo "(replay exit status $rc: 0 no divergence, 1 divergence or not reproduced, 2 error)"
[ $rc -le 1 ]
