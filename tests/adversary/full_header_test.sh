#!/usr/bin/env bash
# Adversarial suite, the full-checkpoint receiver's header against the real `dcr` / `dcr-node`
# binaries (core/docs/security.md "Bounded resources"): a peer that reaches a `dcr node --method
# full` receiver's port (a plain-TCP edge, so any process can) claims its parent's rank and
# sends a header blob whose claimed file size its own safetensors header does not give: 24 bytes
# claiming 4.2 GB, and a 16 TiB claim. Each is refused (DATA_LOSS, exit 13) naming the claim,
# never an abort, with nothing written and the receiver's peak RSS under 256 MiB above the model.
#   full_header_test.sh DCR    (dcr-node is found beside DCR)
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
dcr=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")
py=python3
peer="$(dirname "$0")/hostile_peer.py"

"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
model_kib=$(( $(stat -c %s "$ck/step0.safetensors") / 1024 ))
port=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/s.yaml" <<YAML
name: adv-full-header
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport: {relay_tree: {fan_out: 1, root_fan_out: 1}}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
  tls: false
timeout: 20s
YAML
header() {  # header FILE FILE_SIZE JSON: a full-stream header blob (file size, header length, JSON)
  "$py" - "$@" <<'PY'
import struct, sys
json = sys.argv[3].encode()
open(sys.argv[1], "wb").write(struct.pack("<QQ", int(sys.argv[2]), len(json)) + json)
PY
}
header "$tmp/h-4g" 4200000000 "{}      "
header "$tmp/h-16t" $((1 << 44)) "{}"
[ "$(stat -c %s "$tmp/h-4g")" = 24 ]; check header-24-bytes 0 $?
for claim in 4g 16t; do
  mkdir -p "$tmp/rx-$claim"
  (cd "$tmp/rx-$claim" && exec "$py" -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[3:], stdout=open(sys.argv[1], "w"), stderr=open(sys.argv[2], "w"))
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' out.json err "$dcr" node \
    "$tmp/s.yaml" --rank 1 --method full --target "$ck/step1.safetensors" > rss) &
  ph=$!
  for _ in $(seq 100); do
    "$py" -c "import socket; socket.create_connection(('127.0.0.1', $((port + 1))), 0.2)" \
      2>/dev/null && break
    sleep 0.1
  done
  # A first hello of run 0 is dropped naming the node's run id; the header is sent in that run.
  "$py" "$peer" header "127.0.0.1:$((port + 1))" --plain --send "$tmp/h-$claim" > /dev/null
  run_id=""
  for _ in $(seq 50); do
    run_id=$(grep -o "this node's run 0x[0-9a-f]*" "$tmp/rx-$claim/err" | head -1 | sed 's/.* //')
    [ -n "$run_id" ] && break
    sleep 0.1
  done
  "$py" "$peer" header "127.0.0.1:$((port + 1))" --plain --send "$tmp/h-$claim" --run "$run_id" \
    > "$tmp/peer-$claim.txt"
  wait $ph
  read -r rc rss < "$tmp/rx-$claim/rss"
  echo "     claim $claim: node 1 exit $rc, peak RSS $rss KiB"
  check "full-$claim-data-loss" 13 "$rc"
  [ "$claim" = 4g ] && has "full-$claim-names-claim" "$tmp/rx-$claim/err" \
    "claims a file of 4200000000 bytes"
  lacks "full-$claim-no-bad-alloc" "$tmp/rx-$claim/err" "bad_alloc"
  lacks "full-$claim-not-verified" "$tmp/rx-$claim/out.json" '"verified": true'
  [ "$rss" -lt $(( model_kib + 256 * 1024 )) ]; check "full-$claim-rss-bounded" 0 $?
  [ -z "$(find "$tmp/rx-$claim" -name '*.safetensors')" ]; check "full-$claim-nothing-written" 0 $?
done
exit $fail
