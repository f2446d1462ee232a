#!/usr/bin/env bash
# An edge relay through the shipped binaries: a `dcr run` with delta.wan_context whose long-link
# child (node 1, transport.relay_tree.edge_relays) holds the canonical base, takes the
# context-coded delta over the emulated long link and forwards the plain encoding to cpu
# receivers and a host-device receiver (receivers.node_devices), every receiver byte-for-byte
# equal to the target; the long link carries exactly the context form (the size of `dcr diff
# --wan-context`), the subtree exactly the plain records (`dcr diff`) between the context delta's
# header and trailer, which the edge relay forwards as they are (version 8: compact). Then the edge relay is killed
# (SIGKILL, a process fault run): its subtree falls back to the in-region store, which holds the
# plain form only, and every receiver still ends bit-exact. Without an edge relay a device
# receiver in a wan_context run is refused at the start, naming the key. Signed, both runs verify.
# An edge relay that lags (stopped with SIGSTOP for 3 s, well inside its read deadline) makes the
# sender send the plain form of every chunk it had not started on that edge once the bytes it has
# not acknowledged pass relay_tree.edge_lag; a relay that keeps up (the first run) is never
# switched; one stopped for a shorter while is switched back to the context form once it has
# caught up. An object-store run with wan_context stores the context form (what crossed the long
# link): its downloaders hold the base and decode it, bit-exact; a downloader on another device is
# refused at the start, naming the key (no in-region re-publisher writes a plain copy); with
# delta.context_classes it stores the delta `dcr diff --context-classes` writes.
# The encoding is chosen when the run is planned (ChooseWanEncoding): on the 10 Mbit/s link of
# these runs the edge relay's 2 transcoding threads keep up many times over (the context form);
# on a 10 Gbit/s link they would lag by far, and the long link carries the plain form to an
# ordinary relay.
source "$(dirname "$0")/cli_lib.sh" "$@"
# relayed PLAIN CTX: the bytes an edge relay's subtree receives, the plain delta's records between
# the context delta's header and trailer.
relayed() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
def outside(path):
    d = open(path, "rb").read()
    t = struct.unpack_from("<Q", d, len(d) - 24)[0]
    h = min(d.find(m) % len(d) for m in (b"DCRC", b"DCRX", b"DCRM"))
    return len(d), h + len(d) - t
(p, po), (c, co) = outside(sys.argv[1]), outside(sys.argv[2])
print(p - po + co)
PY
}
# pause_edge WORK SECONDS: stops the edge relay (node 1) with SIGSTOP as soon as it is ready and
# continues it SECONDS later; prints its pid. Its pid is found before it is ready and the ready file
# is polled every 5 ms, so the stop comes within a few milliseconds of the stream's start, long
# before the relay could have acknowledged what the sender hands the long link in its first burst.
pause_edge() {
  local pid="" _
  for _ in $(seq 3000); do
    pid=$(pgrep -f -- "--plan $1/run-1/plan-1.json" | head -1)
    [ -n "$pid" ] && break
    sleep 0.01
  done
  [ -n "$pid" ] || return 1
  wait_for "$1/run-1/ready-1" 30 5
  kill -STOP "$pid"; sleep "$2"; kill -CONT "$pid"
  echo "$pid"
}
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
  long_link: {bandwidth: ${LINK:-10Mbit/s}, latency: 5ms}
  signing: ${SIGN:-false}
${READ_DEADLINE:+  read_deadline: $READ_DEADLINE}
timeout: 120s
${4:-}
YAML
}
"$dcr" diff "$s0" "$s1" --chunk-elems 16384 -o "$tmp/plain.dcr" -q; check diff-plain 0 $?
"$dcr" diff --wan-context "$s0" "$s1" --chunk-elems 16384 -o "$tmp/ctx.dcr" -q; check diff-context 0 $?

