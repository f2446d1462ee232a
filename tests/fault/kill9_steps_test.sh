#!/usr/bin/env bash
# `kill -9` of a dcr-node process from outside during a real three-step `dcr run` (one set of
# long-lived nodes; the sender, the long-link relay, a leaf receiver, each in its own run, in the
# middle of step 2's stream): `dcr run` restarts the node with its plan, the node comes back at
# the version it holds and takes part in step 2, the run exits 0, every receiver is bit-exact
# (verified byte for byte) at every step, and step 2's result names the restart and what the
# nodes recovered from.
set -uo pipefail
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
for rank in ${RANKS:-0 1 6}; do
  dir="$work/k$rank"
  cat > "$work/s$rank.yaml" <<YAML
name: kill9-steps
mode: real
model: {preset: tiny, seed: 3, work_dir: $dir}
change_rate: 3%
steps: 3
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 6}
delta: {chunk_elems: 16384}
network:
  long_link: {bandwidth: 2Mbit/s, latency: 20ms}
  tls: false
YAML
  "$DCR" run "$work/s$rank.yaml" --out "$work/r$rank.json" > "$work/out$rank.txt" 2>&1 &
  run_pid=$!
  # Mid-stream of step 2: a while after its start signal (a stream takes about a second here).
  for _ in $(seq 1 1200); do [ -e "$dir/run-1/go.v2" ] && break; sleep 0.05; done
  sleep 0.4
  victim=$(pgrep -P "$run_pid" -f "plan-$rank.json" | head -1)
  if [ -z "$victim" ]; then echo "rank $rank: no node process to kill"; fail=1; wait "$run_pid"; continue; fi
  kill -9 "$victim"
  wait "$run_pid"; rc=$?
  if [ "$rc" != 0 ]; then echo "rank $rank: dcr run exit $rc"; cat "$work/out$rank.txt"; fail=1; continue; fi
  python3 - "$work/r$rank.json" "$rank" <<'PY' || { fail=1; cat "$work/out$rank.txt"; }
import json, sys
r = json.load(open(sys.argv[1])); rank = sys.argv[2]
runs = r["runs"]
assert [x["step"] for x in runs] == [1, 2, 3], [x["step"] for x in runs]
for run in runs:
    assert not run.get("error"), run.get("error")
    assert run["receivers_verified"] == run["receivers"] == 6, run
    assert all(x["verified"] and x["committed"] for x in run["receiver_results"])
restarts = [l for run in runs for l in run.get("restarts", [])]
assert any(l.startswith("node %s: killed by signal 9" % rank) for l in restarts), restarts
step2 = runs[1]
assert any(l.startswith("node %s: killed by signal 9" % rank) and l.endswith("in version 2")
           for l in step2.get("restarts", [])), step2.get("restarts")
assert step2["recovery"]["node_restarts"] >= 1, step2["recovery"]
print("kill -9 of node %s in step 2: restarted; 3 steps x 6/6 bit-exact; step 2 recovery %s" %
      (rank, step2["recovery"]))
PY
done
exit $fail
