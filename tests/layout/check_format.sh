#!/usr/bin/env bash
# Fails when a C or C++ source of the repository differs from what clang-format makes of it with
# the repository's .clang-format (Google style, 100 columns), naming each such file and its first
# differing lines. Debian 12's clang-format (14) is the reference formatter; scripts/install-deps.sh
# installs it. Reformat with:
#   git ls-files '*.cc' '*.h' '*.c' '*.cu' '*.cuh' | xargs clang-format -i
#   check_format.sh [SOURCE_DIR] [FILE...]   (files relative to SOURCE_DIR; default: all sources but
#   the check's own counterexample, tests/layout/format_unformatted.cc)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
shift || true
cd "$root"
command -v clang-format >/dev/null ||
  { echo "check_format: clang-format not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
if [ "$#" -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(find core sim bench tools tests reports -type f \
    \( -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) \
    ! -name '*_unformatted.cc' | sort)
fi
[ "${#files[@]}" -gt 0 ] || { echo "check_format: no sources found under $root" >&2; exit 1; }
bad=0
for f in "${files[@]}"; do
  if ! clang-format --style=file "$f" | cmp -s - "$f"; then
    echo "check_format: $f is not clang-formatted:" >&2
    clang-format --style=file "$f" | diff "$f" - | head -8 >&2 || true
    bad=$((bad + 1))
  fi
done
echo "check_format: ${#files[@]} files, $bad not formatted ($(clang-format --version))"
[ "$bad" -eq 0 ]