scenario "$tmp/edge.yaml" "$tmp/work" ", edge_relays: [1]"
"$dcr" run "$tmp/edge.yaml" --out "$tmp/r.json" -q > /dev/null 2> "$tmp/err.txt"; check run-edge 0 $?
python3 - "$tmp/r.json" "$tmp/work/run-1" "$(stat -c %s "$tmp/ctx.dcr")" "$(stat -c %s "$tmp/plain.dcr")" \
  "$(relayed "$tmp/plain.dcr" "$tmp/ctx.dcr")" <<'PY'; check run-edge-result 0 $?
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]; ctx, plain = int(sys.argv[3]), int(sys.argv[4])
sub = int(sys.argv[5])
assert ctx < sub < plain, (ctx, sub, plain)
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
# Below the edge relay: the plain records of `dcr diff` in the context delta's header and trailer,
# to each of its 3 children.
for k in (2, 3, 4):
    assert nodes[k]["bytes_received"] == sub, (k, nodes[k]["bytes_received"], sub)
assert nodes[1]["bytes_sent"] == 3 * sub, nodes[1]["bytes_sent"]
e = nodes[1]["edge"]
assert e["chunks"] > 0 and e["context_bytes"] < e["plain_bytes"] and e["cpu_seconds"] > 0, e
assert "edge" not in nodes[2], nodes[2]
assert "edge_switches" not in nodes[0], nodes[0]["edge_switches"]
assert "it keeps up, the long link carries the context form" in j["setup"]["wan_encoding.run-1"], j["setup"]
PY
lacks run-edge-no-error "$tmp/err.txt" "failed"

# A long link the edge relay cannot keep up with: planned plain, the edge relay an ordinary relay.
LINK=10Gbit/s scenario "$tmp/fast.yaml" "$tmp/work-fast" ", edge_relays: [1]"
"$dcr" run "$tmp/fast.yaml" --out "$tmp/f.json" -q > /dev/null 2> "$tmp/ferr.txt"; check run-edge-fast-link 0 $?
python3 - "$tmp/f.json" "$tmp/work-fast/run-1" "$(stat -c %s "$tmp/plain.dcr")" <<'PY'; check run-edge-fast-link-result 0 $?
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]; plain = int(sys.argv[3])
why = j["setup"]["wan_encoding.run-1"]
assert "it would lag, the long link carries the plain form" in why, why
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == 4, r
nodes = [json.load(open("%s/node-%d.json" % (d, k))) for k in range(5)]
plans = [json.load(open("%s/plan-%d.json" % (d, k))) for k in range(5)]
assert all(not p.get("edge_relays") and not p["context_coding"] for p in plans), plans[0]
assert nodes[0]["bytes_sent"] == plain == r["payload_bytes"], (nodes[0]["bytes_sent"], plain)
assert "edge" not in nodes[1], nodes[1]
for k in (2, 3, 4):
    assert nodes[k]["bytes_received"] == plain and nodes[k]["verified"], k
PY

# The edge relay lags: stopped once it is ready, continued 3 s later. A 2 Mbit/s link keeps the
# context delta on the wire for most of a second, so the stop comes while the stream flows.
# Its lag bound is the default, 4 x window x streams = 64 KiB here; the sender hands the link
# more than that long before the relay is continued: every chunk it had not started on the edge
# then goes in the plain form, which the edge relay forwards unchanged.
READ_DEADLINE=30s LINK=2Mbit/s scenario "$tmp/lag.yaml" "$tmp/work-lag" ", edge_relays: [1], window: 16KiB"
"$dcr" run "$tmp/lag.yaml" --out "$tmp/l.json" -q > /dev/null 2> "$tmp/lerr.txt" &
run_pid=$!
edge_pid=$(pause_edge "$tmp/work-lag" 3)
wait $run_pid; check run-edge-lag 0 $?
[ -n "$edge_pid" ]; check run-edge-lag-stopped 0 $?
python3 - "$tmp/l.json" "$tmp/work-lag/run-1" "$(stat -c %s "$tmp/ctx.dcr")" "$(stat -c %s "$tmp/plain.dcr")" \
  "$(relayed "$tmp/plain.dcr" "$tmp/ctx.dcr")" <<'PY'; check run-edge-lag-result 0 $?
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]; ctx, plain = int(sys.argv[3]), int(sys.argv[4])
sub = int(sys.argv[5])
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == 4, r
nodes = [json.load(open("%s/node-%d.json" % (d, k))) for k in range(5)]
assert json.load(open(d + "/plan-0.json"))["edge_lag_bytes"] == 4 * 16384
sw = nodes[0]["edge_switches"]
assert len(sw) == 1 and sw[0]["child"] == 1 and sw[0]["lag_bytes"] > 4 * 16384, sw
assert sw[0]["plain_chunks"] > 0, sw
# The long link carried the context form of what was started before the switch and the plain
# form of the rest: more than the context delta, less than the plain one.
assert ctx < nodes[0]["bytes_sent"] < plain, (ctx, nodes[0]["bytes_sent"], plain)
assert nodes[1]["bytes_received"] == nodes[0]["bytes_sent"], (nodes[1]["bytes_received"], nodes[0]["bytes_sent"])
# The edge relay transcoded only the chunks that came context-coded; its subtree got the plain form.
e = nodes[1]["edge"]
assert 0 < e["chunks"] and e["context_bytes"] + (sub - e["plain_bytes"]) == nodes[0]["bytes_sent"], (e, nodes[0]["bytes_sent"])
for k in (2, 3, 4):
    assert nodes[k]["bytes_received"] == sub, (k, nodes[k]["bytes_received"], sub)
    assert nodes[k]["verified"], k
