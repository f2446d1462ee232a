#!/usr/bin/env bash
# Adversarial suite, deployment identity and the side paths around the signed core, against the
# real `dcr` and `dcr-node` binaries (core/docs/security.md "Deployment identity", "Garbage
# collection"):
#   - GC trusts only signed versions: on a store a real long-lived signed run filled (versions
#     1-3), `dcr gc` without --trust is refused (nothing deleted); one empty planted
#     `gc-removing` object on the committed version and two planted fake versions (a parsable
#     header of versions 100 and 101 and a trailer each) and an unsigned full frame of version
#     102 (kFlagNoBase, as a holder's catch-up frame is) are listed as unsigned and never acted
#     on: the committed version stays, bit-exact for the receiver that holds it;
#   - cross-deployment replay: deployment A's signed delta left at the store prefix a receiver of
#     deployment B (the same trainer key, another `dcr keys` deployment id) reads is refused
#     (exit 14, nothing committed, no floor written), while A's own receiver commits it;
#   - floors: a receiver whose version floor names another deployment at version 5 starts fresh
#     and commits version 1 (the floor then names its own deployment); a floor of its own
#     deployment at version 5 still refuses version 1 (rollback);
#   - a node whose certificates and trust key are of two deployments, or whose trust key has no
#     deployment id, is refused at start;
#   - `dcr keys --renew` re-issues the node certificates under the same CA and deployment id, for
#     a tree grown by a host, and a refit over mutual TLS with them verifies on every receiver;
#   - a multi-step `dcr run` is signed: its sender signs (manifests in every version's stream),
#     each receiver keeps a version floor at the last version, and every receiver is verified.
#   ident_test.sh DCR    (dcr-node is found beside DCR)
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
dcr=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")
py=python3

"$dcr" synth --preset tiny --rate 3% --steps 4 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
"$dcr" keys -o "$tmp/A" 2>/dev/null; check keys-A 0 $?
[ -s "$tmp/A/deployment" ]; check keys-write-deployment 0 $?
grep -qE '^[0-9a-f]{16}$' "$tmp/A/deployment"; check deployment-16-hex 0 $?

echo "== dcr gc trusts only signed versions"
cat > "$tmp/gc.yaml" <<YAML
name: adv-gc
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors, $ck/step3.safetensors]}
transport: {object_store: {kind: dir, path: $tmp/st}}
receivers: {count: 1, verify: true}
network:
  signing: {key: $tmp/A/trainer.key, trust: $tmp/A/trainer.pub}
timeout: 30s
YAML
mkdir -p "$tmp/h0" "$tmp/h1"
(cd "$tmp/h1" && exec timeout 120 "$dcr" node "$tmp/gc.yaml" --rank 1 --transport object_store \
  --state "$tmp/h1/state" > out.json 2> err) &
rx=$!
(cd "$tmp/h0" && exec timeout 120 "$dcr" node "$tmp/gc.yaml" --rank 0 --transport object_store \
  --state "$tmp/h0/state" > out.json 2> err); check gc-run-sender 0 $?
wait $rx; check gc-run-receiver 0 $?
# A long-lived deployment's versions live under their own prefix in the store.
R="refit/deployment-$(cat "$tmp/A/deployment")"
for v in 1 2 3; do
  [ -e "$tmp/st/$R/step-$v/$(ls "$tmp/st/$R/step-$v" | grep trl)" ]; check "published-v$v" 0 $?
done
snapshot() { (cd "$tmp/st" && find . -type f | sort | xargs sha256sum) > "$1"; }
# Without the trainer's key a store of signed versions is refused before anything is deleted.
snapshot "$tmp/before0"
"$dcr" gc --store "dir:$tmp/st" --root "$R" --keep 1 > "$tmp/gc0.out" 2>&1; check gc-no-trust-refused 14 $?
has gc-no-trust-says "$tmp/gc0.out" "give the trainer's public key"
snapshot "$tmp/after0"; cmp -s "$tmp/before0" "$tmp/after0"; check gc-no-trust-nothing-deleted 0 $?
# An empty tombstone planted on the committed version 3.
: > "$tmp/st/$R/step-3/gc-removing"
"$dcr" gc --store "dir:$tmp/st" --root "$R" --keep 1 --trust "$tmp/A/trainer.pub" \
  --json "$tmp/gc1.json" > "$tmp/gc1.out" 2>&1; check gc-tombstone-exit 0 $?
