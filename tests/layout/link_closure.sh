#!/usr/bin/env bash
# Link-closure check: no library in the link closure of a product library is yaml-cpp, a CLI
# library (CLI11, core/cli's libraries), a test tool (the testing library, tools/faults' fault
# points, proxies and runners) or
# another tool-side library (bench, sim, scenario, reports).
#   link_closure.sh [--forbid REGEX] LINKS_DIR ROOT...
# --forbid replaces that list with REGEX (an extended regex over library names): how the tool-side
# libraries are kept in layers (the testing library below the simulator and the benchmarks, both
# below the CLI's run orchestration and commands), so no two of them depend on each other.
# LINKS_DIR holds <target>.txt for every library of this project the closure may reach: the
# target's INTERFACE_LINK_LIBRARIES as CMake generates it (tests/layout/CMakeLists.txt), private
# dependencies of a static library included ($<LINK_ONLY:...>). Names are followed from each ROOT;
# a dcr_ library without a file is an error (the check would not see what it links), any other
# name (an imported library) is a leaf. Exit 1 naming the path to each forbidden library.
set -euo pipefail
forbidden='^(yaml-cpp.*|CLI11.*|dcr_testing|dcr_cli_node|dcr_runner|dcr_publisher_scenario|dcr_cli_progress|dcr_faults|dcr_fault_proxies|dcr_fault_runners|dcr_bench|dcr_sim|dcr_scenario|dcr_reports)$'
if [ "${1:-}" = "--forbid" ]; then
  forbidden="$2"
  shift 2
fi
links="$1"
shift
status=0

# The names one target links, one a line: aliases dcr::x as dcr_x, $<LINK_ONLY:x> as x.
deps() {
  tr ';' '\n' < "$links/$1.txt" | sed -e 's/\$<LINK_ONLY:\(.*\)>/\1/' -e 's/^dcr::/dcr_/' |
    grep -v '^$' || true
}

for root in "$@"; do
  declare -A seen=()
  queue=("$root")
  declare -A via=(["$root"]="$root")
  closure=()
  while [ "${#queue[@]}" -gt 0 ]; do
    t="${queue[0]}"
    queue=("${queue[@]:1}")
    [ -n "${seen[$t]:-}" ] && continue
    seen[$t]=1
    closure+=("$t")
    if [ "$t" != "$root" ] && echo "$t" | grep -Eq "$forbidden"; then
      echo "link_closure: FAIL: $root links $t (${via[$t]})" >&2
      status=1
      continue
    fi
    if [ -f "$links/$t.txt" ]; then
      while read -r d; do
        if [ -z "${seen[$d]:-}" ]; then
          [ -n "${via[$d]:-}" ] || via[$d]="${via[$t]} -> $d"
          queue+=("$d")
        fi
      done < <(deps "$t")
    elif [[ "$t" == dcr_* ]]; then
      echo "link_closure: FAIL: $root reaches $t, whose link interface is not generated" >&2
      status=1
    fi
  done
  echo "$root: ${closure[*]}"
  unset seen via
done
[ "$status" -eq 0 ] && echo "link_closure: OK"
exit "$status"
