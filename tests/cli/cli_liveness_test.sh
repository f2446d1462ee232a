#!/usr/bin/env bash
# Heartbeats and read deadlines on relay-tree edges, with real dcr-node processes (the multi-host
# form, one process per rank, plain TCP): a relay whose parent is slow to come keeps its children
# alive with heartbeats and the refit ends verified; a frozen relay (SIGSTOP: its connections stay
# open, nothing moves, as with a dead host or a partition) is noticed by its children and by the
# sender within the read deadline, which name it, instead of waiting for the global timeout.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/m" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/m/step0.safetensors"; target="$tmp/m/step1.safetensors"
scenario() {  # scenario FILE PORT
  cat > "$1" <<YAML
name: liveness
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, streams: 2}
receivers: {count: 3}
network:
  hosts: ["127.0.0.1:$2", "127.0.0.1:$(($2 + 1))", "127.0.0.1:$(($2 + 2))", "127.0.0.1:$(($2 + 3))"]
  tls: false
  heartbeat: 200ms
  read_deadline: 1s
timeout: 120s
YAML
}
start_below_sender() {  # start_below_sender FILE TAG: receivers 3, 2 and relay 1 in the background
  pids=()
  for r in 3 2 1; do
    "$dcr" node "$1" --rank "$r" --base "$base" --target "$target" \
      >"$tmp/$2-$r.out" 2>"$tmp/$2-$r.err" &
    pids+=($!)
  done
}

# 1. The sender starts 4 read deadlines after the relay connected to its receivers: heartbeats
#    keep those edges up, every receiver verifies.
port=$(( 20000 + RANDOM % 12000 ))
scenario "$tmp/slow.yaml" "$port"
start_below_sender "$tmp/slow.yaml" slow
sleep 4
"$dcr" node "$tmp/slow.yaml" --rank 0 --base "$base" --target "$target" \
  >"$tmp/slow-0.out" 2>"$tmp/slow-0.err"
check slow-parent-sender 0 $?
i=0
for r in 3 2 1; do
  wait "${pids[$i]}"; check "slow-parent-node-$r" 0 $?
  i=$((i + 1))
done
for r in 3 2; do has "slow-parent-receiver-$r-verified" "$tmp/slow-$r.out" "verified"; done

# 2. The relay freezes once it is connected to its receivers; the sender comes and finds it
#    silent. Each names the relay and the read deadline, well inside the 120 s timeout.
port=$(( 20000 + RANDOM % 12000 ))
scenario "$tmp/frozen.yaml" "$port"
start_below_sender "$tmp/frozen.yaml" frozen
relay=${pids[2]}
established_to() {  # established TCP connections whose local port is one of the arguments
  local want; want=$(printf '%04X|' "$@")
  awk -v want="|${want}" 'NR > 1 && $4 == "01" { split($2, a, ":"); if (index(want, "|" a[2] "|")) n++ }
    END { print n + 0 }' /proc/net/tcp
}
for _ in $(seq 100); do  # the relay has connected to both receivers
  [ "$(established_to $((port + 2)) $((port + 3)))" -ge 2 ] && break
  sleep 0.1
done
kill -STOP "$relay"
start=$SECONDS
"$dcr" node "$tmp/frozen.yaml" --rank 0 --base "$base" --target "$target" \
  >"$tmp/frozen-0.out" 2>"$tmp/frozen-0.err"
check frozen-relay-sender-fails 15 $?
has frozen-relay-sender-names-it "$tmp/frozen-0.err" "node 1 (127.0.0.1:$((port + 1))) lost: no bytes from the peer for 1.0 s (read deadline)"
for i in 0 1; do
  r=$((3 - i))
  wait "${pids[$i]}"; check "frozen-relay-receiver-$r-fails" 15 $?
  has "frozen-relay-receiver-$r-names-it" "$tmp/frozen-$r.err" "parent node 1 (127.0.0.1:$((port + 1))): no bytes from the peer for 1.0 s (read deadline)"
done
[ $((SECONDS - start)) -lt 60 ]; check frozen-relay-noticed-before-the-timeout 0 $?
kill -KILL "$relay" 2>/dev/null; wait "$relay" 2>/dev/null
exit $fail
