# Sourced by the test scripts that drive a real `dcr run` and kill its node processes. Puts this
# folder on PYTHONPATH (for runs.py, the result-JSON checks the scripts' Python parts share) and
# defines:
#   wait_for PATH [SECONDS] [MS]
#                             waits until PATH exists, polling every MS milliseconds (default
#                             50, at most 999); returns 1 if it does not within SECONDS (default 60)
#   kill_rank RUN_PID RANK    kill -9 of the dcr-node process that `dcr run` RUN_PID started for
#                             RANK (its child running plan-RANK.json); prints the victim's pid,
#                             returns 1 when there is none
test_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$test_lib${PYTHONPATH:+:$PYTHONPATH}"
wait_for() {
  local ms=${3:-50}
  local polls=$(( ${2:-60} * 1000 / ms )) pause
  pause=$(printf '0.%03d' "$ms")
  for _ in $(seq 1 "$polls"); do [ -e "$1" ] && return 0; sleep "$pause"; done
  return 1
}
kill_rank() {
  local victim
  victim=$(pgrep -P "$1" -f "plan-$2.json" | head -1)
  [ -n "$victim" ] || return 1
  kill -9 "$victim" && echo "$victim"
}
