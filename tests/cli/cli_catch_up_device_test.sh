#!/usr/bin/env bash
# Full frames between device receivers: a real three-step `dcr run` with a `catch_up:` block whose
# receivers hold the weights on the device path's host backend (receivers.device), nodes 2 and 4
# in host memory (receivers.node_devices). Rank 7, a region receiver on the device too, joins when
# step 2 starts holding nothing and asks for a full frame; the holder (node 1, a long-link relay
# on the device) downloads its device tensors into the frame it puts into the region store after
# its next commit, and the joiner loads the frame onto its device. The joiner checks the frame
# against the version's trailer, follows step 3 on its device, and every receiver is bit-exact at
# every version it held; the long link carries no catch-up byte.
source "$(dirname "$0")/cli_lib.sh" "$@"
cat > "$tmp/s.yaml" <<YAML
name: catch-up-device
mode: real
model: {preset: tiny, work_dir: $tmp/work}
steps: 3
change_rate: 3%
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {topology: [-1, 0, 0, 1, 3, 2, 2]}}
receivers: {count: 6, deadline: 2s, device: host, node_devices: {2: cpu, 4: cpu}}
catch_up: {join_step: 2}
$(two_regions)
YAML
"$dcr" run "$tmp/s.yaml" -q --out "$tmp/r.json" > "$tmp/table.md" 2> "$tmp/err.txt"; check run 0 $?
[ -s "$tmp/r.json" ] || { cat "$tmp/err.txt"; exit 1; }
run_dir=$(ls -d "$tmp"/work/run-*)
python3 - "$tmp/r.json" "$run_dir" <<'PY'; check frame-from-device-bit-exact 0 $?
import json, os, sys
from runs import assert_bit_exact, load_steps
runs = load_steps(sys.argv[1], 3)
how, events = {}, []
for r in runs:
    assert_bit_exact(r)
    for x in r["receiver_results"]:
        how[(x["node"], r["step"])] = x.get("catch_up", "tree")
    assert r["wire_bytes"] <= 2 * r["payload_bytes"] * 1.05, r
    events += [(r["step"], e["node"], e["event"], e["long_link_bytes"], e["store_bytes"])
               for e in r.get("catch_up", [])]
assert how[(7, 1)] == "absent", how
frame = [e for e in events if e[1:3] == (7, "full_frame")]
assert len(frame) == 1 and frame[0][3] == 0 and frame[0][4] > 0, events
assert how[(7, 3)] in ("follow", "replay"), how
for rank, want in ((1, "host"), (2, "cpu"), (4, "cpu"), (7, "host")):
    p = json.load(open(os.path.join(sys.argv[2], "plan-%d.json" % rank)))
    assert p["device"] == want, (rank, p["device"])
print("rank 7: full frame from a host-device holder at step %d; events %s" % (frame[0][0], events))
PY
has frame-onto-device "$run_dir/node-7.log" "bytes) onto device host: "
cat "$run_dir/node-1.log" "$run_dir/node-2.log" > "$tmp/holders.log"
has served-from-device "$tmp/holders.log" "put in the region store"
lacks no-refusal "$tmp/holders.log" "full-frame request not served"
exit $fail
