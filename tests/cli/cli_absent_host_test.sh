#!/usr/bin/env bash
# Liveness of the multi-host long-lived form against the real binaries: six hosts on loopback
# (one `dcr-node SCENARIO --rank R --state DIR` each, TLS relay tree, signed deltas, fan-out 2),
# four versions, `receivers.deadline: 3s`. Rank 5 never starts: its parent (rank 2) counts it
# lost after the deadline and the rest of the tree goes on; the sender names it dead at version
# 1 (stderr, the version's result and /healthz, as rank 2's /healthz names its lost child) and
# does not wait for it at the later versions. Rank 4 starts late, after the others committed
# version 1: it takes what it missed from the in-region store (re-admitted by the sender if its
# report of version 1 came after the deadline), and its parent relays to it again. Every started
# receiver commits every version, verified byte for byte, and every process exits 0 well inside
# the per-version timeout.
source "$(dirname "$0")/cli_lib.sh" "$@"
node="$(cd "$(dirname "$dcr")" && pwd)/dcr-node"
"$dcr" synth --preset tiny --rate 3% --steps 5 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
port=$(( 20000 + RANDOM % 12000 ))
hosts=""; for r in 0 1 2 3 4 5; do hosts="$hosts${hosts:+, }\"127.0.0.1:$((port + r))\""; done
cat > "$tmp/s.yaml" <<YAML
name: absent-host
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors, $ck/step3.safetensors, $ck/step4.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
  object_store: {kind: dir, path: $tmp/region-store}
receivers: {count: 5, deadline: 3s}
delta: {chunk_elems: 16384}
network:
  hosts: [$hosts]
  metrics_port: $((port + 100))
timeout: 120s
YAML
"$dcr" keys "$tmp/s.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
sed -i "/^network:/a\\  tls: {ca: '$tmp/keys/ca.crt', cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}" "$tmp/s.yaml"
mkdir -p "$tmp/region-store"
start_rank() {  # start_rank R: one host's dcr-node, in its own directory
  mkdir -p "$tmp/h$1"
  (cd "$tmp/h$1" && exec "$node" "$tmp/s.yaml" --rank "$1" --state "$tmp/h$1/state") \
    >"$tmp/h$1/out" 2>"$tmp/h$1/err" &
  pids[$1]=$!
}
declare -a pids
# health_names R PATTERN: polls rank R's /healthz while the sender runs and keeps the first
# answer that matches PATTERN (an extended regex) in $tmp/health-R.
health_names() {
  while kill -0 "${pids[0]}" 2>/dev/null; do
    b=$(curl -s --max-time 1 "http://127.0.0.1:$((port + 100 + $1))/healthz") &&
      echo "$b" | grep -qE "$2" && { echo "$b" > "$tmp/health-$1"; return; }
    sleep 0.2
  done
}
t0=$(date +%s)
for r in 3 2 1 0; do start_rank "$r"; done
health_names 0 "^receivers declared dead: (.*, )?5$" & pollers=($!)
health_names 2 "^children lost: (.*, )?5$" & pollers+=($!)
# Rank 4 comes once ranks 1-3 committed version 1.
for _ in $(seq 600); do
  n=0; for r in 1 2 3; do ls "$tmp/h$r"/state/deployment-*/node-$r-v1.json >/dev/null 2>&1 && n=$((n + 1)); done
  [ "$n" = 3 ] && break; sleep 0.1
done
check "ranks 1-3 committed version 1 without rank 4 and rank 5" 3 "$n"
start_rank 4
for r in 0 1 2 3 4; do
  wait "${pids[$r]}"; rc=$?
  check "rank $r exits 0" 0 "$rc"
  [ "$rc" = 0 ] || tail -5 "$tmp/h$r/err"
done
wait "${pollers[@]}"
took=$(( $(date +%s) - t0 ))
if [ "$took" -lt 90 ]; then echo "ok   whole run in ${took} s"; else echo "FAIL whole run took ${took} s"; fail=1; fi
has "rank 2 names its absent child" "$tmp/h2/err" "node 5 (127.0.0.1:$((port + 5))) lost while connecting"
has "the sender names rank 5 dead" "$tmp/h0/err" "receiver 5 declared dead at version 1"
if [ -f "$tmp/health-0" ] && [ -f "$tmp/health-2" ]; then
  echo "ok   /healthz names rank 5: the sender's '$(tail -1 "$tmp/health-0")', rank 2's '$(tail -1 "$tmp/health-2")'"
else
  echo "FAIL /healthz did not name rank 5 at the sender and at its parent"; fail=1
fi
if grep -qE "of version [2-4] from receivers 5 within" "$tmp/h0/err"; then
  echo "FAIL the sender waited for rank 5 after it declared it dead:"; cat "$tmp/h0/err"; fail=1
else
  echo "ok   the sender does not wait for rank 5 once it is dead"
fi
/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment's directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
t = sys.argv[1]
for v in (1, 2, 3, 4):
    for r in (1, 2, 3, 4):
        j = json.load(open(result_of("%s/h%d/state/node-%d-v%d.json" % (t, r, r, v))))
        assert j["ok"] and j["verified"], (r, v, j.get("error"), j.get("verify_message"))
s = json.load(open(result_of("%s/h0/state/node-0-v1.json" % t)))
assert s["ok"] and any(d.startswith("5:") for d in s.get("declared_dead", [])), s
for v in (2, 3, 4):
    s = json.load(open(result_of("%s/h0/state/node-0-v%d.json" % (t, v))))
    ranks = sorted({c["rank"] for c in s["reports"] if c["ok"] and c["version"] == v})
    assert ranks == [1, 2, 3, 4] and s["receivers_committed"] == 4, (v, ranks, s["receivers_committed"])
print("ok   ranks 1-4 verified byte for byte at versions 1-4; version 1's result names rank 5 dead; "
      "the sender counts 4 receivers committed at versions 2-4")
PY
exit $fail
