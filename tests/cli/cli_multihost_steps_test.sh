#!/usr/bin/env bash
# The multi-host form in its long-lived mode, against the real binaries: one `dcr-node SCENARIO
# --rank R` process per rank on loopback (each with its own host directory and --state), three
# versions from the scenario's model.checkpoints over a TLS relay tree with signed deltas. A
# scheduler loop per rank restarts a node that was killed (exit 137), as a cluster scheduler
# would (dcr run's supervisor does the same: a node that dies or fails is restarted, 8 times at
# most). The test kills, each with -9 shortly after it started its version, the long-link relay
# (rank 1) in version 1, the sender in version 2 and a leaf (rank 3) in version 3 (KILLS="R:V
# ..." picks others): each comes back at the version it holds, every rank exits 0 within the
# scenario's 30 s per-version timeout, every receiver is verified byte for byte at every
# version, and every receiver's own commit report of every version reaches the sender (a child
# still in version k keeps its parent's connection for k+1 rather than refusing it:
# node/held_hellos.h). Also: the sender's refusal of a version without a checkpoint, and --state
# with --target.
source "$(dirname "$0")/cli_lib.sh" "$@"
node="$(cd "$(dirname "$dcr")" && pwd)/dcr-node"
"$dcr" synth --preset tiny --rate 3% --steps 4 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
port=$(( 20000 + RANDOM % 12000 ))
scenario() {  # scenario FILE [NETWORK-LINES]
  cat > "$1" <<YAML
name: multihost-steps
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors, $ck/step3.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
  object_store: {kind: dir, path: $tmp/region-store}
receivers: {count: 3}
delta: {chunk_elems: 16384}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))", "127.0.0.1:$((port + 3))"]
  long_link: {bandwidth: 2Mbit/s, latency: 20ms}
  emulation: transport
${2:-}
timeout: 30s
YAML
}
scenario "$tmp/shape.yaml"
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
scenario "$tmp/s.yaml" "  tls: {ca: $tmp/keys/ca.crt, cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}
  signing: {key: $tmp/keys/trainer.key, trust: $tmp/keys/trainer.pub}"
mkdir -p "$tmp/region-store"

supervise() {  # supervise RANK: rank R's node, started again when it dies or fails (8 times at most)
  local r=$1 rc
  mkdir -p "$tmp/h$r"
  echo 0 > "$tmp/h$r/restarts"
  while :; do
    (cd "$tmp/h$r" && exec "$node" "$tmp/s.yaml" --rank "$r" --state "$tmp/h$r/state" \
      --result "$tmp/h$r/result.json") >>"$tmp/h$r/log" 2>&1 &
    echo $! > "$tmp/h$r/pid"
    wait $!; rc=$?
    echo "exit $rc" >> "$tmp/h$r/exits"
    if [ "$rc" = 0 ] || [ "$(cat "$tmp/h$r/restarts")" -ge 8 ]; then echo "$rc" > "$tmp/h$r/rc"; return; fi
    echo $(( $(cat "$tmp/h$r/restarts") + 1 )) > "$tmp/h$r/restarts"
  done
}
sups=()
for r in 3 2 1 0; do supervise "$r" & sups+=($!); done
trap 'for r in 0 1 2 3; do kill -9 "$(cat "$tmp/h$r/pid" 2>/dev/null)" 2>/dev/null; done; rm -rf "$tmp"' EXIT
kill_in() {  # kill_in RANK VERSION: kill -9 RANK's node a while after it started VERSION
  local r=$1 v=$2
  for _ in $(seq 1 1200); do
    compgen -G "$tmp/h$r/state/deployment-*/v$v/rank-$r.starts" >/dev/null && break
    sleep 0.05
  done
  sleep 0.3
  kill -9 "$(cat "$tmp/h$r/pid")"; check "kill-rank-$r-in-v$v" 0 $?
}
kills=${KILLS:-1:1 0:2 3:3}
start=$(date +%s)
for k in $kills; do kill_in "${k%%:*}" "${k##*:}"; done
wait "${sups[@]}"
echo "ok   every rank done $(( $(date +%s) - start )) s after the first kill"
for r in 0 1 2 3; do check "rank-$r-exit" 0 "$(cat "$tmp/h$r/rc")"; done
for k in $kills; do
  r=${k%%:*}
  grep -q "exit 137" "$tmp/h$r/exits"; check "rank-$r-killed-and-restarted" 0 $?
