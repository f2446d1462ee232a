# Sourced by the CLI test scripts as `source cli_lib.sh DCR` (DCR: the dcr binary). Sets $dcr, a
# scratch directory $tmp removed on exit, and fail=0; each check prints "ok   NAME" or
# "FAIL NAME: ..." and sets fail=1 on a failure. A script ends with `exit $fail`. Also sources
# tests/lib/runs.sh (wait_for, kill_rank; runs.py for the Python checks).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../lib/runs.sh"
dcr="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL $1: exit $3, expected $2"; fail=1; else echo "ok   $1"; fi
}
has() {  # has NAME FILE PATTERN: FILE contains PATTERN (fixed string)
  if grep -qF -- "$3" "$2"; then echo "ok   $1"; else echo "FAIL $1: no '$3' in:"; cat "$2"; fail=1; fi
}
lacks() {  # lacks NAME FILE PATTERN
  if grep -qF -- "$3" "$2"; then echo "FAIL $1: '$3' in:"; cat "$2"; fail=1; else echo "ok   $1"; fi
}
two_regions() {  # the scenario's network block: train and rollout regions, a 1 Gbit/s long link, emulated
  cat <<'YAML'
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 1Gbit/s, latency: 1ms}
  emulation: transport
YAML
}