PY
has run-edge-lag-says-why "$tmp/work-lag/run-1/node-0.log" "edge relay node 1 lags"

# The edge relay lags and catches up: a 25% step (a 0.6 MB context delta, 2.6 s on the 2 Mbit/s
# link), the relay stopped for 1 s from the start. It is switched to the plain form while stopped;
# continued, it transcodes its backlog and acknowledges it, and once its unacknowledged bytes are
# down to half the bound the chunks not started on its edge go context-coded again.
"$dcr" synth --preset tiny --rate 25% --steps 2 --out "$tmp/ck25" >/dev/null 2>&1; check synth-25 0 $?
"$dcr" diff "$tmp/ck25/step0.safetensors" "$tmp/ck25/step1.safetensors" --chunk-elems 16384 -o "$tmp/plain25.dcr" -q; check diff-plain-25 0 $?
"$dcr" diff --wan-context "$tmp/ck25/step0.safetensors" "$tmp/ck25/step1.safetensors" --chunk-elems 16384 -o "$tmp/ctx25.dcr" -q; check diff-context-25 0 $?
READ_DEADLINE=30s LINK=2Mbit/s scenario "$tmp/back.yaml" "$tmp/work-back" ", edge_relays: [1], window: 16KiB"
sed -i "s|checkpoints: \[$s0, $s1\]|checkpoints: [$tmp/ck25/step0.safetensors, $tmp/ck25/step1.safetensors]|" "$tmp/back.yaml"
"$dcr" run "$tmp/back.yaml" --out "$tmp/b.json" -q > /dev/null 2> "$tmp/berr.txt" &
run_pid=$!
edge_pid=$(pause_edge "$tmp/work-back" 1)
wait $run_pid; check run-edge-back 0 $?
[ -n "$edge_pid" ]; check run-edge-back-stopped 0 $?
python3 - "$tmp/b.json" "$tmp/work-back/run-1" "$(stat -c %s "$tmp/ctx25.dcr")" "$(stat -c %s "$tmp/plain25.dcr")" \
  "$(relayed "$tmp/plain25.dcr" "$tmp/ctx25.dcr")" <<'PY'; check run-edge-back-result 0 $?
import json, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]; ctx, plain = int(sys.argv[3]), int(sys.argv[4])
sub = int(sys.argv[5])
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == 4, r
nodes = [json.load(open("%s/node-%d.json" % (d, k))) for k in range(5)]
sw = nodes[0]["edge_switches"]
assert sw and sw[0]["child"] == 1 and sw[0]["lag_bytes"] > 4 * 16384 and sw[0]["plain_chunks"] > 0, sw
# Caught up: at most half the bound unacknowledged, and chunks it was to get plain went back.
assert "resume_bytes" in sw[0] and sw[0]["resume_bytes"] <= 2 * 16384, sw
assert sw[0]["context_chunks"] > 0, sw
assert ctx < nodes[0]["bytes_sent"] < plain, (ctx, nodes[0]["bytes_sent"], plain)
e = nodes[1]["edge"]
assert e["context_bytes"] + (sub - e["plain_bytes"]) == nodes[0]["bytes_sent"], (e, nodes[0]["bytes_sent"])
for k in (2, 3, 4):
    assert nodes[k]["bytes_received"] == sub and nodes[k]["verified"], k