done
# No node failed or ran out of time: a rank's only restarts are its kills.
for r in 0 1 2 3; do
  want=""
  for k in $kills; do [ "${k%%:*}" = "$r" ] && want="${want}exit 137 "; done
  got=$(tr '\n' ' ' < "$tmp/h$r/exits")
  if [ "$got" = "${want}exit 0 " ]; then echo "ok   rank-$r-exits: $got"; else
    echo "FAIL rank-$r-exits: '$got', expected '${want}exit 0 '"; tail -5 "$tmp/h$r/log"; fail=1; fi
done
python3 - "$tmp" <<'PY'; check versions-verified 0 $?
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment's directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
tmp = sys.argv[1]
for v in (1, 2, 3):
    s = json.load(open(result_of("%s/h0/state/node-0-v%d.json" % (tmp, v))))
    assert s["ok"], (v, s)
    for r in (1, 2, 3):
        j = json.load(open(result_of("%s/h%d/state/node-%d-v%d.json" % (tmp, r, r, v))))
        assert j["ok"] and j["verified"], (r, v, j.get("error"), j.get("verify_message"))
        assert j["verify_message"] == "byte-for-byte equal to the target", j
    # Every receiver's own commit report of every version reaches the sender (through the tree
    # or the in-region store); none is declared dead.
    reported = {c["rank"] for c in s["reports"]
                if c["ok"] and c["version"] == v and c["target_hash"] == s["target_hash"]}
    assert reported == {1, 2, 3}, (v, s["reports"], s.get("declared_dead"))
    assert not s.get("declared_dead"), (v, s["declared_dead"])
print("ok   3 versions x 3/3 receivers verified byte for byte, 3/3 reports each")
PY
# The process after each kill took part: the victim's result of the version it was killed in
# counts two starts of that version or more.
python3 - "$tmp" $kills <<'PY'; check restarted-process-took-part 0 $?
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment's directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
tmp = sys.argv[1]
for k in sys.argv[2:]:
    r, v = (int(x) for x in k.split(":"))
    j = json.load(open(result_of("%s/h%d/state/node-%d-v%d.json" % (tmp, r, r, v))))
    assert j["recovery"]["starts"] >= 2, (r, v, j["recovery"])
PY

# The sender of a preset scenario has no checkpoints for its versions: refused, naming the C API.
sed -e "s|model: {checkpoints: .*|model: {preset: tiny}|" -e "s|^timeout:|steps: 2\ntimeout:|" \
  "$tmp/s.yaml" > "$tmp/preset.yaml"
"$node" "$tmp/preset.yaml" --rank 0 --base "$ck/step0.safetensors" >/dev/null 2>"$tmp/nock.err"
check sender-without-checkpoints 11 $?
has names-publisher "$tmp/nock.err" "dcr/publisher_c.h"
# The one-refit form takes --state too (its versions numbered by the deployment's state): a
# state directory others can write is refused before the node starts, nothing written in it.
mkdir -m 777 "$tmp/x"; chmod 777 "$tmp/x"
"$node" "$tmp/s.yaml" --rank 1 --state "$tmp/x" --base "$ck/step0.safetensors" \
  --target "$ck/step1.safetensors" >/dev/null 2>"$tmp/st.err"
check one-refit-open-state-refused 14 $?
has names-state "$tmp/st.err" "state directory $tmp/x"
[ -z "$(ls -A "$tmp/x")" ]; check one-refit-open-state-untouched 0 $?
exit $fail
