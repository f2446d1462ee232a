#!/usr/bin/env bash
# What a long-lived trainer keeps, through the shipped binaries: a C trainer (publisher_c_test.c)
# hands twelve versions as tensors in memory to an open-ended deployment (model.base, no version
# count) of three dcr-node receivers with --state, over a relay tree with an in-region store.
# Rank 3 is absent until version 6 is out, then joins late. After every version the publisher's
# work dir holds only the checkpoints from the joint commit's baseline on (at most 2 files, never
# one per version), and the trainer's state directory stays within a bound that does not grow
# with the versions; the late joiner still catches up, and every receiver's committed checkpoint
# of version 12, written by `dcr export` from its state, is the trainer's content byte for byte
# (`dcr verify`).
#   publisher_retention_test.sh DCR DCR_NODE PUBLISHER_C_TEST
set -uo pipefail
dcr=$1; node=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); prog=$3
tmp=$(mktemp -d); trap 'kill -9 ${pids[*]:-} 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/train_lib.sh"
synth_trainer_checkpoints "$dcr" "$tmp/ck"
port=$(( 20000 + RANDOM % 12000 ))
cat >"$tmp/s.yaml" <<YAML
name: retention
model: {base: $tmp/ck/step0.safetensors}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}
  object_store: {kind: dir, path: $tmp/store}
receivers: {count: 3, deadline: 2s}
delta: {chunk_elems: 262144}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))", "127.0.0.1:$((port + 3))"]
  tls: false
timeout: 60s
YAML
mkdir -p "$tmp/store" "$tmp/h0"
declare -a pids
start_rank() {
  mkdir -p "$tmp/h$1"
  (cd "$tmp/h$1" && exec "$node" "$tmp/s.yaml" --rank "$1" --state "$tmp/h$1/state") \
    >"$tmp/h$1/log" 2>&1 &
  pids[$1]=$!
}
start_rank 2; start_rank 1
specs=(); for k in $(seq 12); do s=$(( (k - 1) % 3 + 1 )); specs+=("tensors:$tmp/ck/step$s.manifest:$tmp/ck/step$s.safetensors"); done
t0=$(date +%s)
"$prog" "scenario:0:$tmp/h0/state:$tmp/s.yaml" "$tmp/h0/work" 2 "${specs[@]}" >"$tmp/prog.out" 2>"$tmp/prog.err" &
trainer=$!
for _ in $(seq 600); do grep -q "^version 6: rc 0" "$tmp/prog.out" && break; kill -0 "$trainer" 2>/dev/null || break; sleep 0.1; done
start_rank 3  # the late joiner
wait "$trainer"; rc=$?
took=$(( $(date +%s) - t0 ))
grep -E "^(version|kept)" "$tmp/prog.out" | sed 's/^/     /' | grep -E "version (1|6|7|12)[:,]|after version (1|6|7|12):"
[ "$rc" = 0 ] && ok "the trainer published 12 versions in ${took} s" \
  || { bad "trainer exit $rc"; tail -5 "$tmp/prog.err"; }
python3 - "$tmp/prog.out" <<'PY' || fail=1
import re, sys
kept = [tuple(map(int, m.groups())) for m in
        re.finditer(r"kept after version (\d+): baseline (\d+), (\d+) files", open(sys.argv[1]).read())]
assert len(kept) == 12, kept
assert all(files <= 2 for _, _, files in kept), kept
assert all(0 < base <= v for v, base, _ in kept), kept
assert kept[-1][1] == 12 and kept[-1][2] == 1, kept[-1]
print("ok   the work dir held at most %d checkpoint files at any version (baseline = the "
      "version at the end, 1 file)" % max(f for _, _, f in kept))
PY
ls "$tmp/h0/work" > "$tmp/work.ls"
[ "$(cat "$tmp/work.ls")" = "version-12.safetensors" ] && ok "work dir at the end: version-12.safetensors" \
  || bad "work dir at the end: $(tr '\n' ' ' < "$tmp/work.ls")"
# The trainer's state: its size apart from the per-version result records (a few KiB each, the
# deployment's record) is bounded by what one version needs, not by the number of versions.
state_bytes=$(find "$tmp/h0/state" -type f ! -name 'node-0-v*.json' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
ckpt_bytes=$(stat -c %s "$tmp/ck/step1.safetensors")
if [ "$state_bytes" -lt "$ckpt_bytes" ]; then
  ok "the trainer's state holds $state_bytes bytes besides its results (one checkpoint: $ckpt_bytes)"
else
  bad "the trainer's state holds $state_bytes bytes besides its results:"; find "$tmp/h0/state" -type f | head -30
fi
# Every receiver serves version 12 (the late joiner caught up); its held version, exported from
# its state while it serves it, is byte for byte the trainer's. The deployment is unsigned, so
# the export checks the content hash the node's version log recorded (--unsigned).
for r in 1 2 3; do
  f="$tmp/export-$r.safetensors"
  "$dcr" export "$tmp/s.yaml" --rank "$r" --state "$tmp/h$r/state" --unsigned -o "$f" \
    >"$tmp/export.out" 2>&1 || { bad "rank $r: dcr export: $(cat "$tmp/export.out")"; continue; }
  grep -q "^EXPORTED: rank $r, version 12 " "$tmp/export.out" || bad "rank $r: $(cat "$tmp/export.out")"
  "$dcr" verify -q "$f" "$tmp/ck/step3.safetensors" >"$tmp/verify.out" 2>&1 \
    && ok "rank $r: version 12 exported, verified by dcr verify" || bad "rank $r, version 12: $(cat "$tmp/verify.out")"
done
# Without --unsigned an unsigned deployment's export is refused (exit 14), nothing written.
"$dcr" export "$tmp/s.yaml" --rank 1 --state "$tmp/h1/state" -o "$tmp/refused.safetensors" \
  >"$tmp/export.out" 2>&1; rc=$?
if [ "$rc" = 14 ] && grep -q "no trust key" "$tmp/export.out" && [ ! -e "$tmp/refused.safetensors" ]; then
  ok "unsigned export without --unsigned refused (exit 14), nothing written"
else
  bad "unsigned export without --unsigned: exit $rc: $(cat "$tmp/export.out")"
fi
grep -q "receiver 3 joins the joint commit" "$tmp/prog.err" && ok "the late rank 3 joined the joint commit" \
  || bad "rank 3 never joined the joint commit"
for r in 1 2 3; do kill -TERM "${pids[$r]}"; done
for r in 1 2 3; do wait "${pids[$r]}"; rc=$?; [ "$rc" = 143 ] || bad "rank $r: exit $rc after SIGTERM"; done
pids=()
exit $fail