PY
has run-edge-back-says-why "$tmp/work-back/run-1/node-0.log" "edge relay node 1 caught up"

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
# The in-region store holds only plain chunk records: "DCRC" with position mode byte 16 never 3
# or 4 (context), and no compact context record ("DCRX").
chunks = glob.glob(sys.argv[2] + "/run-*/region-store/**/*.chk", recursive=True)
assert chunks, "no chunk in the region store"
for c in chunks:
    b = open(c, "rb").read()
    assert len(b) > 16 and b[:4] == b"DCRC" and b[16] not in (3, 4), c
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

# Two steps with the same long-lived nodes: the edge relay transcodes each version against the
# checkpoint it committed of the one before; each step's long link carries that step's context
# delta, the subtree its plain records (in that header and trailer), every receiver bit-exact at both steps.
"$dcr" synth --preset tiny --rate 3% --steps 3 --out "$tmp/ck3" >/dev/null 2>&1; check synth-3 0 $?
t0="$tmp/ck3/step0.safetensors"; t1="$tmp/ck3/step1.safetensors"; t2="$tmp/ck3/step2.safetensors"
for k in 1 2; do
  a="$tmp/ck3/step$((k - 1)).safetensors"; b="$tmp/ck3/step$k.safetensors"
  "$dcr" diff "$a" "$b" --chunk-elems 16384 -o "$tmp/plain$k.dcr" -q; check diff-plain-$k 0 $?
  "$dcr" diff --wan-context "$a" "$b" --chunk-elems 16384 -o "$tmp/ctx$k.dcr" -q; check diff-context-$k 0 $?
  relayed "$tmp/plain$k.dcr" "$tmp/ctx$k.dcr" > "$tmp/relayed$k"
done
scenario "$tmp/steps.yaml" "$tmp/work-steps" ", edge_relays: [1]" "steps: 2"
sed -i "s|checkpoints: \[$s0, $s1\]|checkpoints: [$t0, $t1, $t2]|" "$tmp/steps.yaml"
"$dcr" run "$tmp/steps.yaml" --out "$tmp/st.json" -q > /dev/null 2> "$tmp/sterr.txt"; check run-edge-steps 0 $?
python3 - "$tmp/st.json" "$tmp/work-steps" "$tmp" <<'PY'; check run-edge-steps-result 0 $?
import glob, json, os, sys
j = json.load(open(sys.argv[1])); t = sys.argv[3]
runs = j["runs"]
assert [r["step"] for r in runs] == [1, 2], [r["step"] for r in runs]
(d,) = glob.glob(os.path.join(sys.argv[2], "run-*"))
for r in runs:
    k = r["step"]
    ctx, plain = os.path.getsize("%s/ctx%d.dcr" % (t, k)), os.path.getsize("%s/plain%d.dcr" % (t, k))
    sub = int(open("%s/relayed%d" % (t, k)).read())
    assert r.get("error", "") == "" and r["receivers_verified"] == 4, r
    nodes = [json.load(open("%s/node-%d-v%d.json" % (d, n, k))) for n in range(5)]
    assert nodes[0]["bytes_sent"] == ctx < plain, (k, nodes[0]["bytes_sent"], ctx, plain)
    assert nodes[1]["edge"]["chunks"] > 0, (k, nodes[1].get("edge"))
    for n in (2, 3, 4):
        assert nodes[n]["bytes_received"] == sub and nodes[n]["verified"], (k, n, nodes[n]["bytes_received"], sub)
    assert len({nodes[n]["pid"] for n in range(5)}) == 5
PY

# The same two steps, killed (a process fault run of the long-lived nodes; seed 16 plans leaf 3
# killed between chunks in version 1 and the edge relay killed mid-stream in version 2): the
# restarted edge relay takes version 2 from the in-region store, which holds the plain form, and
# every receiver ends bit-exact at both steps.
scenario "$tmp/steps-kill.yaml" "$tmp/work-steps-kill" ", edge_relays: [1]" \
  "steps: 2
