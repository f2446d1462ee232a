#!/usr/bin/env bash
# netns test: sender h0 (training region) -> relay h1 -> receivers h2, h3 (rollout region), each a
# network namespace on a bridge; h0's uplink (the long link) is shaped with tbf. Every node is a
# separate `dcr node SCENARIO --rank R` process (rank 0 takes its rank from SLURM_PROCID, the
# multi-host path). Checks: every receiver verified byte for byte, for the delta and the full
# reference, and the full reference was paced by tbf.
# Usage: netns_relay_test.sh DCR_BINARY        exit 0 pass, 1 fail, 77 skipped
set -uo pipefail
DCR=${1:?usage: netns_relay_test.sh DCR_BINARY}
RATE_MBIT=${DCR_NETNS_RATE_MBIT:-40}
P=dcrns$$            # namespace prefix, unique per run
NET=10.213.$(( $$ % 200 + 20 ))
source "$(dirname "$0")/netns_lib.sh"
netns_require

WORK=$(mktemp -d /tmp/dcr-netns-XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  netns_delete "$P" 4
  [ -n "${DCR_NETNS_KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log; do echo "== $f"; tail -5 "$f"; done; exit 1; }

# Router namespace with a bridge; one veth per host.
netns_hosts "$P" "$NET" 4 || fail "netns set-up"
# The long link: h0's egress and the bridge port towards h0, tbf-shaped.
tc -n "$P-h0" qdisc add dev "$P-v0" root tbf rate "${RATE_MBIT}mbit" burst 32kbit latency 50ms \
  || fail "tbf on the long link"
tc -n "$P-r" qdisc add dev "$P-p0" root tbf rate "${RATE_MBIT}mbit" burst 32kbit latency 50ms

"$DCR" synth --preset tiny --rate 0.03 --steps 2 --out "$WORK/ckpt" -q >"$WORK/synth.log" 2>&1 \
  || fail "dcr synth"
cat > "$WORK/s.yaml" <<YAML
name: netns
model: {checkpoints: [$WORK/ckpt/step0.safetensors, $WORK/ckpt/step1.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, streams: 2, window: 4MiB, chunk: 256KiB}
receivers: {count: 3}
network:
  emulation: netns
  hosts: ["$NET.10:7400", "$NET.11:7400", "$NET.12:7400", "$NET.13:7400"]
timeout: 120s
YAML
"$DCR" keys "$WORK/s.yaml" -o "$WORK/keys" >/dev/null 2>"$WORK/keys.log" || fail "dcr keys"
sed -i "/^network:/a\\  tls: {ca: '$WORK/keys/ca.crt', cert: '$WORK/keys/node-{rank}.crt', key: '$WORK/keys/node-{rank}.key'}" "$WORK/s.yaml"

run_refit() {  # $1 = method; writes "refit_seconds payload_bytes" to $WORK/<method>.time
  local method=$1
  PIDS=()
  for r in 3 2 1; do
    ip netns exec "$P-h$r" "$DCR" node "$WORK/s.yaml" --rank "$r" --method "$method" \
      --base "$WORK/ckpt/step0.safetensors" --target "$WORK/ckpt/step1.safetensors" \
      --result "$WORK/$method-$r.json" >"$WORK/$method-$r.log" 2>&1 &
    PIDS+=($!)
  done
  SLURM_PROCID=0 ip netns exec "$P-h0" "$DCR" node "$WORK/s.yaml" --method "$method" \
    --base "$WORK/ckpt/step0.safetensors" --target "$WORK/ckpt/step1.safetensors" \
    --result "$WORK/$method-0.json" >"$WORK/$method-0.log" 2>&1 &
  PIDS+=($!)
  local rc=0
  for pid in "${PIDS[@]}"; do wait "$pid" || rc=1; done
  PIDS=()
  [ $rc = 0 ] || fail "$method: a node failed"
  for r in 1 2 3; do
    grep -q '"verified": true' "$WORK/$method-$r.json" || fail "$method: receiver $r not verified"
  done
  python3 - "$WORK" "$method" > "$WORK/$method.time" <<'PY'
import json, sys
w, m = sys.argv[1], sys.argv[2]
s = json.load(open(f"{w}/{m}-0.json"))
last = max(json.load(open(f"{w}/{m}-{r}.json"))["t_commit"] for r in (1, 2, 3))
print(f"{last - s['t_first_blob']:.3f} {s['payload_bytes']}")
PY
}

run_refit delta
run_refit full
read -r delta_s delta_bytes < "$WORK/delta.time"
read -r full_s full_bytes < "$WORK/full.time"
echo "netns relay tree, ${RATE_MBIT} Mbit/s tbf long link, 3 receivers:"
echo "  delta: ${delta_s} s for ${delta_bytes} bytes; full: ${full_s} s for ${full_bytes} bytes"
python3 - "$full_s" "$full_bytes" "$RATE_MBIT" <<'PY' || fail "the full reference was not paced by tbf"
import sys
t, b, rate = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
floor = 0.8 * b * 8 / (rate * 1e6)
print(f"  full-reference floor from tbf: {floor:.3f} s")
sys.exit(0 if t >= floor else 1)
PY
echo "PASS"
