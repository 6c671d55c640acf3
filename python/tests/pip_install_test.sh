#!/usr/bin/env bash
# `pip install --no-build-isolation` from the checkout, with no index: the package builds (in the
# given build directory, nothing written into the checkout), installs, imports from the install
# and runs the command line.
# Usage: pip_install_test.sh PYTHON PYTHON_SOURCE_DIR BUILD_DIR
set -euo pipefail
python=$1
src=$2
build=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Installing from the checkout itself leaves it as it was: no build/, no *.egg-info beside
# setup.py (the CMake build is in BUILD_DIR, setuptools' scratch in a temporary folder).
(cd "$src" && find . -print | sort) > "$work/before"
CAPSULE_BUILD_DIR=$build "$python" -m pip install --no-build-isolation --no-index --no-deps \
  --target "$work/site" "$src" > "$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
(cd "$src" && find . -print | sort) > "$work/after"
if ! diff "$work/before" "$work/after" > "$work/tree.diff"; then
  echo "FAIL: pip install wrote into the checkout:"; cat "$work/tree.diff"; exit 1
fi
cd "$work"
PYTHONPATH=$work/site "$python" - <<'PY'
import capsule, os, sys
site = os.environ["PYTHONPATH"]
assert capsule.__file__.startswith(site), capsule.__file__
assert capsule._capsule.__file__.startswith(site), capsule._capsule.__file__
PY
PYTHONPATH=$work/site "$python" -P -m capsule keygen --out "$work/k" > /dev/null
[ -s "$work/k.key" ] && [ -s "$work/k.pub" ] || { echo "FAIL: keygen wrote no key"; exit 1; }
PYTHONPATH=$work/site "$python" -P -m capsule frobnicate > /dev/null 2> "$work/err" && exit 1
grep -q "unknown command 'frobnicate'" "$work/err" || { cat "$work/err"; exit 1; }
echo "ok: pip installed capsule from the checkout; it imports and runs the command line"
