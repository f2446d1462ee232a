#!/usr/bin/env bash
# Adversarial suite, commit reports: the sender counts a receiver only when its signed report
# names the commitment root the trainer signed, never on the additive content hash.
#   - a signed, mutual-TLS relay-tree refit (`dcr keys`, multi-host form, one sender, two
#     receivers): rank 1 holds the genuine base and trusts the trainer's key; rank 2's base was
#     swapped for a forged one with the genuine content hash (dcr_collide: only weights the delta
#     leaves unchanged are touched, so every chunk's base-change hash and the target hash still
#     match) and its scenario names no trust key, so it applies and commits the wrong bytes;
#   - rank 2's real dcr-node reports, signed with its own certificate, the genuine content hash
#     and the commitment root of what it holds; the sender refuses that report naming both roots
#     and counts one receiver (rank 1), whose report carries the signed root;
#   - the same refit with rank 2 on the genuine base: the sender counts both.
#   report_root_test.sh DCR DCR_COLLIDE
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
collide=$2
dcr_abs=$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/ck/step0.safetensors"; target="$tmp/ck/step1.safetensors"
"$collide" "$base" "$tmp/forged.safetensors" --tensor lm_head.weight --keep-unchanged "$target" \
  > "$tmp/collide.out"; check collide 0 $?
has collide-same-hash "$tmp/collide.out" " == "

scenario() {  # scenario FILE PORT NETWORK-LINES
  cat > "$1" <<YAML
name: report-root
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 2, streams: 1}
receivers: {count: 2}
network:
  hosts: ["127.0.0.1:$2", "127.0.0.1:$(($2 + 1))", "127.0.0.1:$(($2 + 2))"]
$3
timeout: 30s
YAML
}
port=$(( 20000 + RANDOM % 12000 ))
scenario "$tmp/shape.yaml" "$port" ""
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
tls="  tls: {ca: $tmp/keys/ca.crt, cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}"

refit() {  # refit NAME RANK2-BASE: one signed refit; rank 2 trusts no key
  local d="$tmp/$1" p=$(( 20000 + RANDOM % 12000 ))
  mkdir -p "$d"
  scenario "$d/s.yaml" "$p" "$tls
  signing: {key: $tmp/keys/trainer.key, trust: $tmp/keys/trainer.pub}"
  scenario "$d/untrusting.yaml" "$p" "$tls"
  (cd "$d" && exec "$dcr_abs" node "$d/s.yaml" --rank 1 --base "$base" --target "$target" \
    > "$d/r1.json" 2> "$d/r1.err") & local r1=$!
  (cd "$d" && exec "$dcr_abs" node "$d/untrusting.yaml" --rank 2 --base "$2" --target "$target" \
    > "$d/r2.json" 2> "$d/r2.err") & local r2=$!
  (cd "$d" && exec "$dcr_abs" node "$d/s.yaml" --rank 0 --base "$base" --target "$target" \
    > "$d/r0.json" 2> "$d/r0.err"); echo $? > "$d/r0.rc"
  wait $r1; echo $? > "$d/r1.rc"
  wait $r2; echo $? > "$d/r2.rc"
}

echo "== rank 2 holds a forged base with the genuine content hash"
refit forged "$tmp/forged.safetensors"
d="$tmp/forged"
check forged-rank1-exit 0 "$(cat "$d/r1.rc")"
# It commits (no key to check against), then fails only the byte comparison with the target.
check forged-rank2-fails-verify 1 "$(cat "$d/r2.rc")"
has forged-rank2-differs "$d/r2.err" "tensor 'lm_head.weight' differs from the target"
check forged-sender-exit 0 "$(cat "$d/r0.rc")"
python3 - "$d" <<'PY'; check forged-sender-counts-rank1-only 0 $?
import json, sys
d = sys.argv[1]
r0 = json.load(open(d + "/r0.json"))
r2 = json.load(open(d + "/r2.json"))
root = r0["commitment"]
assert len(root) == 64, r0
# Rank 2 committed wrong bytes whose content hash is the genuine one: the checksum cannot tell.
assert r2["target_hash"] == r0["target_hash"], (r2["target_hash"], r0["target_hash"])
assert r2["t_commit"] > 0 and r2.get("verified") is False, r2
assert r0["receivers_committed"] == 1, r0["receivers_committed"]
ranks = sorted(c["rank"] for c in r0["reports"])
assert ranks == [1], r0["reports"]
(one,) = r0["reports"]
assert one["ok"] and one["commitment"] == root, (one, root)
PY
has forged-sender-refuses "$d/r0.err" "refused a commit report: child node 2 reported rank 2 committed, but it reported commitment "
has forged-sender-names-root "$d/r0.err" "not the signed root $(python3 -c "import json; print(json.load(open('$d/r0.json'))['commitment'])")"

echo "== rank 2 holds the genuine base"
refit genuine "$base"
d="$tmp/genuine"
check genuine-rank1-exit 0 "$(cat "$d/r1.rc")"
check genuine-rank2-exit 0 "$(cat "$d/r2.rc")"
check genuine-sender-exit 0 "$(cat "$d/r0.rc")"
python3 - "$d" <<'PY'; check genuine-sender-counts-both 0 $?
import json, sys
r0 = json.load(open(sys.argv[1] + "/r0.json"))
assert r0["receivers_committed"] == 2, r0
assert sorted(c["rank"] for c in r0["reports"]) == [1, 2], r0["reports"]
assert all(c["commitment"] == r0["commitment"] for c in r0["reports"]), r0["reports"]
PY
exit $fail
