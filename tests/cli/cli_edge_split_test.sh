#!/usr/bin/env bash
# Edge relays split by chunk range through the shipped binaries: a `dcr run` with
# delta.wan_context and transport.relay_tree.edge_split whose edge relays 1 and 2 form a chain
# (sender -> 1 -> 2 -> the rest of the tree). Edge relay 1 takes the context-coded delta over the
# emulated long link and transcodes only the chunks of its range (plan edge_range_first/end,
# balanced by dense bytes), forwarding the rest context-coded; edge relay 2 transcodes its range,
# so its subtree -- cpu receivers and a host-device receiver -- gets exactly the plain records
# between the context delta's header and trailer, and every receiver is byte-for-byte equal to the
# target. The long link carries the context delta once. Signed and killed (a process fault run
# that kills an edge relay of the chain and a receiver), every receiver still ends bit-exact: the plain
# records, transcoded on either path, verify against the trainer's signed manifest. A
# chain that is not one, or a non-cpu edge relay, is refused at the start, naming the key.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"
scenario() {  # scenario FILE WORK_DIR TOPOLOGY EDGE_KEYS [DEVICES] [EXTRA]
  cat > "$1" <<YAML
name: cli-edge-split
mode: real
model:
  checkpoints: [$s0, $s1]
  work_dir: $2
methods: [delta]
delta: {wan_context: true, chunk_elems: 16384}
transport: {kinds: [relay_tree], relay_tree: {topology: [$3], chunk: 4KiB, $4}}
receivers: {count: 5, apply_threads: 2, node_devices: {${5:-5: host}}}
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 10Mbit/s, latency: 5ms}
  signing: ${SIGN:-false}
timeout: 120s
${6:-}
YAML
}
"$dcr" diff "$s0" "$s1" --chunk-elems 16384 -o "$tmp/plain.dcr" -q; check diff-plain 0 $?
"$dcr" diff --wan-context "$s0" "$s1" --chunk-elems 16384 -o "$tmp/ctx.dcr" -q; check diff-context 0 $?
# What the receivers below the chain get: the plain records between the context delta's header
# and trailer (as cli_edge_relay_test.sh computes it).
sub=$(python3 - "$tmp/plain.dcr" "$tmp/ctx.dcr" <<'PY'
import struct, sys
def outside(path):
    d = open(path, "rb").read()
    t = struct.unpack_from("<Q", d, len(d) - 24)[0]
    h = min(d.find(m) % len(d) for m in (b"DCRC", b"DCRX", b"DCRM"))
    return len(d), h + len(d) - t
(p, po), (c, co) = outside(sys.argv[1]), outside(sys.argv[2])
print(p - po + co)
PY
)
chain="-1, 0, 1, 2, 2, 3"   # sender -> 1 -> 2 -> {3, 4}, 3 -> 5

scenario "$tmp/split.yaml" "$tmp/work" "$chain" "edge_relays: [1, 2], edge_split: true"
"$dcr" run "$tmp/split.yaml" --out "$tmp/r.json" -q > /dev/null 2> "$tmp/err.txt"; check run-split 0 $?
python3 - "$tmp/r.json" "$tmp/work/run-1" "$(stat -c %s "$tmp/ctx.dcr")" "$(stat -c %s "$tmp/plain.dcr")" \
  "$sub" <<'PY'; check run-split-result 0 $?
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]
ctx, plain, sub = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers"] == 5 and r["receivers_verified"] == 5, r
for rec in r["receiver_results"]:
    assert rec["committed"] and rec["verified"], rec
    assert rec["verify_message"] == "byte-for-byte equal to the target", rec
nodes = [json.load(open("%s/node-%d.json" % (d, k))) for k in range(6)]
plans = [json.load(open("%s/plan-%d.json" % (d, k))) for k in range(6)]
# Two contiguous ranges covering the grid, one per edge relay; the other nodes have none.
a, b = plans[1], plans[2]
assert a["edge_range_first"] == 0 < a["edge_range_end"] == b["edge_range_first"] < b["edge_range_end"], (a, b)
assert all("edge_range_end" not in plans[k] for k in (0, 3, 4, 5))
# The store mirror is the last edge relay's (the first forwards context records of range 2).
assert plans[2].get("mirror_to_store") and not plans[1].get("mirror_to_store"), (plans[1], plans[2])
# The long link carries the context delta once; edge relay 1 forwards a stream between the two
# forms; below edge relay 2 every node gets the plain records.
assert nodes[0]["bytes_sent"] == ctx == r["payload_bytes"], (nodes[0]["bytes_sent"], ctx)
assert nodes[1]["bytes_received"] == ctx, nodes[1]["bytes_received"]
assert ctx < nodes[2]["bytes_received"] < sub, (ctx, nodes[2]["bytes_received"], sub)
for k in (3, 4, 5):
    assert nodes[k]["bytes_received"] == sub, (k, nodes[k]["bytes_received"], sub)
