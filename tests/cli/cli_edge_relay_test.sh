#!/usr/bin/env bash
# An edge relay through the shipped binaries: a `dcr run` with delta.wan_context whose long-link
# child (node 1, transport.relay_tree.edge_relays) holds the canonical base, takes the
# context-coded delta over the emulated long link and forwards the plain encoding to cpu
# receivers and a host-device receiver (receivers.node_devices), every receiver byte-for-byte
# equal to the target; the long link carries exactly the context form (the size of `dcr diff
# --wan-context`), the subtree exactly the plain one (`dcr diff`). Then the edge relay is killed
# (SIGKILL, a process fault run): its subtree falls back to the in-region store, which holds the
# plain form only, and every receiver still ends bit-exact. Without an edge relay a device
# receiver in a wan_context run is refused at the start, naming the key. Signed, both runs verify.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"
scenario() {  # scenario FILE WORK_DIR EDGE_KEY [EXTRA]
  cat > "$1" <<YAML
name: cli-edge
mode: real
model:
  checkpoints: [$s0, $s1]
  work_dir: $2
methods: [delta]
delta: {wan_context: true, chunk_elems: 16384}
transport: {kinds: [relay_tree], relay_tree: {fan_out: 3, root_fan_out: 1, chunk: 4KiB$3}}
receivers: {count: 4, apply_threads: 2, node_devices: {4: host}}
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 200Mbit/s, latency: 5ms}
  signing: ${SIGN:-false}
timeout: 120s
${4:-}
YAML
}
"$dcr" diff "$s0" "$s1" --chunk-elems 16384 -o "$tmp/plain.dcr" -q; check diff-plain 0 $?
"$dcr" diff --wan-context "$s0" "$s1" --chunk-elems 16384 -o "$tmp/ctx.dcr" -q; check diff-context 0 $?

scenario "$tmp/edge.yaml" "$tmp/work" ", edge_relays: [1]"
"$dcr" run "$tmp/edge.yaml" --out "$tmp/r.json" -q > /dev/null 2> "$tmp/err.txt"; check run-edge 0 $?
python3 - "$tmp/r.json" "$tmp/work/run-1" "$(stat -c %s "$tmp/ctx.dcr")" "$(stat -c %s "$tmp/plain.dcr")" <<'PY'; check run-edge-result 0 $?
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]; ctx, plain = int(sys.argv[3]), int(sys.argv[4])
assert ctx < plain, (ctx, plain)
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers"] == 4 and r["receivers_verified"] == 4, r
for rec in r["receiver_results"]:
    assert rec["committed"] and rec["verified"], rec
    assert rec["verify_message"] == "byte-for-byte equal to the target", rec
nodes = [json.load(open("%s/node-%d.json" % (d, k))) for k in range(5)]
plans = [json.load(open("%s/plan-%d.json" % (d, k))) for k in range(5)]
assert all(p["edge_relays"] == [1] for p in plans), [p.get("edge_relays") for p in plans]
assert plans[4]["device"] == "host" and plans[2]["device"] == "cpu", (plans[4]["device"], plans[2]["device"])
# The long link: the context form, byte for byte the size of `dcr diff --wan-context` (its
# wire bytes add the frame headers).
assert nodes[0]["bytes_sent"] == ctx == r["payload_bytes"], (nodes[0]["bytes_sent"], ctx)
assert ctx <= nodes[0]["bytes_sent_long"] < plain, (nodes[0]["bytes_sent_long"], ctx, plain)
assert nodes[1]["bytes_received"] == ctx, nodes[1]["bytes_received"]
# Below the edge relay: the plain form, the size of `dcr diff`, to each of its 3 children.
for k in (2, 3, 4):
    assert nodes[k]["bytes_received"] == plain, (k, nodes[k]["bytes_received"], plain)
assert nodes[1]["bytes_sent"] == 3 * plain, nodes[1]["bytes_sent"]
e = nodes[1]["edge"]
assert e["chunks"] > 0 and e["context_bytes"] < e["plain_bytes"] and e["cpu_seconds"] > 0, e
assert "edge" not in nodes[2], nodes[2]
PY
lacks run-edge-no-error "$tmp/err.txt" "failed"