"$py" - "$tmp/gc1.json" "$R" <<'PY'; check gc-tombstone-ignored 0 $?
import json, sys
r = json.load(open(sys.argv[1]))
v = {x["prefix"].replace(sys.argv[2], "R"): x for x in r["versions"]}
assert r["committed"] == 3, r
assert v["R/step-3"]["decision"] == "needed", v
assert "tombstone is unsigned: ignored" in v["R/step-3"]["why"], v
assert v["R/step-3"]["signed"] and v["R/step-1"]["signed"], v
assert v["R/step-1"]["decision"] == "removed" and v["R/step-2"]["decision"] == "removed", v
PY
ls "$tmp/st/$R/step-3" | grep -q trl; check gc-tombstone-committed-kept 0 $?
[ -z "$(find "$tmp/st/$R/step-1" "$tmp/st/$R/step-2" -type f 2>/dev/null)" ]; check gc-old-removed 0 $?
# Two fake versions (a parsable, unsigned header of versions 100 and 101 and a trailer each).
"$dcr" diff "$ck/step2.safetensors" "$ck/step3.safetensors" -o "$tmp/fake.dcr" \
  --base-version 99 --target-version 100 -q; check fake-diff 0 $?
"$py" - "$tmp/fake.dcr" "$tmp/st/$R" <<'PY'; check fakes-planted 0 $?
import os, struct, sys
b = open(sys.argv[1], "rb").read()
n = 48
(sections,) = struct.unpack_from("<I", b, n); n += 4
for _ in range(sections):
    kind, size = struct.unpack_from("<II", b, n); n += 8 + size
n += 16
for v in (100, 101):
    d = os.path.join(sys.argv[2], "step-%d" % v)
    os.makedirs(d)
    open(os.path.join(d, "0000000000.hdr"), "wb").write(b[:n])
    open(os.path.join(d, "0000000001.trl"), "wb").write(b"DCRT" + bytes(60))
PY
# An unsigned full frame of version 102 (kFlagNoBase; what a catch-up frame or a composed delta
# from a holder looks like, or a planted one): listed as unsigned and left in the store.
"$dcr" diff --full "$ck/step3.safetensors" -o "$tmp/frame.dcr" --target-version 102 -q
check frame-diff 0 $?
"$py" - "$tmp/frame.dcr" "$tmp/st/$R" <<'PY'; check frame-planted 0 $?
import os, struct, sys
b = open(sys.argv[1], "rb").read()
n = 48
(sections,) = struct.unpack_from("<I", b, n); n += 4
for _ in range(sections):
    kind, size = struct.unpack_from("<II", b, n); n += 8 + size
n += 16
d = os.path.join(sys.argv[2], "step-102")
os.makedirs(d)
open(os.path.join(d, "0000000000.hdr"), "wb").write(b[:n])
open(os.path.join(d, "0000000001.trl"), "wb").write(b"DCRT" + bytes(60))
PY
"$dcr" gc --store "dir:$tmp/st" --root "$R" --keep 1 --trust "$tmp/A/trainer.pub" \
  --json "$tmp/gc2.json" > "$tmp/gc2.out" 2>&1; check gc-fakes-exit 0 $?
"$py" - "$tmp/gc2.json" "$R" <<'PY'; check gc-fakes-ignored 0 $?
import json, sys
r = json.load(open(sys.argv[1]))
v = {x["prefix"].replace(sys.argv[2], "R"): x for x in r["versions"]}
assert r["committed"] == 3, r
assert v["R/step-3"]["decision"] == "needed", v
for f in ("R/step-100", "R/step-101", "R/step-102"):
    assert v[f]["decision"] == "unsigned" and "header is not signed" in v[f]["why"], v[f]
assert v["R/step-102"]["full_frame"] and not v["R/step-100"]["full_frame"], v["R/step-102"]
PY
has gc-fakes-named "$tmp/gc2.out" "unsigned  not a version the trainer signed"
ls "$tmp/st/$R/step-3" | grep -q trl; check gc-fakes-committed-kept 0 $?
[ -e "$tmp/st/$R/step-100/0000000000.hdr" ]; check gc-fakes-not-acted-on 0 $?
[ -e "$tmp/st/$R/step-102/0000000000.hdr" ]; check gc-unsigned-frame-left 0 $?
has gc-held-version-verified "$(ls -d "$tmp"/h1/state/deployment-*)/node-1-v3.json" '"verified": true'
"$dcr" export "$tmp/gc.yaml" --rank 1 --transport object_store --state "$tmp/h1/state" \
  -o "$tmp/held-v3.safetensors" > "$tmp/export.out" 2>&1; check gc-held-version-exported 0 $?
has gc-state-scoped "$tmp/export.out" "version 3 -> $tmp/held-v3.safetensors"
has gc-state-scoped-dir "$tmp/export.out" "/h1/state/deployment-"