e1, e2 = nodes[1]["edge"], nodes[2]["edge"]
assert e1["chunks"] > 0 and e2["chunks"] > 0, (e1, e2)
# Together they transcode what one edge relay would: every context chunk once.
assert e1["plain_bytes"] - e1["context_bytes"] + e2["plain_bytes"] - e2["context_bytes"] == sub - ctx, (e1, e2, sub, ctx)
assert "edge" not in nodes[3], nodes[3]
PY

# Signed, killed mid-stream (a process fault run; seed 4 kills receiver 3 and edge relay 2): the
# region falls back to its store, bit-exact.
SIGN=true scenario "$tmp/kill.yaml" "$tmp/work-kill" "$chain" "edge_relays: [1, 2], edge_split: true" "5: host" \
  "faults: {runs: 0, process_runs: 1, process_kills: 3, seed: ${SEED:-4}, only: true}"
"$dcr" run "$tmp/kill.yaml" --out "$tmp/k.json" -q > /dev/null 2> "$tmp/kerr.txt"; check run-split-killed 0 $?
python3 - "$tmp/k.json" "$tmp/work-kill" <<'PY'; check run-split-killed-result 0 $?
import glob, json, sys
j = json.load(open(sys.argv[1]))
# The in-region store holds only plain chunk records (the last edge relay mirrors, the sender
# fills the rest in the plain form): no context-coded record ("DCRX", or "DCRC" with position
# mode 3 or 4); manifest records ("DCRM") as signed.
chunks = glob.glob(sys.argv[2] + "/run-*/region-store/**/*.chk", recursive=True)
assert chunks, "no chunk in the region store"
for c in chunks:
    b = open(c, "rb").read()
    if b[:4] == b"DCRM":
        continue  # a manifest record of the signed stream
    assert len(b) > 16 and b[:4] == b"DCRC" and b[16] not in (3, 4), c
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == r["receivers"] == 5, r
assert j["faults"]["faults_survived"] == j["faults"]["faults_injected"] >= 1, j["faults"]
killed = {x.split(":")[0] for x in r["restarts"]}
assert killed & {"node 1", "node 2"}, r["restarts"]  # an edge relay of the chain died
assert r["recovery"]["fallbacks"] >= 1, r["recovery"]
PY

# Refused at the start, naming the key: a chain listed out of order, a relay of the chain with a
# second child, a host-device edge relay, a split of one.
scenario "$tmp/bad1.yaml" "$tmp/w1" "$chain" "edge_relays: [2, 1], edge_split: true"
"$dcr" run "$tmp/bad1.yaml" --out "$tmp/b.json" -q > /dev/null 2> "$tmp/b1.txt"; check bad-chain 11 $?
has bad-chain-says "$tmp/b1.txt" "edge relay 2 must be a child of the sender"
scenario "$tmp/bad2.yaml" "$tmp/w2" "-1, 0, 1, 1, 2, 3" "edge_relays: [1, 2], edge_split: true"
"$dcr" run "$tmp/bad2.yaml" --out "$tmp/b.json" -q > /dev/null 2> "$tmp/b2.txt"; check bad-fork 11 $?
has bad-fork-says "$tmp/b2.txt" "edge relay 1 must have edge relay 2 as its only child"
scenario "$tmp/bad3.yaml" "$tmp/w3" "$chain" "edge_relays: [1, 2], edge_split: true" "2: host"
"$dcr" run "$tmp/bad3.yaml" --out "$tmp/b.json" -q > /dev/null 2> "$tmp/b3.txt"; check bad-device 11 $?
has bad-device-says "$tmp/b3.txt" "edge relay 2 on device host cannot apply"
scenario "$tmp/bad4.yaml" "$tmp/w4" "$chain" "edge_relays: [1], edge_split: true"
"$dcr" run "$tmp/bad4.yaml" --out "$tmp/b.json" -q > /dev/null 2> "$tmp/b4.txt"; check bad-one 11 $?
has bad-one-says "$tmp/b4.txt" "edge_split: needs at least 2 edge relays"
exit $fail
