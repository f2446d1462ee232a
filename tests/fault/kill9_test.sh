#!/usr/bin/env bash
# `kill -9` of a dcr-node process from outside during a real `dcr run`, each victim in its own
# run, mid-stream: `dcr run` restarts the node with its plan, the run exits 0, every receiver is
# bit-exact (verified byte for byte) at every step it holds, and the result JSON names the
# restart and what the nodes recovered from.
#   kill9_test.sh DCR one       one refit; the sender, the long-link relay, a leaf receiver
#   kill9_test.sh DCR steps     three steps of one set of long-lived nodes, killed in step 2: the
#                               node comes back at the version it holds and takes part in step 2
#   kill9_test.sh DCR catch_up  four steps with a `catch_up:` block (a region receiver down for
#                               step 2, a late joiner at step 3): the sender, the long-link relay
#                               (the in-region holder that serves the joiner's full frame), a
#                               leaf and the returning region receiver killed in step 3, the
#                               joiner killed in step 4; each comes back from its journal
# RANKS (environment) overrides the victims.
set -uo pipefail
source "$(dirname "$0")/../lib/runs.sh"
DCR=$1
mode=${2:-one}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
steps=1 go=go victims="0 1 6" extra="" pause=0.4
case "$mode" in
  one) ;;
  steps) steps=3 go=go.v2 ;;
  catch_up)
    steps=4 go=go.v3 victims="0 1 6 7 8"
    extra="catch_up: {down_step: 2, down_versions: 1, join_step: 3}"
    ;;
  *) echo "unknown mode $mode (one, steps, catch_up)"; exit 2 ;;
esac
for rank in ${RANKS:-$victims}; do
  dir="$work/k$rank"
  at=$go
  # The joiner holds nothing before step 3: it is killed while it follows step 4.
  [ "$mode" = catch_up ] && [ "$rank" = 8 ] && at=go.v4
  cat > "$work/s$rank.yaml" <<YAML
name: kill9-$mode
mode: real
model: {preset: tiny, seed: 3, work_dir: $dir}
change_rate: 3%
steps: $steps
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 6, deadline: 3s}
delta: {chunk_elems: 16384}
network:
  long_link: {bandwidth: 2Mbit/s, latency: 20ms}
  tls: false
$extra
YAML
  "$DCR" run "$work/s$rank.yaml" --out "$work/r$rank.json" > "$work/out$rank.txt" 2>&1 &
  run_pid=$!
  # Mid-stream: a while after the step's start signal (a stream takes about a second here).
  wait_for "$dir/run-1/$at"
  sleep "$pause"
  if ! kill_rank "$run_pid" "$rank" > /dev/null; then
    echo "rank $rank: no node process to kill"; fail=1; wait "$run_pid"; continue
  fi
  wait "$run_pid"; rc=$?
  if [ "$rc" != 0 ]; then echo "rank $rank: dcr run exit $rc"; cat "$work/out$rank.txt"; fail=1; continue; fi
  python3 - "$work/r$rank.json" "$rank" "$mode" "$steps" "${at#go}" <<'PY' || { fail=1; cat "$work/out$rank.txt"; }
import sys
from runs import assert_bit_exact, kill_restarts, load_steps
rank, mode, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
killed_in = int(sys.argv[5][2:]) if sys.argv[5] else 1
runs = load_steps(sys.argv[1], steps)
for run in runs:
    assert_bit_exact(run, receivers=6, committed=True)
died = "node %s: killed by signal 9" % rank
assert kill_restarts(runs, rank), [run.get("restarts") for run in runs]
if steps > 1:
    # The restart goes to the step of the version the node was in: the step killed in, or, for
    # the returning region receiver (rank 7, started again as step 3 starts), the version it was
    # catching up.
    (at,) = [run for run in runs if any(l.startswith(died) for l in run.get("restarts", []))]
    if mode == "catch_up" and rank == "7":
        assert 2 <= at["step"] <= killed_in, at["step"]
    else:
        assert at["step"] == killed_in, (killed_in, at["step"])
    assert any(l.startswith(died) and l.endswith("in version %d" % at["step"])
               for l in at["restarts"]), at["restarts"]
    assert at["recovery"]["node_restarts"] >= 1, at["recovery"]
if mode == "catch_up":
    events = [(run["step"], e["node"], e["event"]) for run in runs for e in run.get("catch_up", [])]
    assert (2, 7, "declared_dead") in events, events
    # The version it missed, from the region store, once it is back (journaled: not from v1).
    (seven,) = [x for x in runs[1]["receiver_results"] if x["node"] == 7]
    assert seven["catch_up"] in ("follow", "replay") and seven["verified"], seven
    assert any(e[1:] == (8, "full_frame") for e in events), events
    # (Re-admission into the joint commit depends on a report arriving within receivers.deadline,
    # a matter of load rather than recovery: cli.catch_up checks it.)
    for run in runs:
        for e in run.get("catch_up", []):
            assert e["long_link_bytes"] == 0, e
print("kill -9 of node %s (%s): restarted; %d steps bit-exact; recovery %s" %
      (rank, mode, steps, (at if steps > 1 else runs[0])["recovery"]))
PY
done
exit $fail
