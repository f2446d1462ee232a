#!/usr/bin/env bash
# Mutual TLS on the relay tree, against the real binaries in the multi-host form (`dcr keys`, then
# `dcr node SCENARIO --rank R` per rank): while relay node 1 waits for its parent, peers that are
# not the run's sender connect to its port, claim rank 0 and stream a delta made with `dcr diff`
# toward weights of their choosing -- over plain TCP, over TLS without a certificate, with the
# sender certificate of another run, with a receiver certificate of this run (the wrong role).
# Each is dropped with its reason in the node's log, nothing of theirs is applied, node 1 keeps
# listening, and the real sender's refit then ends verified on every receiver. A control run
# without TLS shows the same plain peer taken as the parent.
source "$(dirname "$0")/cli_lib.sh" "$@"
peer="$(dirname "$0")/tls_peer.py"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/ck/step0.safetensors"; target="$tmp/ck/step1.safetensors"
# The attackers' delta: from the base toward the base with every byte of tensor data flipped.
python3 - "$base" "$tmp/evil.safetensors" <<'PY'; check forge 0 $?
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
open(sys.argv[2], "wb").write(b[:8 + n] + bytes(x ^ 0xff for x in b[8 + n:]))
PY
"$dcr" diff "$base" "$tmp/evil.safetensors" -o "$tmp/evil.dcr" >/dev/null 2>&1; check forged-delta 0 $?

port=$(( 20000 + RANDOM % 12000 ))
scenario() {  # scenario FILE [TLS-LINES]
  cat > "$1" <<YAML
name: tls
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1, streams: 1}
receivers: {count: 2}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
${2:-}
timeout: 60s
YAML
}
scenario "$tmp/plain.yaml"
"$dcr" node "$tmp/plain.yaml" --rank 1 --base "$base" --target "$target" >/dev/null 2>"$tmp/need-keys.err"
check multi-host-needs-keys 14 $?
has names-dcr-keys "$tmp/need-keys.err" "dcr keys SCENARIO -o DIR"

"$dcr" keys "$tmp/plain.yaml" -o "$tmp/keys" >"$tmp/keys.out" 2>"$tmp/keys.err"; check keys 0 $?
"$dcr" keys "$tmp/plain.yaml" -o "$tmp/other" >/dev/null 2>&1; check keys-other-run 0 $?
"$dcr" keys "$tmp/plain.yaml" -o "$tmp/keys" >/dev/null 2>"$tmp/again.err"; check keys-never-overwrite 14 $?
has keys-exist "$tmp/again.err" "exists"
# A directory holding part of a deployment (a CA, no deployment id) is refused before anything
# is written or announced: no deployment id appears, nothing is said to have been made.
mkdir -m 700 "$tmp/partial" && cp "$tmp/keys/ca.key" "$tmp/keys/ca.crt" "$tmp/partial/"
"$dcr" keys "$tmp/plain.yaml" -o "$tmp/partial" >/dev/null 2>"$tmp/partial.err"
check keys-partial-refused 14 $?
has keys-partial-names-it "$tmp/partial.err" "partial/ca.key exists"
[ "$(ls "$tmp/partial")" = "$(printf 'ca.crt\nca.key')" ]; check keys-partial-nothing-written 0 $?
if grep -q "^dcr keys: deployment" "$tmp/partial.err"; then check keys-partial-announces-nothing 0 1
else check keys-partial-announces-nothing 0 0; fi
has keys-prints-scenario "$tmp/keys.out" "node-{rank}.key"
for f in ca.key node-0.key node-1.key node-2.key; do
  [ "$(stat -c %a "$tmp/keys/$f")" = 600 ]; check "$f-0600" 0 $?
done
[ "$(stat -c %a "$tmp/keys")" = 700 ]; check keys-dir-0700 0 $?
openssl x509 -in "$tmp/keys/node-2.crt" -noout -ext subjectAltName > "$tmp/san.txt" 2>&1
has cert-names-role "$tmp/san.txt" "/receiver/2"

