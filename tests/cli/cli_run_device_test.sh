#!/usr/bin/env bash
# `dcr run` on the device path (receivers.device / sender.device: host, the host backend of
# dcr/device.h): real dcr-node processes whose receivers hold the base in device memory and apply
# on it, 3 receivers with per_node 2 (the host-aware tree), every receiver verified bit-exact on
# its device against the target (the full-checkpoint reference too, loaded onto the device at
# commit); the plans carry the devices and the tree. `device: cuda` on a
# machine without a usable GPU is refused before any node starts (exit 15, naming CUDA), by
# `dcr run` and by `dcr node` in both forms.
source "$(dirname "$0")/cli_lib.sh" "$@"
scenario() {  # scenario FILE DEVICE WORK_DIR [EXTRA_RECEIVER_KEYS]
  cat > "$1" <<YAML
name: cli-device
mode: real
model:
  checkpoints: [$s0, $s1]
  work_dir: $3
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {fan_out: 2, root_fan_out: 1, streams: 2}}
receivers: {count: 3, per_node: 2, apply_threads: 2, device: $2${4:-}}
sender: {device: $2}
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 1Gbit/s, latency: 1ms}
timeout: 120s
YAML
}
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"

# The host backend end to end.
scenario "$tmp/host.yaml" host "$tmp/work"
"$dcr" run "$tmp/host.yaml" --out "$tmp/r.json" -q > "$tmp/table.md" 2> "$tmp/err.txt"
check run-host 0 $?
python3 - "$tmp/r.json" "$tmp/work/run-1" <<'PY'; check run-host-result 0 $?
import json, sys
j = json.load(open(sys.argv[1]))
assert j["mode"] == "real", j["mode"]
assert len(j["runs"]) == 1, j["runs"]
r = j["runs"][0]
assert r["method"] == "delta" and r.get("error", "") == "", r
assert r["receivers"] == 3 and r["receivers_verified"] == 3, r
assert len(r["receiver_results"]) == 3, r["receiver_results"]
for rec in r["receiver_results"]:
    assert rec["committed"] and rec["verified"], rec
    assert rec["verify_message"] == "byte-for-byte equal to the target", rec
    assert rec["bytes_received"] == r["payload_bytes"] > 0, (rec, r["payload_bytes"])
assert r["wire_bytes"] >= r["payload_bytes"], r
assert j["setup"]["devices"].startswith("receivers: host; sender: host"), j["setup"]["devices"]
# The plans: every node on the host device 0; the host-aware tree (hosts {1, 2} and {3}: the
# leaders 1 and 3 on the fan-out tree, 2 below its leader).
for rank in range(4):
    p = json.load(open("%s/plan-%d.json" % (sys.argv[2], rank)))
    assert p["device"] == "host" and p["device_index"] == 0, (rank, p["device"], p["device_index"])
    assert p["parents"] == [-1, 0, 1, 1], p["parents"]
PY
lacks run-host-no-error "$tmp/err.txt" "failed"

# The same refit on plain host receivers gives the same stream: the device changes where the
# weights are, not the delta.
scenario "$tmp/cpu.yaml" cpu "$tmp/work-cpu"
"$dcr" run "$tmp/cpu.yaml" --out "$tmp/rc.json" -q > /dev/null 2>&1; check run-cpu 0 $?
python3 - "$tmp/r.json" "$tmp/rc.json" <<'PY'; check host-and-cpu-same-payload 0 $?
import json, sys
h, c = (json.load(open(f))["runs"][0] for f in sys.argv[1:3])
assert h["payload_bytes"] == c["payload_bytes"], (h["payload_bytes"], c["payload_bytes"])
assert c["receivers_verified"] == 3, c
PY

# The full-checkpoint reference onto the device too: each receiver loads the file image onto
# its device at commit and verifies there; the delta is faster than it through the same link.
sed 's/methods: \[delta\]/methods: [delta, full]/; s|work_dir: .*|work_dir: '"$tmp"'/work-full|' \
  "$tmp/host.yaml" > "$tmp/full.yaml"
"$dcr" run "$tmp/full.yaml" -q --out "$tmp/rfull.json" > /dev/null 2> "$tmp/err.txt"
check run-full-on-device 0 $?
python3 - "$tmp/rfull.json" <<'PY'; check run-full-on-device-result 0 $?
import json, sys
runs = {r["method"]: r for r in json.load(open(sys.argv[1]))["runs"]}
assert set(runs) == {"delta", "full"}, runs.keys()
for r in runs.values():
    assert r.get("error", "") == "" and r["receivers_verified"] == 3, r
    assert all(x["verified"] for x in r["receiver_results"]), r["receiver_results"]
assert runs["full"]["payload_bytes"] > 10 * runs["delta"]["payload_bytes"], runs
PY

# CUDA without a usable GPU: refused before any node starts. (Skipped where a GPU is present.)
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "skip cuda refusal: this machine has a GPU"
  exit $fail
