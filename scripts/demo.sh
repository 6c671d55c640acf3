#!/usr/bin/env bash
# The main job: builds capsule, makes a signing key, and shows a capsule being verified and
# inspected.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

"$root/scripts/setup-deps.sh"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs" --target capsule capsule_make_golden
capsule="$build/cli/capsule"
demo="$build/demo"
rm -rf "$demo" && mkdir -p "$demo"

echo "== capsule keygen: a signing key for this demo"
"$capsule" keygen --out "$demo/demo"
echo
echo "== the golden sample capsules, signed with the TEST-ONLY key"
"$capsule" verify "$root/samples/golden/valid/full.capsule" --pubkey "$root/samples/keys/test-only.pub"
"$capsule" inspect "$root/samples/golden/valid/full.capsule" --pubkey "$root/samples/keys/test-only.pub"
echo
echo "== a tampered capsule is refused (exit 1)"
"$capsule" verify "$root/samples/golden/invalid/payload_flipped.capsule" \
  --pubkey "$root/samples/keys/test-only.pub" || echo "(exit $?)"
