#!/usr/bin/env bash
# A sender whose version reaches no receiver fails, and says so, against the real binaries: a
# long-lived multi-host deployment on loopback (TLS relay tree, signed deltas, `dcr keys`,
# `receivers.deadline: 2s`) of which only the sender (`dcr-node --rank 0 --state DIR`) starts.
# Its receivers are declared dead at version 1, no receiver committed it: the sender exits
# non-zero, version 1's result (node-0-v1.json in the deployment's state directory) and its
# --result say ok false, receivers_committed 0 and why, and `dcr report` of the state directory
# shows the failed version. A script that gates on the exit or the result cannot mistake it for
# a refit.
source "$(dirname "$0")/cli_lib.sh" "$@"
node="$(cd "$(dirname "$dcr")" && pwd)/dcr-node"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
port=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/s.yaml" <<YAML
name: no-receiver
model: {checkpoints: [$tmp/ck/step0.safetensors, $tmp/ck/step1.safetensors, $tmp/ck/step2.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1}
  object_store: {kind: dir, path: $tmp/region-store}
receivers: {count: 2, deadline: 2s}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
timeout: 60s
YAML
"$dcr" keys "$tmp/s.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
sed -i "/^network:/a\\  tls: {ca: '$tmp/keys/ca.crt', cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}" "$tmp/s.yaml"
mkdir -p "$tmp/region-store" "$tmp/h0"
t0=$(date +%s)
(cd "$tmp/h0" && exec timeout 90 "$node" "$tmp/s.yaml" --rank 0 --state "$tmp/h0/state" \
   --result "$tmp/h0/result.json") >"$tmp/h0/out" 2>"$tmp/h0/err"
rc=$?
took=$(( $(date +%s) - t0 ))
if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then
  echo "ok   the sender exits $rc when no receiver committed version 1 (${took} s)"
else
  echo "FAIL the sender exit $rc with no receiver (${took} s):"; tail -5 "$tmp/h0/err"; fail=1
fi
has no-receiver-logged "$tmp/h0/err" "no receiver committed version 1"
/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import glob, json, sys
t = sys.argv[1]
found = glob.glob(t + "/h0/state/deployment-*/node-0-v1.json")
assert len(found) == 1, found
v = json.load(open(found[0]))
assert not v["ok"] and v["receivers_committed"] == 0, v
assert "no receiver committed version 1" in v["error"], v["error"]
assert len(v["declared_dead"]) == 2, v["declared_dead"]
r = json.load(open(t + "/h0/result.json"))
assert not r["ok"] and "no receiver committed version 1" in r["error"], r
assert not glob.glob(t + "/h0/state/deployment-*/node-0-v2.json"), "version 2 was attempted"
print("ok   version 1's result and the node's result: ok false, 0 receivers committed, why")
PY
"$dcr" report --no-figures -o "$tmp/report" "$tmp/h0/state" >"$tmp/report.out" 2>&1
check report-of-state-dir 0 $?
has report-shows-failed-version "$tmp/report/summary.md" "/node-0-v1.json | 0 | sender | no |"
exit $fail
