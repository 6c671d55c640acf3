#!/usr/bin/env bash
# CI mode: every tracked .h/.cc file is formatted as .clang-format says (clang-format 14, the
# Debian one). Prints the offending lines and fails otherwise; changes nothing. To fix:
#   git ls-files '*.h' '*.cc' | xargs clang-format -i
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
format=${CLANG_FORMAT:-clang-format}
if ! command -v "$format" >/dev/null; then "$root/scripts/setup-deps.sh"; fi

mapfile -t files < <(git ls-files -- '*.h' '*.cc')
if [ ${#files[@]} -eq 0 ]; then
  echo "ci-format: no tracked .h/.cc files" >&2
  exit 1
fi
"$format" --dry-run -Werror "${files[@]}"
echo "ci-format: ${#files[@]} files formatted ($("$format" --version | head -n 1))"
