#!/usr/bin/env bash
# A late joiner whose versions retention removed, through the shipped binaries: a C trainer
# (publisher_c_test.c) hands ten signed versions to an open-ended deployment (model.base) of
# three dcr-node tree receivers with --state, over a TLS relay tree with an in-region directory
# store and `retention: {keep_versions: 2}`. Rank 3 is absent until version 6 is out, then starts
# from the base: versions 1-4 are collected by then, so it can neither follow its parent (which
# moved on) nor take them from the store. It asks for a full frame, the sender puts one of the
# version it publishes next (from the trainer's checkpoint, counted in its result), the joiner
# loads it after checking it against the version's trailer and the trainer's signed commitment,
# says so on its stderr, is re-admitted to the joint commit and follows the rest. Every
# receiver's held version 10, written by `dcr export` (checked with the trust key), is the
# trainer's content byte for byte (`dcr verify`).
#   publisher_late_collected_test.sh DCR DCR_NODE PUBLISHER_C_TEST
set -uo pipefail
dcr=$1; node=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); prog=$3
tmp=$(mktemp -d)
declare -a pids
trap 'kill -9 ${pids[*]:-} 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
source "$(dirname "$0")/train_lib.sh"
synth_trainer_checkpoints "$dcr" "$tmp/ck"
port=$(( 20000 + RANDOM % 12000 ))
scenario() {  # scenario FILE NETWORK-LINES
  cat >"$1" <<YAML
name: late-collected
model: {base: $tmp/ck/step0.safetensors}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}
  object_store: {kind: dir, path: $tmp/store}
receivers: {count: 3, deadline: 2s}
delta: {chunk_elems: 262144}
retention: {keep_versions: 2}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))",
          "127.0.0.1:$((port + 3))"]
$2
timeout: 60s
YAML
}
scenario "$tmp/shape.yaml" "  tls: false"
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/keys" >/dev/null 2>&1 || { bad "dcr keys"; exit 1; }
k=$tmp/keys
scenario "$tmp/s.yaml" "  tls: {ca: $k/ca.crt, cert: '$k/node-{rank}.crt',
        key: '$k/node-{rank}.key'}
  signing: {key: $k/trainer.key, trust: $k/trainer.pub}"
mkdir -p "$tmp/store" "$tmp/h0"
start_rank() {
  mkdir -p "$tmp/h$1"
  (cd "$tmp/h$1" && exec "$node" "$tmp/s.yaml" --rank "$1" --state "$tmp/h$1/state") \
    >"$tmp/h$1/log" 2>&1 &
  pids[$1]=$!
}
start_rank 2; start_rank 1
last=10
specs=()
for k in $(seq $last); do
  s=$(( (k - 1) % 3 + 1 ))
  specs+=("tensors:$tmp/ck/step$s.manifest:$tmp/ck/step$s.safetensors")
done
"$prog" "scenario:0:$tmp/h0/state:$tmp/s.yaml" "$tmp/h0/work" 2 "${specs[@]}" >"$tmp/prog.out" \
  2>"$tmp/prog.err" &
trainer=$!
for _ in $(seq 600); do
  grep -q "^version 6: rc 0" "$tmp/prog.out" && break
  kill -0 "$trainer" 2>/dev/null || break
  sleep 0.1
done
gone=""; for k in 1 2 3 4; do
  [ -z "$(find "$tmp/store/refit/step-$k" -type f 2>/dev/null)" ] && gone="$gone $k"
done
[ "$gone" = " 1 2 3 4" ] && ok "version 6 out: retention removed versions$gone from the store" \
  || bad "version 6 out: versions removed:$gone"
start_rank 3  # the late joiner, from the base
wait "$trainer"; rc=$?
[ "$rc" = 0 ] && ok "the trainer published $last versions" \
  || { bad "trainer exit $rc"; tail -5 "$tmp/prog.err"; }
# The joiner's last version: it ends once rank 3 holds version 10 (bounded: a joiner that never
# catches up fails here instead of waiting).
for _ in $(seq 300); do
  f=$(find "$tmp/h3/state" -name "node-3-v$last.json" 2>/dev/null | head -1)
  [ -n "$f" ] && grep -q '"ok": *true' "$f" && break
  sleep 0.1
done
line=$(grep -m1 "requesting a full frame" "$tmp/h3/log")
[ -n "$line" ] && ok "rank 3: $(echo "$line" | cut -c1-150)..." \
  || bad "rank 3 asked for no full frame"
line=$(grep -m1 "full frame of version [0-9]* from the in-region store" "$tmp/h3/log")
frame=$(echo "$line" | sed -n 's/.*full frame of version \([0-9]*\) .*/\1/p')
[ -n "$frame" ] && ok "rank 3: $(echo "$line" | cut -c1-110)..." \
  || bad "rank 3 took no full frame: $(tail -3 "$tmp/h3/log")"
grep -q "sender: full frame of version $frame put in the region store for 1 request" \
  "$tmp/prog.err" \
  && python3 - "$(find "$tmp/h0/state" -name "node-0-v$frame.json" | head -1)" <<'PY' \
  && ok "the sender served the frame of version $frame (full_frames_served 1 in its result)" \
  || bad "sender: $(grep -m1 'full frame' "$tmp/prog.err")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] and r["full_frames_served"] == 1, r
PY
grep -q "receiver 3 joins the joint commit" "$tmp/prog.err" \
  && ok "$(grep -m1 'receiver 3 joins the joint commit' "$tmp/prog.err")" \
  || bad "rank 3 never joined the joint commit"
for r in 1 2 3; do
  f="$tmp/export-$r.safetensors"
  "$dcr" export "$tmp/s.yaml" --rank "$r" --state "$tmp/h$r/state" -o "$f" \
    >"$tmp/export.out" 2>&1 || { bad "rank $r: dcr export: $(cat "$tmp/export.out")"; continue; }
  grep -q "^EXPORTED: rank $r, version $last " "$tmp/export.out" \
    || bad "rank $r: $(cat "$tmp/export.out")"
  "$dcr" verify -q "$f" "$tmp/ck/step1.safetensors" >"$tmp/verify.out" 2>&1 \
    && ok "rank $r: version $last exported, verified by dcr verify" \
    || bad "rank $r, version $last: $(cat "$tmp/verify.out")"
done
for r in 1 2 3; do kill -TERM "${pids[$r]}" 2>/dev/null; done
for r in 1 2 3; do
  wait "${pids[$r]}"; rc=$?
  [ "$rc" = 143 ] || bad "rank $r: exit $rc after SIGTERM"
done
pids=()
[ "$fail" = 0 ] || { echo "--- rank 3's log"; tail -8 "$tmp/h3/log"; }
exit $fail
