#!/usr/bin/env bash
# Adversarial suite, commitments: a base forged to the genuine additive content hash (Wagner's
# k-tree, dcr_collide) is not a signed version.
#   - dcr_collide zeroes 65,536 weights of the base (only weights the signed delta leaves
#     unchanged, so no chunk's base-change hash sees them) and adjusts 256 others until the
#     content hash is the genuine one; the forged base has that hash, and different bytes;
#   - `dcr apply --trust --verify` of the trainer's signed delta onto the genuine base commits and
#     prints "verified (commitment <prefix>)", the prefix of the root its final manifest signed;
#   - onto the forged base (the base hash and the target hash both match) it is refused (exit 14),
#     naming the first wrong range (tensor and bytes), with no output file; without --verify too;
#   - `dcr verify --trust PUB DELTA CHECKPOINT` says the same of the genuine and the forged target;
#   - a delta the trainer signed without a commitment root (the pinned golden v6_signed.dcr, whose
#     key is the seed 0..31 one): `dcr apply --trust` refuses it (exit 14), nothing written;
#   - a `dcr node` store downloader trusting the trainer's key, holding the forged base: the honest
#     signed upload is refused at commit (exit 14) naming the first wrong range, nothing committed,
#     no version floor written; holding the genuine base it commits.
#   - a restarted long-lived `dcr node --state` receiver (mutual TLS, signed versions) whose held
#     checkpoint was swapped for a forged one (same content hash) is refused before it serves or
#     reports it, naming the first wrong range; without its signed state it is refused too; with
#     the genuine checkpoint back it takes the next signed version;
#   - `dcr export` of that state writes the held version only when it has the signed root: the
#     genuine one is the target byte for byte; the forged one is refused (exit 14) naming the first
#     wrong range, and so is a state without its signed state (exit 12); nothing is written then.
#   commitment_test.sh DCR DCR_COLLIDE    (dcr-node is found beside DCR)
set -u
# Receivers hold their versions in a version log; the operator option below also makes each
# one's committed checkpoint file, which this test swaps for a forged one.
export DCR_NODE_COMMITTED_FILES=1
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
collide=$2

"$dcr" synth --preset tiny --rate 3% --steps 4 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/ck/step0.safetensors"; target="$tmp/ck/step1.safetensors"
"$dcr" keys -o "$tmp/keys" 2>/dev/null; check keys 0 $?
key="$tmp/keys/trainer.key"; pub="$tmp/keys/trainer.pub"
"$dcr" diff "$base" "$target" -o "$tmp/good.dcr" --sign "$key" -q; check diff-signed 0 $?

echo "== the collision"
"$collide" "$base" "$tmp/forged.safetensors" --tensor lm_head.weight --keep-unchanged "$target" \
  > "$tmp/collide.out"; check collide 0 $?
cat "$tmp/collide.out"
has collide-zeroed "$tmp/collide.out" "65536 weights zeroed, 256 adjusted"
has collide-same-hash "$tmp/collide.out" " == "
cmp -s "$base" "$tmp/forged.safetensors"; check forged-differs 1 $?

echo "== genuine base: committed, verified by the commitment"
"$dcr" apply "$base" "$tmp/good.dcr" -o "$tmp/out.st" --trust "$pub" --verify > "$tmp/ok.out" 2>/dev/null
check apply-genuine 0 $?
has apply-genuine-says "$tmp/ok.out" "verified (commitment "
"$dcr" verify "$tmp/out.st" "$target" >/dev/null; check genuine-output-is-target 0 $?

echo "== forged base: refused, naming the first wrong range"
for flags in "--verify" ""; do
  name=forged${flags:+-verify}
  rm -f "$tmp/out2.st"
  "$dcr" apply "$tmp/forged.safetensors" "$tmp/good.dcr" -o "$tmp/out2.st" --trust "$pub" $flags \
    -q 2>"$tmp/err"
  check "$name-exit-14" 14 $?
  has "$name-names-range" "$tmp/err" "first wrong range: tensor lm_head.weight bytes [0, 1048576)"
  has "$name-names-roots" "$tmp/err" "is not the signed"
  [ ! -e "$tmp/out2.st" ] && [ -z "$(ls "$tmp" | grep '^out2.st.tmp')" ]; check "$name-no-output" 0 $?
