#!/usr/bin/env bash
# Adversarial suite, versions of the one-refit form (`dcr node --target`) against the real `dcr`
# and `dcr-node` binaries (core/docs/security.md "Deployment identity"): each one-refit refit of a
# `dcr keys` deployment is a process of its own, and with `--state` its versions never repeat:
#   - two one-refit refits of one deployment over a directory store: the uploader publishes
#     version 1, then version 2 (the delta headers say v0 -> v1 and v1 -> v2), and the
#     receiver's version floor, in its state directory, records each;
#   - a replay of the first refit's signed delta (left by an attacker with put access at the
#     prefix) to the receiver that committed the second, started from the first's base: refused
#     as a rollback (exit 14), nothing committed, the floor kept at version 2;
#   - an uploader whose published-version record was deleted publishes version 1 again: the
#     receiver's floor refuses the repeat (exit 14);
#   - the receiver's floor deleted after a start: its next start is refused, not taken as fresh;
#     a state directory others can write is refused before anything is written in it.
#   one_refit_test.sh DCR    (dcr-node is found beside DCR)
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
dcr=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")

"$dcr" synth --preset tiny --rate 3% --steps 3 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
"$dcr" keys -o "$tmp/K" 2>/dev/null; check keys 0 $?
D=$(cat "$tmp/K/deployment")
cat > "$tmp/s.yaml" <<YAML
name: adv-one-refit
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {object_store: {kind: dir, path: $tmp/st}}
receivers: {count: 1}
network:
  signing: {key: $tmp/K/trainer.key, trust: $tmp/K/trainer.pub}
timeout: 10s
YAML
mkdir -p "$tmp/h0" "$tmp/h1"
P="$tmp/st/refit/step-1"
floor="$tmp/h1/state/deployment-$D/rank-1.floor"
up() {  # up NAME BASE TARGET: the uploader of one refit (rank 0, its own --state)
  (cd "$tmp/h0" && "$dcr" node "$tmp/s.yaml" --rank 0 --transport object_store \
    --state "$tmp/h0/state" --base "$ck/$2.safetensors" --target "$ck/$3.safetensors" \
    > "$tmp/h0/$1.json" 2> "$tmp/h0/$1.err"); check "$1-exit" 0 $?
}
down() {  # down NAME BASE TARGET EXPECTED_RC: the downloader (rank 1, its own --state)
  (cd "$tmp/h1" && "$dcr" node "$tmp/s.yaml" --rank 1 --transport object_store \
    --state "$tmp/h1/state" --base "$ck/$2.safetensors" --target "$ck/$3.safetensors" \
    > "$tmp/h1/$1.json" 2> "$tmp/h1/$1.err"); check "$1-exit" "$4" $?
}
versions() {  # versions NAME EXPECTED: the store's delta header at the prefix names EXPECTED
  python3 - "$P/0000000000.hdr" "$2" <<'PY'; check "$1" 0 $?
import struct, sys
b = open(sys.argv[1], "rb").read()
base, target = struct.unpack_from("<Q", b, 16)[0], struct.unpack_from("<Q", b, 40)[0]
got = "v%d -> v%d" % (base, target)
if got != sys.argv[2]:
    sys.exit("the delta header says %s, expected %s" % (got, sys.argv[2]))
PY
}

echo "== two one-refit refits of one deployment: versions 1 and 2"
up up1 step0 step1
versions up1-publishes-v1 "v0 -> v1"
has up1-recorded "$tmp/h0/state/deployment-$D/rank-0.published" "version 1"
[ "$(stat -c %a "$tmp/h0/state/deployment-$D")" = 700 ]; check sender-state-0700 0 $?
down down1 step0 step1 0
has down1-verified "$tmp/h1/down1.json" '"verified": true'
has down1-floor-1 "$floor" "version 1"
cp -r "$P" "$tmp/refit1"   # what an attacker keeps of the first refit
rm -rf "$P"
up up2 step1 step2
versions up2-publishes-v2 "v1 -> v2"
down down2 step1 step2 0
has down2-verified "$tmp/h1/down2.json" '"verified": true'
has down2-floor-2 "$floor" "version 2"

echo "== the first refit's delta replayed to the receiver that committed the second"
rm -rf "$P"; cp -r "$tmp/refit1" "$P"
down replay step0 step1 14
has replay-refused "$tmp/h1/replay.err" "rollback refused"
lacks replay-not-committed "$tmp/h1/replay.json" '"verified": true'
has replay-floor-kept "$floor" "version 2"

echo "== a sender that lost its record publishes version 1 again: the floor refuses the repeat"
rm -f "$tmp/h0/state/deployment-$D/rank-0.published"
rm -rf "$P"
up up-lost step1 step2
versions up-lost-publishes-v1 "v0 -> v1"
down repeat step1 step2 14
has repeat-refused "$tmp/h1/repeat.err" "rollback refused"
has repeat-floor-kept "$floor" "version 2"

echo "== the receiver's state: a deleted floor and a directory others can write are refused"
rm -f "$floor"
down no-floor step1 step2 14
has no-floor-says "$tmp/h1/no-floor.err" "records earlier starts"
[ ! -e "$floor" ]; check no-floor-not-recreated 0 $?
mkdir -m 777 "$tmp/open"; chmod 777 "$tmp/open"
(cd "$tmp/h1" && "$dcr" node "$tmp/s.yaml" --rank 1 --transport object_store --state "$tmp/open" \
  --base "$ck/step1.safetensors" --target "$ck/step2.safetensors" > /dev/null 2> "$tmp/open.err")
check open-state-refused 14 $?
has open-state-says "$tmp/open.err" "mode 0777"
[ -z "$(ls -A "$tmp/open")" ]; check open-state-nothing-written 0 $?
exit $fail
