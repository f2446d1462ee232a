#!/usr/bin/env bash
# A real dcr-node that holds private keys (its run certificate's key; multi-host form with the
# keys of `dcr keys`), waiting for its parent: its core file limit is 0 (/proc/PID/limits) and it
# is not dumpable (the files of /proc/PID are then root's: checked with the node run as an unprivileged
# user when the test runs as root, or as the test's own user otherwise). Its metrics endpoint,
# held by three silent connections, still answers /healthz at once (within 1 s; each silent
# connection may be held 2 s). Label `adversary`; a few seconds.
#   key_holder_test.sh DCR
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
py=/usr/bin/python3
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/m" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/m/step0.safetensors"; target="$tmp/m/step1.safetensors"
port=$(( 20000 + RANDOM % 12000 )); mport=$((port + 10))
cat > "$tmp/s.yaml" <<YAML
name: keyholder
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1, streams: 1}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
  metrics_port: $mport
timeout: 60s
YAML
"$dcr" keys "$tmp/s.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
sed -i "/^network:/a\\  tls: {ca: '$tmp/keys/ca.crt', cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}" "$tmp/s.yaml"
run_as=()
if [ "$(id -u)" -eq 0 ]; then
  # As root /proc/PID is root's anyway: run the node as nobody, which then owns what it reads.
  if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
    chmod 755 "$tmp"; chown -R nobody: "$tmp/keys" "$tmp/m" "$tmp/s.yaml"
    run_as=(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups)
  fi
fi
ulimit -S -c "$(ulimit -H -c)"  # the node starts with core dumps allowed as far as they may be
"${run_as[@]}" "$dcr" node "$tmp/s.yaml" --rank 1 --base "$base" --target "$target" \
  >"$tmp/n1.out" 2>"$tmp/n1.err" &
node=$!
trap 'kill $node 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do  # the node listens for its parent once its TLS context (its key) is loaded
  "$py" -c "import socket; socket.create_connection(('127.0.0.1', $((port + 1))), 0.2)" 2>/dev/null && break
  sleep 0.1
done
pid=$(pgrep -P "$node" -f "dcr" | head -1); [ -n "$pid" ] || pid=$node
kill -0 "$pid" 2>/dev/null; check node-waiting 0 $?
grep -E "^Max core file size +0 +0 " "/proc/$pid/limits" >/dev/null; check core-limit-0 0 $?
owner=$(stat -c %u "/proc/$pid/status")
if [ "${#run_as[@]}" -gt 0 ] || [ "$(id -u)" -ne 0 ]; then
  [ "$owner" = 0 ]; check not-dumpable 0 $?
else
  echo "ok   not-dumpable (skipped: root without setpriv or nobody)"
fi
# Three silent connections to the metrics endpoint, then /healthz.
"$py" - $((mport + 1)) <<'PY' &
import socket, sys, time
held = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(3)]
time.sleep(8)
PY
silent=$!
sleep 0.3
t0=$(date +%s.%N)
code=$(curl -s -o "$tmp/health.txt" -w '%{http_code}' --max-time 5 "http://127.0.0.1:$((mport + 1))/healthz")
t1=$(date +%s.%N)
[ "$code" = 200 ]; check healthz-ok 0 $?
awk "BEGIN { exit !($t1 - $t0 < 1.0) }"; check healthz-not-delayed 0 $?
echo "     /healthz answered in $(awk "BEGIN { printf \"%.3f\", $t1 - $t0 }") s behind 3 silent connections"
kill "$silent" 2>/dev/null
kill "$pid" "$node" 2>/dev/null; wait "$node" 2>/dev/null
exit $fail
