#!/usr/bin/env bash
# Function-length check: no function body in core/, sim/, bench/ or tools/ (unit tests excepted)
# is longer than LIMIT lines, counted from the line of its opening brace to the line of its
# closing one.
#   check_function_lines.sh ROOT LIMIT [REPORT]
# Functions are found by counting braces outside comments, string and character literals: a `{`
# at namespace or class level after a `)` opens a function body (lambdas and nested blocks are
# part of the function around them). With REPORT set, every function over 80 lines is listed,
# longest first. Exit 1 naming each function over LIMIT.
set -euo pipefail
root="$1"
limit="$2"
report="${3:-}"
cd "$root"
files=$(find core sim bench tools \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
          -not -name '*_test.cc' | sort)
# shellcheck disable=SC2086
lengths=$(awk '
  FNR == 1 { depth = 0; fdepth = -1; header = ""; incomment = 0 }
  {
    line = $0; out = ""; n = length(line); i = 1
    while (i <= n) {
      c = substr(line, i, 1); c2 = substr(line, i, 2)
      if (incomment) {
        if (c2 == "*/") { incomment = 0; i += 2 } else i++
        continue
      }
      if (c2 == "//") break
      if (c2 == "/*") { incomment = 1; i += 2; continue }
      if (c == "\"" || c == "\x27") {   # a literal: skip to its unescaped end
        q = c; i++
        while (i <= n && substr(line, i, 1) != q) { if (substr(line, i, 1) == "\\") i++; i++ }
        i++; out = out " "; continue
      }
      if (c == "#" && out ~ /^[ \t]*$/) break   # a preprocessor line
      if (c == "{") {
        if (fdepth < 0 && header ~ /\)/ && header !~ /(^|[^A-Za-z_])(namespace|class|struct|union|enum)([^A-Za-z_]|$)/ &&
            header !~ /=[ \t]*$/) {
          fdepth = depth; start = FNR
          name = header; sub(/\(.*/, "", name); gsub(/.*[ \t*&]/, "", name)
        }
        depth++; header = ""
      } else if (c == "}") {
        depth--
        if (fdepth >= 0 && depth == fdepth) {
          print FNR - start + 1 "\t" FILENAME ":" start "\t" name; fdepth = -1
        }
        header = ""
      } else if (c == ";") {
        header = ""
      } else if (fdepth < 0) {
        header = header c
      }
      out = out c; i++
    }
    if (fdepth < 0) header = header " "
  }' $files | sort -t$'\t' -k1,1nr)
status=0
while IFS=$'\t' read -r len where name; do
  [ -n "$len" ] || continue
  if [ -n "$report" ] && [ "$len" -gt 80 ]; then echo "$len $where $name"; fi
  if [ "$len" -gt "$limit" ]; then
    echo "check_function_lines: FAIL: $where $name is $len lines (limit $limit)" >&2
    status=1
  fi
done <<< "$lengths"
longest="${lengths%%$'\n'*}"
[ "$status" -eq 0 ] && echo "check_function_lines: OK (longest: $(echo "$longest" | tr '\t' ' '))"
exit "$status"