# The edge relay killed mid-stream (seed 4 plans one kill, of node 1 when it holds a chunk whole).
scenario "$tmp/kill.yaml" "$tmp/work-kill" ", edge_relays: [1]" \
  "faults: {runs: 0, process_runs: 1, process_kills: 3, seed: 4, only: true}"
"$dcr" run "$tmp/kill.yaml" --out "$tmp/k.json" -q > /dev/null 2> "$tmp/kerr.txt"; check run-edge-killed 0 $?
python3 - "$tmp/k.json" "$tmp/work-kill" <<'PY'; check run-edge-killed-result 0 $?
import glob, json, sys
j = json.load(open(sys.argv[1]))
r = j["runs"][0]
assert any(x.startswith("node 1:") for x in r["restarts"]), r["restarts"]
assert r.get("error", "") == "" and r["receivers_verified"] == r["receivers"] == 4, r
assert j["faults"]["faults_survived"] == j["faults"]["faults_injected"] >= 1, j["faults"]
assert r["recovery"]["fallbacks"] >= 1, r["recovery"]
# The in-region store holds only plain chunk records (position mode byte 16 is never 3, context).
chunks = glob.glob(sys.argv[2] + "/run-*/region-store/**/*.chk", recursive=True)
assert chunks, "no chunk in the region store"
for c in chunks:
    b = open(c, "rb").read()
    assert len(b) > 16 and b[16] != 3, c
PY

# No edge relay: the host-device receiver could not decode the context-coded chunks.
scenario "$tmp/none.yaml" "$tmp/work-none" ""
"$dcr" run "$tmp/none.yaml" --out "$tmp/n.json" -q > /dev/null 2> "$tmp/nerr.txt"; check run-no-edge-refused 11 $?
has run-no-edge-names-key "$tmp/nerr.txt" "transport.relay_tree.edge_relays"
# An edge relay that is not the sender's child is refused, naming it.
scenario "$tmp/deep.yaml" "$tmp/work-deep" ", edge_relays: [1, 2]"
"$dcr" run "$tmp/deep.yaml" --out "$tmp/d.json" -q > /dev/null 2> "$tmp/derr.txt"; check run-deep-edge-refused 11 $?
has run-deep-edge-names-node "$tmp/derr.txt" "node 2 is not a child of the sender"
# Signed (network.signing: true, a fresh key per run): the plain records the edge relay forwards
# verify against the signed manifest, which lists both forms' SHA-256; killed, the same.
SIGN=true scenario "$tmp/signed.yaml" "$tmp/work-signed" ", edge_relays: [1]"
"$dcr" run "$tmp/signed.yaml" --out "$tmp/s.json" -q > /dev/null 2> "$tmp/serr.txt"; check run-signed-edge 0 $?
SIGN=true scenario "$tmp/signed-kill.yaml" "$tmp/work-signed-kill" ", edge_relays: [1]" \
  "faults: {runs: 0, process_runs: 1, process_kills: 3, seed: 4, only: true}"
"$dcr" run "$tmp/signed-kill.yaml" --out "$tmp/sk.json" -q > /dev/null 2> "$tmp/skerr.txt"; check run-signed-edge-killed 0 $?
python3 - "$tmp/s.json" "$tmp/sk.json" "$tmp/work-signed/run-1" <<'PY'; check run-signed-edge-result 0 $?
import json, sys
s, k = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
r = s["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == 4, r
plans = [json.load(open("%s/plan-%d.json" % (sys.argv[3], n))) for n in range(5)]
assert plans[0]["signing_key"] and all(p["trust_key"] for p in plans[1:]), "not a signed run"
r = k["runs"][0]
assert any(x.startswith("node 1:") for x in r["restarts"]), r["restarts"]
assert r.get("error", "") == "" and r["receivers_verified"] == 4, r
PY
exit $fail
