#!/usr/bin/env bash
# The golden samples in samples/golden are exactly what capsule_make_golden writes today: encoding
# is deterministic, and any change to the bytes a capsule is written as shows up here.
# Usage: golden_reproducible_test.sh MAKE_GOLDEN_BIN SOURCE_DIR
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$1" "$2/samples/keys" "$work" >/dev/null
diff -r "$2/samples/golden/valid" "$work/valid"
diff -r "$2/samples/golden/invalid" "$work/invalid"
diff "$2/samples/golden/EXPECTED" "$work/EXPECTED"
echo "ok: golden samples regenerate byte for byte"