scenario "$tmp/s.yaml" "  tls: {ca: '$tmp/keys/ca.crt', cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}"
"$dcr" node "$tmp/s.yaml" --rank 2 --base "$base" --target "$target" >"$tmp/n2.out" 2>"$tmp/n2.err" &
p2=$!
"$dcr" node "$tmp/s.yaml" --rank 1 --base "$base" --target "$target" >"$tmp/n1.out" 2>"$tmp/n1.err" &
p1=$!
# Node 1 listens once it has connected to its child (node 2).
for _ in $(seq 100); do
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $((port + 1))), 0.2)" 2>/dev/null && break
  sleep 0.1
done
addr="127.0.0.1:$((port + 1))"
python3 "$peer" "$addr" --rank 0 --send "$tmp/evil.dcr" --plain > "$tmp/a-plain.txt"
python3 "$peer" "$addr" --rank 0 --send "$tmp/evil.dcr" > "$tmp/a-nocert.txt"
python3 "$peer" "$addr" --rank 0 --send "$tmp/evil.dcr" --cert "$tmp/other/node-0.crt" \
  --key "$tmp/other/node-0.key" > "$tmp/a-other-run.txt"
python3 "$peer" "$addr" --rank 0 --send "$tmp/evil.dcr" --cert "$tmp/keys/node-2.crt" \
  --key "$tmp/keys/node-2.key" --ca "$tmp/keys/ca.crt" > "$tmp/a-wrong-role.txt"
for a in plain nocert other-run wrong-role; do has "attack-$a-refused" "$tmp/a-$a.txt" "refused"; done
has log-plain "$tmp/n1.err" "dropped a connection: TLS handshake failed"
has log-nocert "$tmp/n1.err" "peer did not return a certificate"
has log-other-run "$tmp/n1.err" "certificate verify failed"
has log-wrong-role "$tmp/n1.err" "is a receiver (rank 2), which may not act as a parent"
# The real sender.
"$dcr" node "$tmp/s.yaml" --rank 0 --base "$base" --target "$target" >"$tmp/n0.out" 2>"$tmp/n0.err"
check sender 0 $?
wait $p1; check relay-verified 0 $?
wait $p2; check receiver-verified 0 $?
python3 - "$tmp/n0.out" "$tmp/n1.out" "$tmp/n2.out" <<'PY'; check results 0 $?
import json, sys
s, r1, r2 = (json.load(open(f)) for f in sys.argv[1:])
assert s["ok"] and s["receivers_committed"] == 2, s
for r in (r1, r2):
    assert r["ok"] and r["verified"], r
    assert r["verify_message"] == "byte-for-byte equal to the target", r
PY

# A node certificate used for another rank is refused by the node itself.
sed 's/node-{rank}/node-2/g' "$tmp/s.yaml" > "$tmp/wrong-rank.yaml"
"$dcr" node "$tmp/wrong-rank.yaml" --rank 1 --base "$base" --target "$target" >/dev/null 2>"$tmp/wr.err"
check own-cert-wrong-rank 14 $?
has own-cert-names-rank "$tmp/wr.err" "is for rank 2"

# Control: without TLS the same plain peer is taken as node 2's parent (and kills its refit).
scenario "$tmp/off.yaml" "  tls: false"
"$dcr" node "$tmp/off.yaml" --rank 2 --base "$base" --target "$target" >/dev/null 2>"$tmp/off.err" &
poff=$!
for _ in $(seq 100); do
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $((port + 2))), 0.2)" 2>/dev/null && break
  sleep 0.1
done
# Its first hello, of run 0, is dropped naming the node's run id; it then speaks for that run.
python3 "$peer" "127.0.0.1:$((port + 2))" --rank 1 --send "$tmp/evil.dcr" --plain > "$tmp/off-run0.out"
has control-other-run-dropped "$tmp/off.err" "dropped a connection: peer rank 1 is of run 0x0000000000000000, this node's run 0x"
run_id=$(grep -o "this node's run 0x[0-9a-f]*" "$tmp/off.err" | head -1 | sed 's/.* //')
python3 "$peer" "127.0.0.1:$((port + 2))" --rank 1 --send "$tmp/evil.dcr" --plain --run "$run_id" > "$tmp/off.out"
wait $poff
has control-plain-taken "$tmp/off.out" "sent"
lacks control-not-dropped "$tmp/off.err" "dropped a connection: TLS"
has control-fed-by-it "$tmp/off.err" "parent node 1"
exit $fail
