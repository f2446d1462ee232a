#!/usr/bin/env bash
# `kill -9` of a dcr-node process from outside during a real `dcr run` (the sender, the long-link
# relay, a leaf receiver, each in its own run, mid-stream): `dcr run` restarts the node with its
# plan, the run exits 0, every receiver is bit-exact at the target (verified byte for byte), and
# the result JSON names the restart and what the nodes recovered from.
set -uo pipefail
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
for rank in 0 1 6; do
  dir="$work/k$rank"
  cat > "$work/s$rank.yaml" <<YAML
name: kill9
mode: real
model: {preset: tiny, seed: 3, work_dir: $dir}
change_rate: 3%
steps: 1
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
  # Mid-stream: a while after the start signal (the stream takes about a second on this link).
  for _ in $(seq 1 600); do [ -e "$dir/run-1/go" ] && break; sleep 0.05; done
  sleep 0.4
  victim=$(pgrep -P "$run_pid" -f "plan-$rank.json" | head -1)
  if [ -z "$victim" ]; then echo "rank $rank: no node process to kill"; fail=1; wait "$run_pid"; continue; fi
  kill -9 "$victim"
  wait "$run_pid"; rc=$?
  if [ "$rc" != 0 ]; then echo "rank $rank: dcr run exit $rc"; cat "$work/out$rank.txt"; fail=1; continue; fi
  python3 - "$work/r$rank.json" "$rank" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1])); rank = sys.argv[2]
run = r["runs"][0]
assert not run.get("error"), run.get("error")
assert run["receivers_verified"] == run["receivers"] == 6, run
assert all(x["verified"] for x in run["receiver_results"])
assert any(l.startswith("node %s: killed by signal 9" % rank) for l in run.get("restarts", [])), run.get("restarts")
assert run["recovery"]["node_restarts"] >= 1
print("kill -9 of node %s: restarted; %d/6 bit-exact; recovery %s" %
      (rank, run["receivers_verified"], run["recovery"]))
PY
done
exit $fail
