#!/usr/bin/env bash
# Multi-host form (`dcr node SCENARIO --rank R`, one process per rank, as a cluster launcher starts
# them) with checkpoints that cannot make a delta: the sender refuses at start, before any piece,
# and every node of the tree -- the relay and the receivers below it -- exits naming that cause
# (the tensor), not a closed connection or a timeout, also when the receivers below the relay come
# up only after the refusal. A directory store without a path is refused.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 1 --out "$tmp/a" -q >/dev/null 2>&1; check synth-a 0 $?
"$dcr" synth --preset tiny-moe --rate 3% --steps 1 --out "$tmp/b" -q >/dev/null 2>&1; check synth-b 0 $?
base="$tmp/a/step0.safetensors"; target="$tmp/b/step0.safetensors"
port=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/s.yaml" <<YAML
name: refusal
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, streams: 1}
receivers: {count: 3}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))", "127.0.0.1:$((port + 3))"]
timeout: 60s
YAML
"$dcr" keys "$tmp/s.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
sed -i "/^network:/a\\  tls: {ca: '$tmp/keys/ca.crt', cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}" "$tmp/s.yaml"
# round NAME LATE: the relay (rank 1) and the sender start; the receivers below the relay start
# before them, or, with LATE=1, a second after the sender refused, so the refusal reaches the
# relay while it is still connecting its children and must be sent to each once its link is up.
round() {
  local name=$1 late=$2 pids=() r cause
  start_rank() {
    "$dcr" node "$tmp/s.yaml" --rank "$1" --base "$base" --target "$target" \
      >"$tmp/$name-node-$1.out" 2>"$tmp/$name-node-$1.err" &
    pids[$1]=$!
  }
  if [ "$late" = 0 ]; then start_rank 3; start_rank 2; fi
  start_rank 1
  SLURM_PROCID=0 "$dcr" node "$tmp/s.yaml" --base "$base" --target "$target" \
    >"$tmp/$name-node-0.out" 2>"$tmp/$name-node-0.err"
  check "$name-sender-refuses" 14 $?
  if [ "$late" = 1 ]; then sleep 1; start_rank 3; start_rank 2; fi
  has "$name-sender-names-tensor" "$tmp/$name-node-0.err" "sender: "
  has "$name-sender-says-full" "$tmp/$name-node-0.err" "full frame"
  cause=$(sed -n 's/.*FAILED_PRECONDITION: sender: \(.*\)/\1/p' "$tmp/$name-node-0.err" |
    head -c 60)
  [ -n "$cause" ]; check "$name-sender-cause-found" 0 $?
  for r in 3 2 1; do
    wait "${pids[$r]}"; check "$name-node-$r-aborted" 20 $?
    has "$name-node-$r-names-the-cause" "$tmp/$name-node-$r.err" \
      "the refit was refused upstream (received from node"
    has "$name-node-$r-carries-the-sender-message" "$tmp/$name-node-$r.err" "$cause"
    lacks "$name-node-$r-no-closed-peer" "$tmp/$name-node-$r.err" "peer closed"
  done
}
round up 0
round late 1

# A multi-host object-store run over a directory store names its store path: there is no default
# in the system temp dir for another local user to create first.
cat > "$tmp/os.yaml" <<YAML
name: refusal-os
model: {checkpoints: [$base, $base]}
receivers: {count: 1}
timeout: 10s
YAML
"$dcr" node "$tmp/os.yaml" --rank 1 --transport object_store --base "$base" --target "$base" \
  >/dev/null 2>"$tmp/os.err"
check store-path-required 11 $?
has store-path-names-key "$tmp/os.err" "transport.object_store.path"
exit $fail
