#!/usr/bin/env bash
# Adversarial suite, the journaled receivers of long-lived nodes (`dcr node --state`: a
# JournaledReceiver over the version log, under the trust layer) against the real `dcr` and
# `dcr-node` binaries (core/docs/security.md "Signed versions"): each path by which bytes reach
# such a receiver's storage is fed a delta the trainer did not sign for it, and must refuse it
# with a clear error, commit nothing, keep its floor and stay under a memory bound (a durable
# receiver takes a refused version for a failed one: its recovery tries the version again, from
# its parent and the store, up to its limit of 12, then exits UNAVAILABLE (15) naming the refusal):
#   - the store (a long-lived object-store downloader) holding, at the version's prefix, an
#     unsigned delta, one signed with another key for the same deployment, and one signed with
#     the trainer's key for another deployment: each refused, no version recorded done, the
#     floor at 0, peak RSS under 256 MiB above the model;
#   - the relay tree (mutual TLS): a relay of the run holding its real certificate forwards the
#     sender's stream to a long-lived `--state` receiver with every chunk record altered: the
#     altered records are refused against the signed manifests; the receiver then either ends
#     with nothing committed (its floor at 0, not counted by the sender) or commits the genuine
#     version the sender put in the region store after the tree failed (verified byte for byte
#     against the target);
#   - the genuine version is then committed by the same downloader's state (the refusals left it
#     usable).
#   journaled_test.sh DCR    (dcr-node is found beside DCR)
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
dcr=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")
py=python3

"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
model_kib=$(( $(stat -c %s "$ck/step0.safetensors") / 1024 ))
"$dcr" keys -o "$tmp/K" 2>/dev/null; check keys 0 $?
D=$(cat "$tmp/K/deployment")
# Another key for the same deployment id, and the trainer's key for another deployment.
"$dcr" keys -o "$tmp/F" 2>/dev/null; check keys-foreign 0 $?
cp "$tmp/K/deployment" "$tmp/F/deployment"
"$dcr" keys -o "$tmp/B0" 2>/dev/null; check keys-B 0 $?
mkdir -m 700 "$tmp/B"; cp -p "$tmp/K/trainer.key" "$tmp/K/trainer.pub" "$tmp/B/"
cp "$tmp/B0/deployment" "$tmp/B/"
scenario() {  # scenario FILE SIGNING-LINE
  cat > "$1" <<YAML
name: adv-journaled
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {object_store: {kind: dir, path: $tmp/st}}
receivers: {count: 1}
network:
$2
timeout: 10s
YAML
}
scenario "$tmp/s.yaml" "  signing: {key: $tmp/K/trainer.key, trust: $tmp/K/trainer.pub}"
scenario "$tmp/unsigned.yaml" "  metrics_port: 0"
scenario "$tmp/foreign.yaml" "  signing: {key: $tmp/F/trainer.key, trust: $tmp/F/trainer.pub}"
scenario "$tmp/other.yaml" "  signing: {key: $tmp/B/trainer.key, trust: $tmp/B/trainer.pub}"
P="refit/deployment-$D/step-1"
state="$tmp/h1/state/deployment-$D"
mkdir -p "$tmp/h0" "$tmp/h1" "$tmp/up"
plant() {  # plant NAME SCENARIO: a one-refit uploader of SCENARIO puts v0 -> v1 at the prefix
  rm -rf "$tmp/st/$P"
  (cd "$tmp/up" && "$dcr" node "$2" --rank 0 --transport object_store --prefix "$P" \
    --base "$ck/step0.safetensors" --target "$ck/step1.safetensors" > /dev/null 2> "$tmp/up/$1.err")
  check "$1-planted" 0 $?
}
download() {  # download NAME EXPECTED_RC: the long-lived journaled downloader (rank 1, --state)
  (cd "$tmp/h1" && /usr/bin/time -o "$tmp/h1/$1.rss" -f %M "$dcr" node "$tmp/s.yaml" --rank 1 \
    --transport object_store --state "$tmp/h1/state" > "$tmp/h1/$1.json" 2> "$tmp/h1/$1.err")
  check "$1-exit" "$2" $?
  local rss; rss=$(tail -1 "$tmp/h1/$1.rss")
  [ "$rss" -lt $(( model_kib + 256 * 1024 )) ]; check "$1-rss-${rss}KiB-bounded" 0 $?
}
refused() {  # refused NAME MESSAGE: nothing committed, the floor kept at 0
  has "$1-says" "$tmp/h1/$1.err" "$2"
  [ ! -e "$state/v1/rank-1.done" ]; check "$1-nothing-done" 0 $?
  has "$1-floor-0" "$state/rank-1.floor" "version 0"
  lacks "$1-not-verified" "$tmp/h1/$1.json" '"verified": true'
}

