#!/usr/bin/env bash
# `kill -9` of device receivers of a real three-step `dcr run` (one set of long-lived nodes;
# receivers.device host, the device path's host backend, with node_devices putting nodes 2 and 5
# in plain host memory): the long-link relay, a mid-tree relay and a leaf, each in its own run,
# are killed twice from outside, in the middle of step 2's stream and as step 3 starts. `dcr run`
# restarts each with its plan; the node reloads its device from the version it holds (the
# committed image in its state) and takes part in the step it was in. The run exits 0, every
# receiver is verified byte for byte on its device at every step, and the version every receiver
# holds at the end, written from its state by `dcr export --plan` (proven against the run's signed
# commitment first), is byte-identical to the dense target file of the last step.
set -uo pipefail
source "$(dirname "$0")/../lib/runs.sh"
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
for rank in ${RANKS:-1 3 6}; do
  dir="$work/k$rank"
  cat > "$work/s$rank.yaml" <<YAML
name: kill9-device
mode: real
model: {preset: tiny, seed: 3, work_dir: $dir}
change_rate: 3%
steps: 3
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 6, device: host, node_devices: {2: cpu, 5: cpu}}
delta: {chunk_elems: 16384}
network:
  long_link: {bandwidth: 2Mbit/s, latency: 20ms}
  tls: false
YAML
  "$DCR" run "$work/s$rank.yaml" --out "$work/r$rank.json" > "$work/out$rank.txt" 2>&1 &
  run_pid=$!
  kills=0
  # Mid-stream of step 2 (a stream takes about a second here), then as step 3 starts.
  for mark in go.v2 go.v3; do
    wait_for "$dir/run-1/$mark"
    [ "$mark" = go.v2 ] && sleep 0.4
    kill_rank "$run_pid" "$rank" > /dev/null && kills=$((kills + 1))
  done
  wait "$run_pid"; rc=$?
  if [ "$kills" = 0 ]; then echo "rank $rank: no node process to kill"; fail=1; continue; fi
  if [ "$rc" != 0 ]; then echo "rank $rank: dcr run exit $rc"; cat "$work/out$rank.txt"; fail=1; continue; fi
  python3 - "$work/r$rank.json" "$rank" "$dir/run-1" "$kills" <<'PY' || { fail=1; cat "$work/out$rank.txt"; }
import json, sys
from runs import assert_bit_exact, kill_restarts, load_steps
rank = sys.argv[2]; run_dir = sys.argv[3]; kills = int(sys.argv[4])
runs = load_steps(sys.argv[1], 3)
for run in runs:
    assert len(run["receiver_results"]) == 6, run
    for x in assert_bit_exact(run, receivers=6, committed=True):
        assert x["verify_message"] == "byte-for-byte equal to the target", x
# The plans: the victim and every other receiver but 2 and 5 on the host device, all recovering.
for k in range(1, 7):
    p = json.load(open("%s/plan-%d.json" % (run_dir, k)))
    want = "cpu" if k in (2, 5) else "host"
    assert p["device"] == want, (k, p["device"])
    assert p["state_dir"], (k, "no state dir")
mine = kill_restarts(runs, rank)
assert len(mine) == kills, (kills, [run.get("restarts") for run in runs])
step2 = runs[1]
assert any(l.endswith("in version 2") for l in mine), mine
assert step2["recovery"]["node_restarts"] >= 1, step2["recovery"]
print("kill -9 of node %s (%d kills, device host): restarted; 3 steps x 6/6 bit-exact; step 2 "
      "recovery %s" % (rank, kills, step2["recovery"]))
PY
  # The version each receiver holds (its last commit), exported, against the dense target of step 3.
  target=$(ls "$dir"/ckpt-*/step3.safetensors)
  for k in 1 2 3 4 5 6; do
    if ! "$DCR" export --plan "$dir/run-1/plan-$k.json" -o "$work/export-$k.safetensors" \
         > "$work/export.out" 2>&1; then
      echo "rank $rank run: dcr export of receiver $k: $(cat "$work/export.out")"; fail=1
    elif ! grep -q "^EXPORTED: rank $k, version 3 " "$work/export.out"; then
      echo "rank $rank run: receiver $k: $(cat "$work/export.out")"; fail=1
    elif ! cmp -s "$work/export-$k.safetensors" "$target"; then
      echo "rank $rank run: receiver $k's exported version 3 is not the target"; fail=1
    fi
  done
done
exit $fail
