#!/usr/bin/env bash
# The real-process fault matrix: `dcr run scenarios/faults-process.yaml` SIGKILLs dcr-node
# processes (receivers between and inside chunks and at each step of their version log's commit:
# entries synced, marker synced, mid-image, image renamed; relays and the sender mid-stream,
# kills from outside) and restarts them; every receiver must end bit-exact (each verifies its storage byte
# for byte against the target after committing), every injected kill survived, at least 50.
# Then the same kinds in three-step runs of long-lived nodes (scenarios/faults-process-steps.yaml),
# each kill at a seeded step: every receiver bit-exact at every step, every kill survived; once
# more with the receivers on the device path's host backend, nodes 2 and 5 in host memory
# (scenarios/faults-process-steps-device.yaml); and in four-step runs with catch-up
# (scenarios/faults-process-catch-up.yaml: a region receiver down for a step, a late joiner),
# where the region receivers are among the ranks killed.
set -euo pipefail
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check() {  # result.json, the fewest kills it must have injected
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); least = int(sys.argv[2])
f = r["faults"]
print("process kills: %d runs, %d injected, %d survived, %d/%d receivers bit-exact" %
      (f["runs"], f["faults_injected"], f["faults_survived"], f["receivers_verified"], f["receivers"]))
for k, v in sorted(f["injected_by_kind"].items()):
    print("  %-36s injected %3d survived %3d" % (k, v, f["survived_by_kind"].get(k, 0)))
assert f["faults_injected"] >= least, "fewer than %d process kills injected" % least
assert f["faults_survived"] == f["faults_injected"], f.get("errors")
assert f["receivers_verified"] == f["receivers"], f.get("errors")
for k in ["process:receiver_between_chunks", "process:receiver_inside_chunk",
          "process:relay_mid_stream", "process:sender_mid_stream", "process:kill_from_outside"]:
    assert f["injected_by_kind"].get(k, 0) > 0, "no " + k
for run in r["runs"]:
    assert not run.get("error"), run.get("error")
    assert run["receivers_verified"] == run["receivers"]
    for rr in run["receiver_results"]:
        if rr.get("catch_up") == "absent":  # a region receiver down or not yet joined
            continue
        assert rr["verified"], rr
PY
}
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/run|" scenarios/faults-process.yaml > "$work/s.yaml"
"$DCR" run "$work/s.yaml" --out "$work/result.json" > "$work/out.txt"
check "$work/result.json" 50
python3 - "$work/result.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))["faults"]
# Durable receivers killed at each step of their version log's commit, and back bit-exact.
for k in ["process:receiver_log_entries_synced", "process:receiver_log_marker_synced",
          "process:receiver_log_image_half_written", "process:receiver_log_image_renamed"]:
    assert f["injected_by_kind"].get(k, 0) > 0, "no " + k
PY
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/steps|" scenarios/faults-process-steps.yaml > "$work/t.yaml"
"$DCR" run "$work/t.yaml" --out "$work/steps.json" > "$work/out-steps.txt"
check "$work/steps.json" 12
python3 - "$work/steps.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = sorted({run["step"] for run in r["runs"]})
assert steps == [1, 2, 3], steps
later = [l for run in r["runs"] if run["step"] > 1 for l in run.get("restarts", [])]
assert later, "no kill landed in a step after the first"
print("multi-step: %d restarts in steps 2-3" % len(later))
PY
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/device|" scenarios/faults-process-steps-device.yaml > "$work/d.yaml"
"$DCR" run "$work/d.yaml" --out "$work/device.json" > "$work/out-device.txt"
check "$work/device.json" 10
python3 - "$work/device.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["setup"]["devices"].startswith("receivers: host, node 2: cpu, node 5: cpu"), r["setup"]["devices"]
restarts = [l for run in r["runs"] for l in run.get("restarts", [])]
on_device = [l for l in restarts if l.split(":")[0] in ("node 1", "node 3", "node 4", "node 6")]
assert on_device, ("no device receiver was killed", restarts)
print("device multi-step: %d restarts, %d of device receivers" % (len(restarts), len(on_device)))
PY
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/catch-up|" scenarios/faults-process-catch-up.yaml > "$work/c.yaml"
"$DCR" run "$work/c.yaml" --out "$work/catch-up.json" > "$work/out-catch-up.txt"
check "$work/catch-up.json" 10
python3 - "$work/catch-up.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
held = {}  # region rank -> steps it held, each verified (check above)
for run in r["runs"]:
    for x in run["receiver_results"]:
        if x["node"] >= 7 and x.get("catch_up") != "absent":
            held.setdefault(x["node"], set()).add(run["step"])
assert held.get(7) and held.get(8), held
frames = [e for run in r["runs"] for e in run.get("catch_up", []) if e["event"] == "full_frame"]
assert frames and all(e["long_link_bytes"] == 0 for e in frames), frames
print("catch-up: region receivers held steps %s" % {k: sorted(v) for k, v in held.items()})
PY