done


echo "== dcr verify --trust DELTA CHECKPOINT"
"$dcr" verify --trust "$pub" "$tmp/good.dcr" "$target" > "$tmp/v.out" 2>&1; check verify-target 0 $?
has verify-target-says "$tmp/v.out" "verified (commitment "
"$dcr" apply "$tmp/forged.safetensors" "$tmp/good.dcr" -o "$tmp/forged-target.st" -q 2>/dev/null
check unsigned-apply-of-forged-base 0 $?   # no signature, no commitment: the checksum agrees
"$dcr" verify --trust "$pub" "$tmp/good.dcr" "$tmp/forged-target.st" > "$tmp/v.out" 2>&1
check verify-forged-target-14 14 $?
has verify-forged-target-names-range "$tmp/v.out" "first wrong range: tensor lm_head.weight"

echo "== a signed delta without a commitment (the pinned v6_signed.dcr, key of seed 0..31, run 1)"
# The trainer's own signature, but no commitment root: nothing proves the output, so a receiver
# holding the trust key refuses it (exit 14, no output file).
python3 -c "
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization as s
k = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
open('$tmp/seed.pub', 'wb').write(k.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
"; check seed-pub 0 $?
golden="$(dirname "$0")/../golden"
"$dcr" apply "$golden/base.safetensors" "$golden/v6_signed.dcr" -o "$tmp/nocommit.st" \
  --trust "$tmp/seed.pub" --run-id 1 -q 2>"$tmp/err"; check no-commitment-exit-14 14 $?
has no-commitment-says "$tmp/err" "the signed delta carries no commitment of its target"
[ ! -e "$tmp/nocommit.st" ]; check no-commitment-no-output 0 $?

echo "== dcr node downloader holding the forged base"
dcr_abs=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")
cat > "$tmp/s.yaml" <<YAML
name: adv-commitment
model: {checkpoints: [$base, $target]}
transport: {object_store: {kind: dir, path: $tmp/store}}
receivers: {count: 1}
network:
  signing: {key: $key, trust: $pub}
timeout: 10s
YAML
(cd "$tmp" && "$dcr_abs" node "$tmp/s.yaml" --rank 0 --transport object_store --base "$base" \
  --target "$target" >/dev/null 2>"$tmp/up.err"); check upload 0 $?
mkdir -p "$tmp/rx-forged" "$tmp/rx-ok"
(cd "$tmp/rx-forged" && "$dcr_abs" node "$tmp/s.yaml" --rank 1 --transport object_store \
  --base "$tmp/forged.safetensors" --target "$target" >out.json 2>err); check node-forged-exit 14 $?
has node-forged-names-range "$tmp/rx-forged/err" "first wrong range: tensor lm_head.weight bytes [0, 1048576)"
lacks node-forged-not-committed "$tmp/rx-forged/out.json" '"t_commit": 1'
[ ! -e "$tmp/rx-forged/version-floor-1" ]; check node-forged-floor-not-written 0 $?
(cd "$tmp/rx-ok" && "$dcr_abs" node "$tmp/s.yaml" --rank 1 --transport object_store \
  --base "$base" --target "$target" >out.json 2>err); check node-genuine-exit 0 $?
has node-genuine-floor "$tmp/rx-ok/version-floor-1" "version 1"

echo "== a restarted dcr node --state whose held checkpoint was swapped"
ck="$tmp/ck"
port=$(( 20000 + RANDOM % 12000 ))
long() {  # long FILE NETWORK-LINES EXTRA-CHECKPOINTS: a two-host relay-tree scenario, versions 1..
  cat > "$1" <<YAML
name: held-state
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors$3]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1}
  object_store: {kind: dir, path: $tmp/region-store}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