echo "== cross-deployment replay: a signed delta of deployment A at deployment B's prefix"
# B: another deployment (its own id) of the same trainer key.
"$dcr" keys -o "$tmp/B0" 2>/dev/null; check keys-B 0 $?
mkdir -m 700 "$tmp/B"
cp -p "$tmp/A/trainer.key" "$tmp/A/trainer.pub" "$tmp/B/"; cp "$tmp/B0/deployment" "$tmp/B/"
! cmp -s "$tmp/A/deployment" "$tmp/B/deployment"; check deployments-differ 0 $?
one() {  # one FILE KEYDIR STORE: a one-receiver one-refit object-store scenario of KEYDIR's deployment
  cat > "$1" <<YAML
name: adv-replay
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {object_store: {kind: dir, path: $3}}
receivers: {count: 1}
network:
  signing: {key: $2/trainer.key, trust: $2/trainer.pub}
timeout: 10s
YAML
}
one "$tmp/rA.yaml" "$tmp/A" "$tmp/st-r"; one "$tmp/rB.yaml" "$tmp/B" "$tmp/st-r"
# Deployment A's version 1 (step 2's weights) is left in the store under refit/step-1.
(cd "$tmp" && "$dcr" node "$tmp/rA.yaml" --rank 0 --transport object_store \
  --base "$ck/step0.safetensors" --target "$ck/step2.safetensors" > /dev/null 2> "$tmp/upA.err")
check replay-upload-A 0 $?
download() {  # download NAME SCENARIO DIR TARGET EXPECTED_RC
  mkdir -p "$3"
  (cd "$3" && "$dcr" node "$2" --rank 1 --transport object_store --base "$ck/step0.safetensors" \
    --target "$4" > "$3/out.json" 2> "$3/err"); check "$1-exit" "$5" $?
}
download replay-B "$tmp/rB.yaml" "$tmp/rxB" "$ck/step1.safetensors" 14
has replay-B-says "$tmp/rxB/err" "is signed for run"
lacks replay-B-not-committed "$tmp/rxB/out.json" '"t_commit": 1'
[ ! -e "$tmp/rxB/version-floor-1" ]; check replay-B-no-floor 0 $?
download replay-A-own "$tmp/rA.yaml" "$tmp/rxA" "$ck/step2.safetensors" 0
has replay-A-own-verified "$tmp/rxA/out.json" '"verified": true'
has replay-A-floor-names-A "$tmp/rxA/version-floor-1" "deployment $(cat "$tmp/A/deployment")"

echo "== floors: another deployment's floor is a fresh start; the same deployment's still refuses"
# B publishes its own version 1 (step 1) at another store.
one "$tmp/fB.yaml" "$tmp/B" "$tmp/st-f"
(cd "$tmp" && "$dcr" node "$tmp/fB.yaml" --rank 0 --transport object_store \
  --base "$ck/step0.safetensors" --target "$ck/step1.safetensors" > /dev/null 2> "$tmp/upB.err")
check floor-upload-B 0 $?
mkdir -p "$tmp/rxF"
printf 'dcr-version-floor 2\ndeployment %s\nversion 5\ncommitted_unix 1\n' "$(cat "$tmp/A/deployment")" \
  > "$tmp/rxF/version-floor-1"
download floor-other-deployment "$tmp/fB.yaml" "$tmp/rxF" "$ck/step1.safetensors" 0
has floor-other-deployment-verified "$tmp/rxF/out.json" '"verified": true'
has floor-now-names-B "$tmp/rxF/version-floor-1" "deployment $(cat "$tmp/B/deployment")"
has floor-now-version-1 "$tmp/rxF/version-floor-1" "version 1"
mkdir -p "$tmp/rxS"
printf 'dcr-version-floor 2\ndeployment %s\nversion 5\ncommitted_unix 1\n' "$(cat "$tmp/B/deployment")" \
  > "$tmp/rxS/version-floor-1"
download floor-same-deployment "$tmp/fB.yaml" "$tmp/rxS" "$ck/step1.safetensors" 14
has floor-same-deployment-says "$tmp/rxS/err" "rollback refused"
has floor-same-deployment-kept "$tmp/rxS/version-floor-1" "version 5"

echo "== a node's deployment comes from its keys: none, or two mixed, is refused at start"
port=$(( 20000 + RANDOM % 12000 ))
tree() {  # tree FILE NETWORK-LINES: a two-rank relay tree scenario
  cat > "$1" <<YAML
name: adv-ident-tree
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {relay_tree: {fan_out: 1, root_fan_out: 1}}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
$2
timeout: 5s
YAML
}
tree "$tmp/shape.yaml" ""
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/C" >/dev/null 2>&1; check keys-C 0 $?
# The certificates of deployment C, the trust key and deployment of A: mixed.
tree "$tmp/mixed.yaml" "  tls: {ca: $tmp/C/ca.crt, cert: '$tmp/C/node-{rank}.crt', key: '$tmp/C/node-{rank}.key'}
  signing: {key: $tmp/A/trainer.key, trust: $tmp/A/trainer.pub}"
