#!/usr/bin/env bash
# Adversarial suite, signed deltas: the attacks on signed versions of core/docs/security.md against
# the real `dcr` and `dcr-node` binaries. Each must fail with a clear error (exit 14) and nothing of
# the attacker's applied, written or committed. The object store is the untrusted carrier: whoever
# can write it stands for a relay or mirror that alters, plants, mixes or replays bytes.
#   - offline: `dcr apply --trust` of an unsigned delta, of one signed with another key, of one with
#     a byte altered, of one with another signed delta's manifest, of a rollback
#     below the version floor; `dcr verify --trust` says the same;
#   - `dcr node` downloaders trusting the trainer's key: a delta planted in the store by a process
#     with its own key or none, a chunk object altered after the real upload, a chunk object of
#     another signed delta, a correctly signed delta below the receiver's version floor; and the
#     honest upload, committed and verified, with the floor recorded;
#   - freeze: a receiver whose floor is two minutes old and that gets no version reports it while it
#     waits, on stderr (repeatedly) and in its dcr_freeze_seconds metric;
#   - an S3 store over plain http, and an S3 credentials file others can read: refused before any
#     request;
#   - a relay of the run (its real certificate) reporting commits of itself and its child that it
#     made up: the sender refuses both records and counts no receiver;
#   - the same over plain TCP edges (network.tls enabled: false with the run's certificates, which
#     then only sign reports): refused alike;
#   - a live relay of the run (its real certificate) between the sender and a real receiver that
#     alters every chunk record it forwards: the receiver refuses them (exit 14), commits nothing,
#     writes no floor, and the sender counts no receiver; the same on the signed full-checkpoint
#     stream (every slice altered): refused alike.
#   signed_test.sh DCR    (dcr-node is found beside DCR)
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
dcr=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")  # the nodes run in their own dirs
py=python3

"$dcr" synth --preset tiny --rate 3% --steps 3 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/ck/step0.safetensors"; target="$tmp/ck/step1.safetensors"; other="$tmp/ck/step2.safetensors"
"$dcr" keys -o "$tmp/keys" 2>/dev/null; check trainer-keys 0 $?
[ "$(stat -c %a "$tmp/keys/trainer.key")" = 600 ]; check trainer-key-0600 0 $?
"$dcr" keys -o "$tmp/atk" 2>/dev/null; check attacker-keys 0 $?
key="$tmp/keys/trainer.key"; pub="$tmp/keys/trainer.pub"

echo "== offline: dcr apply --trust / dcr verify --trust"
"$dcr" diff "$base" "$target" -o "$tmp/good.dcr" --sign "$key" --chunks-per-manifest 4 -q; check diff-signed 0 $?
"$dcr" diff "$base" "$target" -o "$tmp/plain.dcr" -q; check diff-plain 0 $?
# The attacker's deltas toward weights of its choice (the other step), valid format, wrong key.
"$dcr" diff "$base" "$other" -o "$tmp/forged.dcr" --sign "$tmp/atk/trainer.key" -q; check diff-forged 0 $?
"$dcr" verify --trust "$pub" "$tmp/good.dcr" > "$tmp/v.out"; check verify-good 0 $?
has verify-good-says "$tmp/v.out" "SIGNED: "
refused() {  # refused NAME DELTA BASE MESSAGE [ARGS...]: apply --trust exits 14, says MESSAGE, no output
  local name=$1 delta=$2 b=$3 msg=$4; shift 4
  rm -f "$tmp/out.st"
  "$dcr" apply "$b" "$delta" -o "$tmp/out.st" --trust "$pub" -q "$@" 2>"$tmp/err"
  check "$name-exit-14" 14 $?
  has "$name-says" "$tmp/err" "$msg"
  [ ! -e "$tmp/out.st" ] && [ -z "$(ls "$tmp" | grep '^out.st.tmp')" ]; check "$name-no-output" 0 $?
}
refused unsigned "$tmp/plain.dcr" "$base" "is not signed"
refused forged "$tmp/forged.dcr" "$base" "not by the trusted key"
"$dcr" verify --trust "$pub" "$tmp/forged.dcr" 2>"$tmp/err"; check verify-forged-14 14 $?
# One byte of a chunk record altered (the last byte before the trailer: a chunk's payload).
"$py" - "$tmp/good.dcr" "$tmp/altered.dcr" <<'PY'; check make-altered 0 $?
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
t = struct.unpack("<Q", b[-24:-16])[0]
b[t - 1] ^= 0x10
open(sys.argv[2], "wb").write(b)
PY
refused altered "$tmp/altered.dcr" "$base" "not the one its signed manifest lists"
# Mix and match: the first signed manifest of another delta (same key, same base, other target;
# the same size: both list 4 chunks) in place of this delta's.
"$dcr" diff "$base" "$other" -o "$tmp/good2.dcr" --sign "$key" --chunks-per-manifest 4 -q
"$py" - "$tmp/good.dcr" "$tmp/good2.dcr" "$tmp/mixed.dcr" <<'PY'; check make-mixed 0 $?
import sys
a = bytearray(open(sys.argv[1], "rb").read()); o = open(sys.argv[2], "rb").read()
i, j = a.find(b"DCRM"), o.find(b"DCRM")
size = int.from_bytes(a[i + 4:i + 8], "little")
assert i == j and size == int.from_bytes(o[j + 4:j + 8], "little") and a[i:i + size] != o[j:j + size]
a[i:i + size] = o[j:j + size]
open(sys.argv[3], "wb").write(a)
PY
refused mixed "$tmp/mixed.dcr" "$base" "belongs to another delta"
# Rollback: a floor at version 1 after applying the signed v0 -> v1; the trainer's own, correctly
# signed v1 -> v0 delta is then refused.
"$dcr" apply "$base" "$tmp/good.dcr" -o "$tmp/v1.st" --trust "$pub" --version-floor "$tmp/floor" -q
check apply-good 0 $?
"$dcr" verify "$tmp/v1.st" "$target" -q >/dev/null; check apply-good-bit-exact 0 $?
has floor-recorded "$tmp/floor" "version 1"
"$dcr" diff "$target" "$base" -o "$tmp/rollback.dcr" --sign "$key" --base-version 1 --target-version 0 -q
refused rollback "$tmp/rollback.dcr" "$target" "rollback refused" --version-floor "$tmp/floor"
has floor-unchanged "$tmp/floor" "version 1"