$2
timeout: 30s
YAML
}
long "$tmp/shape.yaml" "" ""
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/run-keys" >/dev/null 2>&1; check run-keys 0 $?
net="  tls: {ca: $tmp/run-keys/ca.crt, cert: '$tmp/run-keys/node-{rank}.crt', key: '$tmp/run-keys/node-{rank}.key'}
  signing: {key: $tmp/run-keys/trainer.key, trust: $tmp/run-keys/trainer.pub}"
long "$tmp/l2.yaml" "$net" ""
long "$tmp/l3.yaml" "$net" ", $ck/step3.safetensors"
mkdir -p "$tmp/region-store" "$tmp/h0" "$tmp/h1"
state="$tmp/h1/state"
rx() {  # rx SCENARIO LOG: rank 1 of SCENARIO on $state
  (cd "$tmp/h1" && exec timeout 60 "$dcr_abs" node "$1" --rank 1 --state "$state") >"$2" 2>&1
}
tx() {  # tx SCENARIO LOG: rank 0 of SCENARIO on its state
  (cd "$tmp/h0" && exec timeout 60 "$dcr_abs" node "$1" --rank 0 --state "$tmp/h0/state") >"$2" 2>&1
}
rx "$tmp/l2.yaml" "$tmp/rx1.log" & pid=$!
tx "$tmp/l2.yaml" "$tmp/tx1.log"; check long-sender 0 $?
wait $pid; check long-receiver 0 $?
# The committed checkpoint of the version held, its signed state beside it, the floor (wherever
# the state's layout puts them).
held=$(find "$state" -name rank-1.committed.safetensors | head -1)
signed="$(dirname "$held")/rank-1.signed"
floor=$(find "$state" -name rank-1.floor | head -1)
[ -f "$held" ] && [ -f "$signed" ]; check long-signed-state-kept 0 $?
cp "$held" "$tmp/held.genuine"
export_held() {  # export_held OUT LOG: dcr export of rank 1's held version
  "$dcr_abs" export "$tmp/l2.yaml" --rank 1 --state "$state" -o "$1" >"$2" 2>&1
}
export_held "$tmp/export.st" "$tmp/export1.log"; check export-genuine 0 $?
has export-genuine-version "$tmp/export1.log" "EXPORTED: rank 1, version 2 "
cmp -s "$tmp/export.st" "$ck/step2.safetensors"; check export-genuine-is-target 0 $?
"$collide" "$tmp/held.genuine" "$held" --tensor lm_head.weight >/dev/null; check long-collide 0 $?
export_held "$tmp/export-forged.st" "$tmp/export2.log"; check export-forged-exit-14 14 $?
has export-forged-names-range "$tmp/export2.log" "first wrong range: tensor lm_head.weight bytes [0, 1048576)"
[ -e "$tmp/export-forged.st" ]; check export-forged-nothing-written 1 $?
ls -a "$tmp" | grep -q "export-forged.st.export-"; check export-forged-no-temporary 1 $?
rx "$tmp/l3.yaml" "$tmp/rx2.log"; check long-swapped-exit-14 14 $?
has long-swapped-names-range "$tmp/rx2.log" "first wrong range: tensor lm_head.weight bytes [0, 1048576)"
has long-swapped-before-serving "$tmp/rx2.log" "refused before it is served or reported"
has long-swapped-floor-kept "$floor" "version 2"
cp "$tmp/held.genuine" "$held"
mv "$signed" "$tmp/signed.kept"
export_held "$tmp/export-nostate.st" "$tmp/export3.log"; check export-no-signed-state-exit-12 12 $?
has export-no-signed-state-says "$tmp/export3.log" "its signed state"
[ -e "$tmp/export-nostate.st" ]; check export-no-signed-state-nothing-written 1 $?
rx "$tmp/l3.yaml" "$tmp/rx3.log"; check long-unsigned-state-refused 14 $?
has long-unsigned-state-says "$tmp/rx3.log" "cannot be proven by the trainer's signature"
mv "$tmp/signed.kept" "$signed"
rx "$tmp/l3.yaml" "$tmp/rx4.log" & pid=$!
tx "$tmp/l3.yaml" "$tmp/tx4.log"; check long-genuine-sender 0 $?
wait $pid; check long-genuine-receiver 0 $?
has long-genuine-floor "$floor" "version 3"
exit $fail