(cd "$tmp" && "$dcr" node "$tmp/mixed.yaml" --rank 1 --target "$ck/step1.safetensors" \
  > /dev/null 2> "$tmp/mixed.err"); check mixed-deployments-refused 14 $?
has mixed-deployments-says "$tmp/mixed.err" "the keys of two deployments are mixed"
# A trainer key pair without its deployment file (and no certificates): no deployment to sign.
mkdir -m 700 "$tmp/nodep"; cp -p "$tmp/A/trainer.key" "$tmp/A/trainer.pub" "$tmp/nodep/"
one "$tmp/nodep.yaml" "$tmp/nodep" "$tmp/st-nodep"
(cd "$tmp" && "$dcr" node "$tmp/nodep.yaml" --rank 1 --transport object_store \
  --target "$ck/step1.safetensors" > /dev/null 2> "$tmp/nodep.err"); check no-deployment-refused 14 $?
has no-deployment-says "$tmp/nodep.err" "no deployment id"

echo "== dcr keys --renew: new node certificates under the same CA and deployment, a host added"
cat > "$tmp/grown.yaml" <<YAML
name: adv-ident-grown
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {relay_tree: {fan_out: 1, root_fan_out: 1}}
receivers: {count: 2}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
  tls: {ca: $tmp/C/ca.crt, cert: '$tmp/C/node-{rank}.crt', key: '$tmp/C/node-{rank}.key'}
  signing: {key: $tmp/C/trainer.key, trust: $tmp/C/trainer.pub}
timeout: 20s
YAML
cp "$tmp/C/node-1.crt" "$tmp/node-1.old.crt"; cp "$tmp/C/ca.crt" "$tmp/ca.old.crt"
"$dcr" keys "$tmp/grown.yaml" -o "$tmp/C" --renew 2> "$tmp/renew.err"; check renew 0 $?
has renew-names-deployment "$tmp/renew.err" "deployment $(cat "$tmp/C/deployment")"
! cmp -s "$tmp/C/node-1.crt" "$tmp/node-1.old.crt"; check renew-new-certificate 0 $?
cmp -s "$tmp/C/ca.crt" "$tmp/ca.old.crt"; check renew-same-ca 0 $?
[ -e "$tmp/C/node-2.crt" ] && [ "$(stat -c %a "$tmp/C/node-2.key")" = 600 ]; check renew-added-host 0 $?
openssl x509 -in "$tmp/C/node-2.crt" -noout -text | grep -q "URI:dcr://$(cat "$tmp/C/deployment")/receiver/2"
check renew-same-deployment-in-san 0 $?
# A refit over mutual TLS with the renewed certificates, the added host among the receivers.
mkdir -p "$tmp/g1" "$tmp/g2"
for r in 2 1; do
  (cd "$tmp/g$r" && exec timeout 60 "$dcr" node "$tmp/grown.yaml" --rank "$r" \
    --base "$ck/step0.safetensors" --target "$ck/step1.safetensors" > out.json 2> err) &
done
(cd "$tmp" && timeout 60 "$dcr" node "$tmp/grown.yaml" --rank 0 --base "$ck/step0.safetensors" \
  --target "$ck/step1.safetensors" > "$tmp/g0.json" 2> "$tmp/g0.err"); check renewed-refit-sender 0 $?
wait
for r in 1 2; do has "renewed-refit-rank-$r-verified" "$tmp/g$r/out.json" '"verified": true'; done

echo "== a multi-step dcr run is signed"
cat > "$tmp/steps.yaml" <<YAML
name: adv-steps
mode: real
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors], work_dir: $tmp/work}
steps: 2
methods: [delta]
transport:
  kinds: [object_store]
  object_store: {kind: dir, path: $tmp/st-steps}
receivers: {count: 2, verify: true}
timeout: 60s
YAML
"$dcr" run "$tmp/steps.yaml" -o "$tmp/steps.json" > "$tmp/steps.out" 2>&1; check steps-run 0 $?
"$py" - "$tmp/steps.json" <<'PY'; check steps-verified 0 $?
import json, sys
r = json.load(open(sys.argv[1]))
runs = r["runs"]
assert len(runs) == 2 and all(x["receivers_verified"] == 2 for x in runs), runs
PY
# Every version's stream carries signed manifests (a DCRM record among its chunk objects).
for v in 1 2; do
  d=$(ls -d "$tmp"/st-steps/refit-*/step-$v | head -1)
  n=0; for f in "$d"/*.chk; do [ "$(head -c 4 "$f")" = DCRM ] && n=$((n + 1)); done
  [ "$n" -gt 0 ]; check "steps-v$v-signed-manifests" 0 $?
done
for r in 1 2; do
  f=$(ls "$tmp"/work/run-1/state/rank-$r.floor 2>/dev/null)
  [ -n "$f" ] && grep -q "version 2" "$f"; check "steps-rank-$r-floor-at-v2" 0 $?
done
exit $fail