echo "== dcr node downloaders trusting the trainer's key (directory store)"
# The store is the carrier an attacker can write. Each case has its own store and prefix.
scenario() {  # scenario FILE STORE KEY: a one-receiver object-store scenario signed with KEY
  cat > "$1" <<YAML
name: adv-signed
model: {checkpoints: [$base, $target]}
transport: {object_store: {kind: dir, path: $2}}
receivers: {count: 1}
network:
  signing: {key: $3, trust: $pub}
timeout: 10s
YAML
}
upload() {  # upload SCENARIO TARGET: rank 0 builds, signs and publishes
  (cd "$tmp" && "$dcr" node "$1" --rank 0 --transport object_store --base "$base" --target "$2" \
    >/dev/null 2>"$1.up.err"); check "upload-$(basename "$1" .yaml)" 0 $?
}
download() {  # download NAME SCENARIO DIR EXPECTED_RC: rank 1 in DIR (its version floor's home)
  mkdir -p "$3"
  (cd "$3" && "$dcr" node "$2" --rank 1 --transport object_store --base "$base" --target "$target" \
    >"$3/out.json" 2>"$3/err"); check "$1-exit" "$4" $?
}
not_committed() {  # not_committed NAME DIR
  lacks "$1-not-committed" "$2/out.json" '"t_commit": 1'
  [ ! -e "$2/version-floor-1" ]; check "$1-floor-not-written" 0 $?
}
chunk_object() {  # chunk_object STORE_PREFIX_DIR: the first object that is a chunk record (DCRC)
  for f in "$1"/*.chk; do
    [ "$(head -c 4 "$f")" = "DCRC" ] && { echo "$f"; return; }
  done
}

# Honest upload and download: committed, verified, floor recorded.
scenario "$tmp/ok.yaml" "$tmp/st-ok" "$key"
upload "$tmp/ok.yaml" "$target"
download honest "$tmp/ok.yaml" "$tmp/rx-ok" 0
has honest-verified "$tmp/rx-ok/out.json" '"verified": true'
has honest-floor "$tmp/rx-ok/version-floor-1" "version 1"

# A delta planted by a process with its own key (the same scenario otherwise): refused.
scenario "$tmp/forged.yaml" "$tmp/st-forged" "$tmp/atk/trainer.key"
upload "$tmp/forged.yaml" "$other"
scenario "$tmp/forged-rx.yaml" "$tmp/st-forged" "$key"
download planted-forged "$tmp/forged-rx.yaml" "$tmp/rx-forged" 14
has planted-forged-says "$tmp/rx-forged/err" "not by the trusted key"
not_committed planted-forged "$tmp/rx-forged"

# A delta planted without any signature (a plain uploader): refused.
sed 's|signing: {.*}|signing: false|' "$tmp/ok.yaml" | sed "s|$tmp/st-ok|$tmp/st-plain|" > "$tmp/plain.yaml"
upload "$tmp/plain.yaml" "$other"
sed "s|$tmp/st-ok|$tmp/st-plain|" "$tmp/ok.yaml" > "$tmp/plain-rx.yaml"
download planted-unsigned "$tmp/plain-rx.yaml" "$tmp/rx-plain" 14
has planted-unsigned-says "$tmp/rx-plain/err" "is not signed"
not_committed planted-unsigned "$tmp/rx-plain"

# The real upload, then one chunk object altered in the store (a relay or mirror changing bytes).
scenario "$tmp/alt.yaml" "$tmp/st-alt" "$key"
upload "$tmp/alt.yaml" "$target"
obj=$(chunk_object "$tmp/st-alt/refit/step-1")
[ -n "$obj" ]; check altered-object-found 0 $?
printf '\xff' | dd of="$obj" bs=1 seek=$(( $(stat -c %s "$obj") - 1 )) conv=notrunc status=none
download store-altered "$tmp/alt.yaml" "$tmp/rx-alt" 14
has store-altered-says "$tmp/rx-alt/err" "not the one its signed manifest lists"
not_committed store-altered "$tmp/rx-alt"

# Mix and match in the store: the same object of another real, signed upload (other target).
scenario "$tmp/mixa.yaml" "$tmp/st-mixa" "$key"; upload "$tmp/mixa.yaml" "$target"
scenario "$tmp/mixb.yaml" "$tmp/st-mixb" "$key"; upload "$tmp/mixb.yaml" "$other"
obj=$(chunk_object "$tmp/st-mixa/refit/step-1")
cp "$tmp/st-mixb/refit/step-1/$(basename "$obj")" "$obj"; check mixed-object-copied 0 $?
download store-mixed "$tmp/mixa.yaml" "$tmp/rx-mix" 14
has store-mixed-says "$tmp/rx-mix/err" "chunk of another delta"
not_committed store-mixed "$tmp/rx-mix"

# Rollback: a receiver whose floor says it committed version 5; the trainer's correctly signed
# delta to version 1 is refused before anything is applied, and the floor stays.
mkdir -p "$tmp/rx-rb"
printf 'dcr-version-floor 2\ndeployment %s\nversion 5\ncommitted_unix 1\n' "$(cat "$tmp/keys/deployment")" \
  > "$tmp/rx-rb/version-floor-1"
download store-rollback "$tmp/ok.yaml" "$tmp/rx-rb" 14
has store-rollback-says "$tmp/rx-rb/err" "rollback refused"
has store-rollback-floor-kept "$tmp/rx-rb/version-floor-1" "version 5"
lacks store-rollback-not-committed "$tmp/rx-rb/out.json" '"verified": true'

echo "== freeze: a receiver that gets no new version says so while it waits (stderr, metrics)"
# Its floor says it committed version 4 two minutes ago; no sender ever comes (versions withheld).
mkdir -p "$tmp/fz"
fport=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/fz/fz.yaml" <<YAML
name: adv-freeze
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1, streams: 1}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$fport", "127.0.0.1:$((fport + 1))"]
  tls: false
  metrics_port: $((fport + 10))
  signing: {key: $key, trust: $pub, freeze_after_s: 1}
timeout: 6s
YAML
printf 'dcr-version-floor 2\ndeployment %s\nversion 4\ncommitted_unix %s\n' "$(cat "$tmp/keys/deployment")" \
  $(( $(date +%s) - 120 )) > "$tmp/fz/version-floor-1"
(cd "$tmp/fz" && "$dcr" node fz.yaml --rank 1 --base "$base" --target "$target" > out.json 2> err) &
fzpid=$!
sleep 3.5
curl -s --max-time 2 "http://127.0.0.1:$((fport + 11))/metrics" > "$tmp/fz/metrics.txt"
"$py" - "$tmp/fz/metrics.txt" <<'PY'; check freeze-gauge-while-waiting 0 $?
import re, sys
m = re.search(r"^dcr_freeze_seconds\{[^}]*\} (\S+)", open(sys.argv[1]).read(), re.M)
assert m and float(m.group(1)) > 100, open(sys.argv[1]).read()
PY
wait $fzpid
"$py" - "$tmp/fz/err" <<'PY'; check freeze-said-repeatedly-while-waiting 0 $?
import sys
lines = [l for l in open(sys.argv[1]) if l.startswith("node 1: freeze: no new version for")]
assert len(lines) >= 2 and "the last committed is version 4" in lines[0], open(sys.argv[1]).read()
PY

echo "== the S3 store: plain http and a credentials file others can read are refused"
# No server is needed: both are refused before any request (a request would fail with 15).
s3() {  # s3 FILE ENDPOINT EXTRA: a one-receiver scenario over an S3 store
  cat > "$1" <<YAML
name: adv-s3
model: {checkpoints: [$base, $target]}
transport: {object_store: {kind: s3, endpoint: "$2", bucket: b, region: us-east-1$3}}
receivers: {count: 1}
timeout: 10s
YAML
}
s3 "$tmp/s3-http.yaml" "http://127.0.0.1:9" ""
(cd "$tmp" && env -u DCR_S3_ACCESS_KEY -u AWS_ACCESS_KEY_ID DCR_S3_ACCESS_KEY=a DCR_S3_SECRET_KEY=b \
  "$dcr" node "$tmp/s3-http.yaml" --rank 0 --transport object_store --base "$base" --target "$target" \
  >/dev/null 2>"$tmp/s3-http.err"); check s3-plain-http-refused 11 $?
has s3-plain-http-says "$tmp/s3-http.err" "is plain http"
printf 'access_key = a\nsecret_key = b\n' > "$tmp/s3.creds"; chmod 644 "$tmp/s3.creds"
s3 "$tmp/s3-creds.yaml" "https://127.0.0.1:9" ", credentials_file: $tmp/s3.creds"
(cd "$tmp" && env -u DCR_S3_ACCESS_KEY -u DCR_S3_SECRET_KEY -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY \
  "$dcr" node "$tmp/s3-creds.yaml" --rank 0 --transport object_store --base "$base" --target "$target" \
  >/dev/null 2>"$tmp/s3-creds.err"); check s3-open-credentials-refused 14 $?
has s3-open-credentials-says "$tmp/s3-creds.err" "readable by group or others (mode 0644)"

echo "== a relay of the run forging commit reports (relay tree, mutual TLS)"
# The relay holds its real certificate (rank 1 of the run's `dcr keys`), takes the sender's
# connection and reports that it and its child committed. The sender must refuse both records
# (unsigned by ranks 1 and 2) and count no receiver.
port=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/mh.yaml" <<YAML
name: adv-signed-mh
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1, streams: 1}
receivers: {count: 2}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
timeout: 8s
YAML
"$dcr" keys "$tmp/mh.yaml" -o "$tmp/run-keys" >/dev/null 2>&1; check run-keys 0 $?
sed -i "/^network:/a\\  tls: {ca: '$tmp/run-keys/ca.crt', cert: '$tmp/run-keys/node-{rank}.crt', key: '$tmp/run-keys/node-{rank}.key'}\\n  signing: {key: '$tmp/run-keys/trainer.key', trust: '$tmp/run-keys/trainer.pub'}" "$tmp/mh.yaml"
"$py" "$(dirname "$0")/forging_relay.py" "127.0.0.1:$((port + 1))" --rank 1 --claim 1,2 \
  --cert "$tmp/run-keys/node-1.crt" --key "$tmp/run-keys/node-1.key" --for 30 > "$tmp/forger.txt" &
fpid=$!
sleep 0.5
(cd "$tmp" && "$dcr" node "$tmp/mh.yaml" --rank 0 --base "$base" --target "$target" \
  > "$tmp/mh0.json" 2> "$tmp/mh0.err")
echo "     sender exit $?"
wait $fpid
has forger-reported "$tmp/forger.txt" "reported 2"
has forged-report-refused "$tmp/mh0.err" "a relay may have forged it"
"$py" - "$tmp/mh0.json" <<'PY'; check forged-reports-not-counted 0 $?
import json, sys
s = json.load(open(sys.argv[1]))
assert s["receivers_committed"] == 0, s
assert not any(r.get("ok") for r in s.get("reports", [])), s
PY

echo "== the same forging relay over plain TCP (network.tls enabled: false, the run's certificates named)"
# Plain TCP edges; the certificates only sign commit reports. The relay's made-up records carry
# no signature of ranks 1 and 2: refused, no receiver counted.
sed "s|  tls: {ca:|  tls: {enabled: false, ca:|" "$tmp/mh.yaml" > "$tmp/mh-plain.yaml"
has plain-scenario "$tmp/mh-plain.yaml" "enabled: false"
"$py" "$(dirname "$0")/forging_relay.py" "127.0.0.1:$((port + 1))" --rank 1 --claim 1,2 --plain \
  --cert "$tmp/run-keys/node-1.crt" --key "$tmp/run-keys/node-1.key" --for 30 > "$tmp/forger-plain.txt" &
fpid=$!
sleep 0.5
(cd "$tmp" && "$dcr" node "$tmp/mh-plain.yaml" --rank 0 --base "$base" --target "$target" \
  > "$tmp/mhp0.json" 2> "$tmp/mhp0.err")
echo "     sender exit $?"
wait $fpid
has plain-forger-reported "$tmp/forger-plain.txt" "reported 2"
has plain-forged-report-refused "$tmp/mhp0.err" "a relay may have forged it"
"$py" - "$tmp/mhp0.json" <<'PY'; check plain-forged-reports-not-counted 0 $?
import json, sys
s = json.load(open(sys.argv[1]))
assert s["receivers_committed"] == 0, s
assert not any(r.get("ok") for r in s.get("reports", [])), s
PY

echo "== a relay of the run altering the chunk records it forwards (relay tree, mutual TLS)"
# The relay holds its real certificate (rank 1), takes the sender's connection, dials its child
# (rank 2, a real dcr node) and forwards every frame, each chunk record with a byte flipped. The
# child must refuse the altered records against the signed manifests (exit 14), write nothing
# (no commit, no version floor), and the sender must count no receiver.
# The same scenario, ports and run credentials as the case above (that relay has closed).
mkdir -p "$tmp/alt-rx2"
(cd "$tmp/alt-rx2" && "$dcr" node "$tmp/mh.yaml" --rank 2 --base "$base" --target "$target" \
  > out.json 2> err) &
rx2pid=$!
"$py" "$(dirname "$0")/altering_relay.py" "127.0.0.1:$((port + 1))" "127.0.0.1:$((port + 2))" \
  --rank 1 --cert "$tmp/run-keys/node-1.crt" --key "$tmp/run-keys/node-1.key" \
  --ca "$tmp/run-keys/ca.crt" --for 30 > "$tmp/alterer.txt" &
apid=$!
sleep 0.5
(cd "$tmp" && "$dcr" node "$tmp/mh.yaml" --rank 0 --base "$base" --target "$target" \
  > "$tmp/alt0.json" 2> "$tmp/alt0.err")
echo "     sender exit $?"
wait $rx2pid; check altered-relay-child-exit-14 14 $?
wait $apid
has alterer-forwarded "$tmp/alterer.txt" "child connected"
"$py" - "$tmp/alterer.txt" <<'PY'; check alterer-altered-pieces 0 $?
import re, sys
m = re.search(r"altered (\d+) pieces", open(sys.argv[1]).read())
assert m and int(m.group(1)) > 0, open(sys.argv[1]).read()
PY
has altered-relay-child-says "$tmp/alt-rx2/err" "not the one its signed manifest lists"
lacks altered-relay-child-not-committed "$tmp/alt-rx2/out.json" '"verified": true'
[ ! -e "$tmp/alt-rx2/version-floor-2" ]; check altered-relay-child-no-floor 0 $?
"$py" - "$tmp/alt0.json" <<'PY'; check altered-relay-nothing-counted 0 $?
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(0)  # the sender failed before writing a result: nothing counted
assert s.get("receivers_committed", 0) == 0, s
PY

echo "== the same altering relay on the full-checkpoint stream (method full, signed slices)"
mkdir -p "$tmp/altf-rx2"
(cd "$tmp/altf-rx2" && "$dcr" node "$tmp/mh.yaml" --rank 2 --method full --base "$base" --target "$target" \
  > out.json 2> err) &
rx2pid=$!
"$py" "$(dirname "$0")/altering_relay.py" "127.0.0.1:$((port + 1))" "127.0.0.1:$((port + 2))" --full \
  --rank 1 --cert "$tmp/run-keys/node-1.crt" --key "$tmp/run-keys/node-1.key" \
  --ca "$tmp/run-keys/ca.crt" --for 30 > "$tmp/alterer-full.txt" &
apid=$!
sleep 0.5
(cd "$tmp" && "$dcr" node "$tmp/mh.yaml" --rank 0 --method full --base "$base" --target "$target" \
  > "$tmp/altf0.json" 2> "$tmp/altf0.err")
echo "     sender exit $?"
wait $rx2pid; check altered-full-child-exit-14 14 $?
wait $apid
has alterer-full-forwarded "$tmp/alterer-full.txt" "child connected"
has altered-full-child-says "$tmp/altf-rx2/err" "not the one its signed manifest lists"
lacks altered-full-child-not-committed "$tmp/altf-rx2/out.json" '"verified": true'

exit $fail