faults: {runs: 0, process_runs: 1, process_kills: 3, seed: 16, only: true}"
sed -i "s|checkpoints: \[$s0, $s1\]|checkpoints: [$t0, $t1, $t2]|" "$tmp/steps-kill.yaml"
"$dcr" run "$tmp/steps-kill.yaml" --out "$tmp/stk.json" -q > /dev/null 2> "$tmp/stkerr.txt"; check run-edge-steps-killed 0 $?
python3 - "$tmp/stk.json" <<'PY'; check run-edge-steps-killed-result 0 $?
import json, sys
j = json.load(open(sys.argv[1]))
runs = j["runs"]
assert [r["step"] for r in runs] == [1, 2], [r["step"] for r in runs]
for r in runs:
    assert r.get("error", "") == "" and r["receivers_verified"] == r["receivers"] == 4, r
assert any(x.startswith("node 3:") for x in runs[0]["restarts"]), runs[0]["restarts"]
assert any(x.startswith("node 1:") and x.endswith("in version 2") for x in runs[1]["restarts"]), runs[1]["restarts"]
f = j["faults"]
assert f["faults_survived"] == f["faults_injected"] == 2, f
assert f["receivers_verified"] == f["receivers"] == 8, f
PY

# Object store: the uploader puts the context-coded delta, cpu downloaders decode it.
store_scenario() {  # store_scenario FILE WORK_DIR [DEVICES]
  cat > "$1" <<YAML
name: cli-edge-store
mode: real
model:
  checkpoints: [$s0, $s1]
  work_dir: $2
methods: [delta]
delta: {wan_context: true, chunk_elems: 16384${CLASSES:+, context_classes: $CLASSES}}
transport: {kinds: [object_store], object_store: {kind: dir, path: $2/store}}
receivers: {count: 2${3:-}}
network: {tls: false, signing: false}
timeout: 120s
YAML
}
store_scenario "$tmp/store.yaml" "$tmp/work-store"
"$dcr" run "$tmp/store.yaml" --out "$tmp/o.json" -q > /dev/null 2> "$tmp/oerr.txt"; check run-store-context 0 $?
python3 - "$tmp/o.json" "$tmp/work-store/store" "$(stat -c %s "$tmp/ctx.dcr")" <<'PY'; check run-store-context-result 0 $?
import glob, json, sys
j = json.load(open(sys.argv[1])); ctx = int(sys.argv[3])
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == r["receivers"] == 2, r
assert r["payload_bytes"] == ctx, (r["payload_bytes"], ctx)
chunks = glob.glob(sys.argv[2] + "/**/*.chk", recursive=True)
assert chunks and any(open(c, "rb").read()[:4] == b"DCRX" for c in chunks), "no context-coded record stored"
PY
store_scenario "$tmp/store-dev.yaml" "$tmp/work-store-dev" ", node_devices: {2: host}"
"$dcr" run "$tmp/store-dev.yaml" --out "$tmp/od.json" -q > /dev/null 2> "$tmp/oderr.txt"; check run-store-device-refused 11 $?
has run-store-device-names-key "$tmp/oderr.txt" "cannot decode context-coded chunks"
# delta.context_classes reaches the sender: the stored delta is the one `dcr diff --context-classes 3`
# writes, and its downloaders decode it bit-exact.
"$dcr" diff --wan-context --context-classes 3 "$s0" "$s1" --chunk-elems 16384 -o "$tmp/ctx3.dcr" -q
check diff-context-3 0 $?
CLASSES=3 store_scenario "$tmp/store3.yaml" "$tmp/work-store3"
"$dcr" run "$tmp/store3.yaml" --out "$tmp/o3.json" -q > /dev/null 2> "$tmp/o3err.txt"; check run-store-classes 0 $?
python3 - "$tmp/o3.json" "$tmp/work-store3/run-1" "$(stat -c %s "$tmp/ctx3.dcr")" "$(stat -c %s "$tmp/ctx.dcr")" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); ctx3, ctx = int(sys.argv[3]), int(sys.argv[4])
r = j["runs"][0]
assert r.get("error", "") == "" and r["receivers_verified"] == r["receivers"] == 2, r
assert r["payload_bytes"] == ctx3 != ctx, (r["payload_bytes"], ctx3, ctx)
assert json.load(open(sys.argv[2] + "/plan-0.json"))["context_classes"] == 3
PY
check run-store-classes-result 0 $?
exit $fail