fi
scenario "$tmp/cuda.yaml" cuda "$tmp/work-cuda" ", devices: [0]"
"$dcr" run "$tmp/cuda.yaml" -q > "$tmp/out.txt" 2> "$tmp/err.txt"; check run-cuda-refused 15 $?
has run-cuda-names-cuda "$tmp/err.txt" "CUDA"
has run-cuda-names-key "$tmp/err.txt" "sender.device"
[ ! -e "$tmp/work-cuda" ]; check run-cuda-no-work-dir 0 $?
lacks run-cuda-no-work-dir-line "$tmp/err.txt" "work dir"
[ -z "$(pgrep -f -- "--plan $tmp/work-cuda" 2>/dev/null)" ]; check run-cuda-no-node 0 $?
# The full-checkpoint reference alone builds no delta: the sender's device is not needed.
scenario "$tmp/cuda-full.yaml" cuda "$tmp/work-cuda-full"
sed -i 's/methods: \[delta\]/methods: [full]/; s/, device: cuda}/, device: cpu}/' "$tmp/cuda-full.yaml"
"$dcr" run "$tmp/cuda-full.yaml" -q --out "$tmp/rf.json" > /dev/null 2> "$tmp/err.txt"
check run-full-sender-cuda-unused 0 $?
# Receivers alone on cuda (the sender on the host): the receivers' key is named.
sed 's/^sender: {device: cuda}/sender: {device: host}/' "$tmp/cuda.yaml" > "$tmp/cuda-rx.yaml"
"$dcr" run "$tmp/cuda-rx.yaml" -q > /dev/null 2> "$tmp/err.txt"; check run-cuda-rx-refused 15 $?
has run-cuda-rx-names-receivers "$tmp/err.txt" "receivers.device of receiver 1 (device cuda:0)"
has run-cuda-rx-names-cuda "$tmp/err.txt" "CUDA"
[ ! -e "$tmp/work-cuda" ]; check run-cuda-rx-no-work-dir 0 $?

# dcr node, multi-host form and plan form: refused at start, exit 15, naming CUDA.
port=$(( 20000 + RANDOM % 12000 ))
sed -i "s|^network:|network:\n  tls: false\n  hosts: [\"127.0.0.1:$port\", \"127.0.0.1:$((port + 1))\", \"127.0.0.1:$((port + 2))\", \"127.0.0.1:$((port + 3))\"]|" "$tmp/cuda-rx.yaml"
LOCAL_RANK=0 timeout 60 "$dcr" node "$tmp/cuda-rx.yaml" --rank 2 --base "$s0" --target "$s1" \
  > "$tmp/node.out" 2> "$tmp/node.err"
check node-cuda-refused 15 $?
has node-cuda-names-cuda "$tmp/node.err" "CUDA"
has node-cuda-names-receiver "$tmp/node.err" "receiver 2 (device cuda:0)"
# The launcher's local rank picks the device: receivers.devices[local % size], else device local;
# without one, the receiver's index among its host's receivers (rank 2 is the second of host 0).
env -u LOCAL_RANK SLURM_LOCALID=5 timeout 60 "$dcr" node "$tmp/cuda-rx.yaml" --rank 1 --base "$s0" --target "$s1" \
  > /dev/null 2> "$tmp/node.err"
check node-cuda-local-rank-list-refused 15 $?
has node-cuda-local-rank-list "$tmp/node.err" "receiver 1 (device cuda:0)"
sed 's/, devices: \[0\]//' "$tmp/cuda-rx.yaml" > "$tmp/cuda-local.yaml"
LOCAL_RANK=3 timeout 60 "$dcr" node "$tmp/cuda-local.yaml" --rank 1 --base "$s0" --target "$s1" \
  > /dev/null 2> "$tmp/node.err"
check node-cuda-local-rank-refused 15 $?
has node-cuda-local-rank-device "$tmp/node.err" "receiver 1 (device cuda:3)"
env -u LOCAL_RANK -u SLURM_LOCALID -u OMPI_COMM_WORLD_LOCAL_RANK \
  timeout 60 "$dcr" node "$tmp/cuda-local.yaml" --rank 2 --base "$s0" --target "$s1" \
  > /dev/null 2> "$tmp/node.err"
check node-cuda-host-index-refused 15 $?
has node-cuda-host-index-device "$tmp/node.err" "receiver 2 (device cuda:1)"
python3 - "$tmp/work/run-1/plan-1.json" "$tmp/plan-cuda.json" <<'PY'; check make-cuda-plan 0 $?
import json, sys
p = json.load(open(sys.argv[1])); p["device"] = "cuda"; p["device_index"] = 0
json.dump(p, open(sys.argv[2], "w"))
PY
timeout 60 "$dcr" node --plan "$tmp/plan-cuda.json" > /dev/null 2> "$tmp/node.err"
check node-plan-cuda-refused 15 $?
has node-plan-cuda-names-cuda "$tmp/node.err" "CUDA"
exit $fail
