#!/usr/bin/env bash
# A child that accepts its parent's connection and closes it (a broken middle box, a node that
# refuses its parent) with real dcr-node processes of a recovering chain 0 -> 1 -> 2: node 1's
# child connection goes to a listener that accepts and closes, so node 1 counts its child lost
# and falls back to the in-region store, and node 2 never hears from a parent. Node 2 notices
# the stream whole in the store with no parent for a read deadline (1 s), counts its parent
# lost and downloads; every node ends within seconds, not at its 120 s timeout, both receivers
# bit-exact.
set -uo pipefail
DCR=$1
work=$(mktemp -d)
closer_pid=
trap '[ -n "$closer_pid" ] && kill "$closer_pid" 2>/dev/null; rm -rf "$work"' EXIT
dir="$work/w"
cat > "$work/s.yaml" <<YAML
name: lost-child
mode: real
model: {preset: tiny, seed: 3, work_dir: $dir}
change_rate: 3%
steps: 1
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 1, root_fan_out: 1}
receivers: {count: 2}
network:
  tls: false
  heartbeat: 200ms
  read_deadline: 1s
YAML
# A plain run writes the plans (state directory, in-region store, addresses) reused below.
"$DCR" run -q "$work/s.yaml" --out "$work/first.json" > "$work/first.txt" 2>&1 || { echo "first run failed"; cat "$work/first.txt"; exit 1; }
run="$dir/run-1"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 - "$port" > "$work/closer.log" 2>&1 <<'PY' &
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept()
    c.close()
    print("accepted and closed", flush=True)
PY
closer_pid=$!
python3 - "$run" "$port" <<'PY'
import json, sys
run, port = sys.argv[1], sys.argv[2]
for r in range(3):
    p = json.load(open("%s/plan-%d.json" % (run, r)))
    p["timeout_s"] = 120.0
    p["result_path"] = "%s/again-%d.json" % (run, r)
    if r == 1:
        p["addresses"][2] = "127.0.0.1:" + port  # node 1's child: the listener that closes
    json.dump(p, open("%s/again-plan-%d.json" % (run, r), "w"))
PY
rm -rf "$run/state" "$run/region-store" "$run/go" "$run"/ready-*
mkdir -p "$run/region-store"
start=$SECONDS
pids=()
for r in 2 1; do
  "$DCR" node --plan "$run/again-plan-$r.json" > "$work/n$r.out" 2> "$work/n$r.err" &
  pids+=($!)
done
for _ in $(seq 1 200); do [ -e "$run/ready-1" ] && [ -e "$run/ready-2" ] && break; sleep 0.05; done
touch "$run/go"
"$DCR" node --plan "$run/again-plan-0.json" > "$work/n0.out" 2> "$work/n0.err"; rc0=$?
wait "${pids[1]}"; rc1=$?
wait "${pids[0]}"; rc2=$?
took=$((SECONDS - start))
fail=0
for r in 0 1 2; do
  eval rc=\$rc$r
  if [ "$rc" != 0 ]; then echo "node $r: exit $rc"; cat "$work/n$r.err"; fail=1; fi
done
grep -q "accepted and closed" "$work/closer.log" || { echo "node 1 never connected to the closing child"; fail=1; }
grep -q "parent node 1 never connected and the stream is whole in the store: parent lost" "$work/n2.err" ||
  { echo "node 2 did not count its parent lost"; cat "$work/n2.err"; fail=1; }
[ "$took" -lt 60 ] || { echo "took $took s: the nodes waited for their timeout"; fail=1; }
python3 - "$run" <<'PY' || fail=1
import json, sys
for r in (1, 2):
    j = json.load(open("%s/again-%d.json" % (sys.argv[1], r)))
    assert j["verified"], (r, j.get("verify_message"), j.get("error"))
    assert j["recovery"]["fallbacks"] >= 1, (r, j["recovery"])
print("child that accepts and closes: nodes 1 and 2 fell back to the store, both bit-exact")
PY
[ $fail = 0 ] && echo "every node done in $took s (timeout 120 s)"
exit $fail
