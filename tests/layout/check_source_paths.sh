#!/usr/bin/env bash
# Source-path check: no program but a unit-test binary has the source tree's path compiled in.
#   check_source_paths.sh ROOT TEST_SUFFIX [BINARY...]
#   1. no CMakeLists.txt under ROOT hands a source directory (CMAKE_SOURCE_DIR,
#      CMAKE_CURRENT_SOURCE_DIR, PROJECT_SOURCE_DIR, CMAKE_CURRENT_LIST_DIR) to a target's compile
#      definitions, unless the target's name ends in TEST_SUFFIX (unit tests read fixtures beside
#      their sources; "_tests" for the build's check, "-" to flag every target);
#   2. no BINARY contains ROOT's path as a string (a __FILE__ or a baked-in directory).
# Exit 1 naming each offender.
set -euo pipefail
root="$(cd "$1" && pwd)"
suffix="$2"
shift 2
status=0
fail() { echo "check_source_paths: FAIL: $*" >&2; status=1; }

# Each target_compile_definitions call as one line: FILE<TAB>TARGET<TAB>ARGUMENTS.
calls=$(find "$root" -name CMakeLists.txt -not -path "$root/build*" -not -path "*/third_party/*" \
          -print0 | xargs -0 awk '
    /target_compile_definitions[ \t]*\(/ { call = ""; open = 1 }
    open { call = call " " $0; if ($0 ~ /\)[ \t]*$/) { open = 0
      sub(/.*target_compile_definitions[ \t]*\([ \t]*/, "", call)
      split(call, w, /[ \t]+/); print FILENAME "\t" w[1] "\t" call } }')
while IFS=$'\t' read -r file target args; do
  [ -n "$file" ] || continue
  echo "$args" | grep -Eq 'CMAKE_SOURCE_DIR|CMAKE_CURRENT_SOURCE_DIR|PROJECT_SOURCE_DIR|CMAKE_CURRENT_LIST_DIR' ||
    continue
  if [ "$suffix" != "-" ] && [[ "$target" == *"$suffix" ]]; then continue; fi
  fail "${file#$root/}: $target gets a source directory compiled in"
done <<< "$calls"

for bin in "$@"; do
  [ -f "$bin" ] || { fail "$bin: no such binary"; continue; }
  if grep -Fqa "$root" "$bin"; then fail "$bin contains the source path $root"; fi
done
[ "$status" -eq 0 ] && echo "check_source_paths: OK ($# binaries)"
exit "$status"
