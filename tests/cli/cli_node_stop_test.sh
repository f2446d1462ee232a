#!/usr/bin/env bash
# dcr-node as a launcher and a service manager start and stop it, against the real binary
# (multi-host form, one process per rank on loopback):
#   * the rank from the environment: RANK (torchrun) before SLURM_PROCID; a bad RANK refused;
#   * a relative --result is the starting directory's, written after a one-version refit that
#     the receiver verifies byte for byte; an unwritable result path (a missing folder, a
#     directory) is refused at start, before any peer is reached (exit 11);
#   * SIGTERM (and SIGINT) stop a node waiting for its refit: it writes its result (ok false,
#     "ABORTED: stopped by SIGTERM ..."), logs one line and ends by the signal (status 143, 130);
#     a long-lived receiver stopped so resumes from its --state when started again and commits
#     the version.
source "$(dirname "$0")/cli_lib.sh" "$@"
node="$(cd "$(dirname "$dcr")" && pwd)/dcr-node"
g="$(pwd)/tests/golden"
base="$g/base.safetensors"; target="$g/target.safetensors"
port=$(( 20000 + RANDOM % 12000 ))
cat > "$tmp/s.yaml" <<YAML
name: node-stop
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1}
  object_store: {kind: dir, path: $tmp/store}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
  tls: false
timeout: 60s
YAML
mkdir -p "$tmp/store" "$tmp/h0" "$tmp/h1/out"
pids=()
trap 'kill -9 ${pids[*]:-} 2>/dev/null; rm -rf "$tmp"' EXIT
one_refit=(--base "$base" --target "$target")

# RANK names the rank (before SLURM_PROCID); a relative --result lands in the starting directory.
(cd "$tmp/h1" && RANK=1 SLURM_PROCID=0 exec "$node" "$tmp/s.yaml" "${one_refit[@]}" \
  --result out/r.json) >"$tmp/h1/log" 2>&1 &
pids=($!)
(cd "$tmp/h0" && env -u RANK SLURM_PROCID=0 "$node" "$tmp/s.yaml" "${one_refit[@]}" \
  --result r.json) >"$tmp/h0/log" 2>&1
check sender-from-slurm-procid 0 $?
wait "${pids[0]}"; check receiver-from-rank 0 $?
pids=()
python3 - "$tmp" <<'PY'; check relative-results-verified 0 $?
import json, sys
t = sys.argv[1]
r = json.load(open(t + "/h1/out/r.json"))
assert r["rank"] == 1 and r["ok"] and r["verified"], r
assert r["verify_message"] == "byte-for-byte equal to the target", r["verify_message"]
s = json.load(open(t + "/h0/r.json"))
assert s["rank"] == 0 and s["ok"], s
PY

# Refusals at start: no peer runs, so a node that got past them would wait for one.
refused() {  # refused NAME PATTERN ARGS...: exit 11 within 10 s, stderr naming PATTERN
  local name=$1 pattern=$2; shift 2
  (cd "$tmp/h1" && timeout 10 "$@") >/dev/null 2>"$tmp/refused.err"
  check "$name" 11 $?
  has "$name-says" "$tmp/refused.err" "$pattern"
}
refused result-missing-dir "cannot write in $tmp/h1/missing: No such file or directory" \
  env RANK=1 "$node" "$tmp/s.yaml" "${one_refit[@]}" --result missing/r.json
refused result-is-a-dir "--result $tmp/h1/out: is a directory" \
  env RANK=1 "$node" "$tmp/s.yaml" "${one_refit[@]}" --result out
refused bad-rank "RANK=one: not a non-negative integer" \
  env RANK=one "$node" "$tmp/s.yaml" "${one_refit[@]}"
refused rank-outside "--rank 5: the scenario has ranks 0..1" \
  env RANK=5 SLURM_PROCID=1 "$node" "$tmp/s.yaml" "${one_refit[@]}"
refused no-rank "none of RANK, SLURM_PROCID" \
  env -u RANK -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK -u PMI_RANK "$node" "$tmp/s.yaml" \
  "${one_refit[@]}"

# stop_waiting NAME SIGNAL STATUS ARGS...: rank 1 started with ARGS waits for a sender that never
# comes; SIGNAL stops it within 5 s with STATUS, one log line and its result in h1/stop.json.
stop_waiting() {
  local name=$1 sig=$2 want=$3; shift 3
  rm -f "$tmp/h1/stop.json"
  (cd "$tmp/h1" && RANK=1 exec "$node" "$tmp/s.yaml" "$@" --result stop.json) \
    >"$tmp/h1/stop.out" 2>"$tmp/h1/stop.err" &
  pids=($!)
  sleep 1
  local t0=$SECONDS
  kill -"$sig" "${pids[0]}"
  wait "${pids[0]}"; check "$name-status" "$want" $?
  pids=()
  [ $(( SECONDS - t0 )) -le 5 ]; check "$name-within-5s" 0 $?
  [ "$(grep -c "stopped by SIG$sig" "$tmp/h1/stop.err")" = 1 ]; check "$name-one-log-line" 0 $?
  has "$name-log-names-result" "$tmp/h1/stop.err" "rank 1: ABORTED: stopped by SIG$sig"
  python3 - "$tmp/h1/stop.json" "SIG$sig" "$tmp/h1/stop.out" <<'PY'; check "$name-result" 0 $?
import json, sys
path, sig, out = sys.argv[1:4]
r = json.load(open(path))
assert r["rank"] == 1 and r["role"] == "receiver" and not r["ok"], r
assert r["error"].startswith("ABORTED: stopped by " + sig + " "), r["error"]
assert json.loads(open(out).read()) == r  # the scenario form also prints it
print("     " + r["error"])
PY
}
stop_waiting one-refit-sigterm TERM 143 "${one_refit[@]}"
has one-refit-progress "$tmp/h1/stop.json" "before its refit finished"
stop_waiting one-refit-sigint INT 130 "${one_refit[@]}"
stop_waiting long-lived-sigterm TERM 143 --state "$tmp/h1/state"
has long-lived-progress "$tmp/h1/stop.json" "before this process finished a version (versions 1..1)"

# The stopped long-lived receiver resumes from its state with a sender and commits the version.
(cd "$tmp/h1" && RANK=1 exec "$node" "$tmp/s.yaml" --state "$tmp/h1/state" --result again.json) \
  >"$tmp/h1/again.log" 2>&1 &
pids=($!)
(cd "$tmp/h0" && RANK=0 "$node" "$tmp/s.yaml" --state "$tmp/h0/state" --result ll.json) \
  >"$tmp/h0/ll.log" 2>&1
check long-lived-sender 0 $?
wait "${pids[0]}"; check resumed-receiver 0 $?
pids=()
python3 - "$tmp/h1" <<'PY'; check resumed-receiver-verified 0 $?
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment's directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
d = sys.argv[1]
r = json.load(open(d + "/again.json"))
assert r["ok"] and r["verified"], r
assert r["recovery"]["starts"] >= 2, r["recovery"]
v = json.load(open(result_of(d + "/state/node-1-v1.json")))
assert v["ok"] and v["verify_message"] == "byte-for-byte equal to the target", v
PY
exit $fail