echo "== the store: unsigned, foreign-key and foreign-deployment deltas at the version's prefix"
plant unsigned "$tmp/unsigned.yaml"
download unsigned 15
refused unsigned "not signed"
plant foreign "$tmp/foreign.yaml"
download foreign 15
refused foreign "signed by"
plant other "$tmp/other.yaml"
download other 15
refused other "is signed for run"

echo "== the genuine version, to the same journaled receiver's state"
rm -rf "$tmp/st/$P"
(cd "$tmp/h0" && "$dcr" node "$tmp/s.yaml" --rank 0 --transport object_store \
  --state "$tmp/h0/state" > /dev/null 2> "$tmp/h0/err"); check genuine-upload 0 $?
download genuine 0
[ -e "$state/v1/rank-1.done" ]; check genuine-done 0 $?
has genuine-floor-1 "$state/rank-1.floor" "version 1"

echo "== the relay tree: a relay of the run alters the chunks it forwards to a --state receiver"
port=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/tree.yaml" <<YAML
name: adv-journaled-tree
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {relay_tree: {fan_out: 1, root_fan_out: 1}, object_store: {kind: dir, path: $tmp/region}}
receivers: {count: 2, verify: true}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
timeout: 15s
YAML
"$dcr" keys "$tmp/tree.yaml" -o "$tmp/T" > /dev/null 2>&1; check keys-tree 0 $?
"$py" - "$tmp/tree.yaml" "$tmp/T" <<'PY'
import sys
p, k = sys.argv[1], sys.argv[2]
tls = "  tls: {ca: %s/ca.crt, cert: '%s/node-{rank}.crt', key: '%s/node-{rank}.key'}\n" % (k, k, k)
sign = "  signing: {key: %s/trainer.key, trust: %s/trainer.pub}\n" % (k, k)
s = open(p).read().replace("network:\n", "network:\n" + tls + sign)
open(p, "w").write(s)
PY
T=$(cat "$tmp/T/deployment")
mkdir -p "$tmp/t0" "$tmp/t2"
(cd "$tmp/t2" && exec /usr/bin/time -o "$tmp/t2/rss" -f %M "$dcr" node "$tmp/tree.yaml" --rank 2 \
  --state "$tmp/t2/state" > out.json 2> err) &
rx2=$!
"$py" "$(dirname "$0")/altering_relay.py" "127.0.0.1:$((port + 1))" "127.0.0.1:$((port + 2))" \
  --rank 1 --cert "$tmp/T/node-1.crt" --key "$tmp/T/node-1.key" --ca "$tmp/T/ca.crt" --for 30 \
  > "$tmp/alterer.txt" &
apid=$!
sleep 0.5
(cd "$tmp/t0" && exec timeout 60 "$dcr" node "$tmp/tree.yaml" --rank 0 --state "$tmp/t0/state" \
  > "$tmp/t0/out.json" 2> "$tmp/t0/err")
echo "     sender exit $?"
wait $rx2; rc2=$?
wait $apid
"$py" - "$tmp/alterer.txt" <<'PY'; check tree-relay-altered-pieces 0 $?
import re, sys
m = re.search(r"altered (\d+) pieces", open(sys.argv[1]).read())
assert m and int(m.group(1)) > 0, open(sys.argv[1]).read()
PY
if [ $rc2 = 0 ]; then
  # Recovered from the region store: the genuine version, byte for byte.
  has tree-recovered-genuine "$tmp/t2/state/deployment-$T/node-2-v1.json" '"verified": true'
else
  check tree-receiver-exit-15 15 $rc2
  has tree-receiver-says "$tmp/t2/err" "not the one its signed manifest lists"
  [ ! -e "$tmp/t2/state/deployment-$T/v1/rank-2.done" ]; check tree-nothing-done 0 $?
  has tree-floor-0 "$tmp/t2/state/deployment-$T/rank-2.floor" "version 0"
  lacks tree-sender-counted-none "$tmp/t0/out.json" '"receivers_committed": 1'
fi
rss=$(tail -1 "$tmp/t2/rss")
[ "$rss" -lt $(( model_kib + 256 * 1024 )) ]; check "tree-receiver-rss-${rss}KiB-bounded" 0 $?
exit $fail
