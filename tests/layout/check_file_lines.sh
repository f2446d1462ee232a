#!/usr/bin/env bash
# Fails when a source file under core/src is longer than the limit a reader takes in one sitting
# (1,000 lines; tests beside the code included), naming each such file.
#   check_file_lines.sh [SOURCE_DIR] [LIMIT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
limit="${2:-1000}"
cd "$root"
files=$(find core/src -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
[ -n "$files" ] || { echo "check_file_lines: no sources found under $root/core/src" >&2; exit 1; }
status=0
count=0
while IFS= read -r f; do
  n=$(wc -l < "$f")
  count=$((count + 1))
  if [ "$n" -gt "$limit" ]; then
    echo "check_file_lines: $f has $n lines (limit $limit): split it along its seams" >&2
    status=1
  fi
done <<< "$files"
longest=$(echo "$files" | xargs wc -l | grep -v ' total$' | sort -n | tail -1)
echo "check_file_lines: $count files under core/src; longest: $longest (limit $limit)"
[ "$status" -eq 0 ] && echo "check_file_lines: OK"
exit $status
