#!/usr/bin/env bash
# A deployment on seven emulated hosts (network namespaces on a bridge), run as deploy/ describes
# it: deploy/deployment.yaml with this test's paths and addresses, `dcr keys` once, one
# `dcr-node deployment.yaml --state DIR --result FILE` per receiver host with its rank in RANK
# (the systemd unit and the Kubernetes StatefulSet) or SLURM_PROCID (the Slurm batch script),
# and the trainer (cluster_trainer.c, a C program against dcr/publisher_c.h) as rank 0, which
# decides while it runs when to hand each version. In the run:
#   - rank 6 never starts: ranks 1-4 commit version 1 without it, within the per-version bound
#     below, and the trainer names rank 6 dead (stderr, version 1's result, /healthz);
#   - rank 3 is killed with kill -9 after version 1 and started again after version 2: it
#     catches up from the in-region store and is back in the joint commit;
#   - the trainer is killed with kill -9 while it "trains" version 3 and started again: it
#     resumes at version 3 (dcr_publisher_next_version), and no receiver exits meanwhile;
#   - rank 5 joins late, after version 2, and catches up;
#   - rank 4 is killed with kill -9 in the middle of version 4's transfer (the link into its host
#     paced so that the transfer lasts seconds) and started again at once: it ends bit-exact, and
#     the trainer counts it in the joint commit of versions 5 and 6 (its per-version results).
# The deployment names no version count (model.base): the trainer stops after version 6 on its
# own and the receivers serve version 6 until they are stopped with SIGTERM. Every version each
# host commits is checked with the user-facing commands right after the version is out: `dcr
# export` writes the version the host holds from its --state (proven against the trainer's signed
# commitment first) and `dcr verify` compares it with the trainer's file, byte for byte; `dcr
# report` reads the node results.
# Then a second deployment in the same directories (`dcr keys` again): it must start fresh.
# Usage: cluster_test.sh DCR DCR_NODE CLUSTER_TRAINER DEPLOYMENT_YAML
# Exit 0 pass, 1 fail, 77 skipped (no root or no ip netns). Bounded: about a minute.
set -uo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
DCR=$(abs "$1"); NODE=$(abs "$2"); TRAINER=$(abs "$3"); TEMPLATE=$(abs "$4")
VERSION_BOUND_S=${DCR_CLUSTER_VERSION_BOUND_S:-20}  # each version out within this
P=dcrc$$
NET=10.214.$(( $$ % 200 + 20 ))
HOSTS=7
source "$(dirname "$0")/../netns/netns_lib.sh"
netns_require

W=$(mktemp -d /tmp/dcr-cluster-XXXXXX)
declare -a pids
trainer_pid=""
cleanup() {
  for pid in "${pids[@]}" $trainer_pid; do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  netns_delete "$P" "$HOSTS"
  [ -n "${DCR_CLUSTER_KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
die() {
  echo "FAIL $*"
  for f in "$W"/h*/log "$W"/h0/trainer.*; do [ -f "$f" ] && { echo "== $f"; tail -8 "$f"; }; done
  exit 1
}

netns_hosts "$P" "$NET" "$HOSTS" || die "netns set-up"
hosts=""
for ((i = 0; i < HOSTS; i++)); do hosts="$hosts${hosts:+, }\"$(netns_addr "$NET" "$i"):7400\""; done
mkdir -p "$W/srv/region-store" "$W/etc" "$W/gate"
"$DCR" synth --preset tiny --rate 3% --steps 7 --out "$W/srv/ckpt" -q >/dev/null 2>&1 \
  || die "dcr synth"
# The example deployment with this test's directories and addresses (hosts: one line here).
python3 - "$TEMPLATE" "$W" "$hosts" > "$W/deployment.yaml" <<'PY' || die "deployment.yaml"
import re, sys
text = open(sys.argv[1]).read()
text = text.replace("/srv/dcr", sys.argv[2] + "/srv").replace("/etc/dcr", sys.argv[2] + "/etc")
text, n = re.subn(r"hosts: \[[^\]]*\]", "hosts: [%s]" % sys.argv[3], text)
assert n == 1
sys.stdout.write(text)
PY
S=$W/deployment.yaml
"$DCR" keys "$S" -o "$W/etc/keys" >/dev/null 2>"$W/keys.log" || die "dcr keys: $(cat "$W/keys.log")"

# start_node R: host R's dcr-node as the examples start it (odd ranks: RANK, as the systemd
# unit and the StatefulSet set it; even ranks: SLURM_PROCID, as srun sets it).
start_node() {
  local r=$1 var=RANK
  [ $((r % 2)) = 0 ] && var=SLURM_PROCID
  mkdir -p "$W/h$r"
  (cd "$W/h$r" && exec ip netns exec "$P-h$r" env "$var=$r" "$NODE" "$S" \
     --state "$W/h$r/state" --result "$W/h$r/result.json") >>"$W/h$r/log" 2>&1 &
  pids[$r]=$!
}
start_trainer() {
  mkdir -p "$W/h0"
  ip netns exec "$P-h0" "$TRAINER" "$S" "$W/h0/state" "$W/h0/work" "$W/srv/ckpt" "$W/gate" \
    >>"$W/h0/trainer.out" 2>>"$W/h0/trainer.err" &
  trainer_pid=$!
}
# publish K: opens the trainer's gate of version K and waits (bounded) until it reports K out;
# sets `line` to the trainer's line.
publish() {
  local k=$1
  line=""
  touch "$W/gate/$k"
  for _ in $(seq 600); do
    line=$(grep "^version $k: " "$W/h0/trainer.out" | tail -1)
    [ -n "$line" ] && break
    kill -0 "$trainer_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$line" ] || die "version $k: the trainer did not publish it"
  echo "     $line"
}
# state R: host R's state directory for the deployment running (the newest deployment-<id>
# inside --state where the state is scoped by deployment, else --state itself).
state() {
  local d newest
  d="$W/h$1/state"
  newest=$(ls -dt "$d"/deployment-* 2>/dev/null | head -1)
  echo "${newest:-$d}"
}
# export R OUT: host R's held version written by `dcr export` (from its --state, proven against
# the trainer's signed commitment) to OUT; prints the version exported, nothing on failure (the
# error in $W/export.out).
export_held() {
  "$DCR" export "$S" --rank "$1" --state "$W/h$1/state" -o "$2" --json >"$W/export.out" 2>&1 &&
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$W/export.out"
}
# check_version K RANKS...: each rank's held version, exported with `dcr export`, is version K and
# byte for byte the trainer's file, by `dcr verify` (waits a little for the version log's commit
# after the report).
check_version() {
  local k=$1 r f v; shift
  for r in "$@"; do
    f="$W/export-$r.safetensors"
    for _ in $(seq 100); do
      v=$(export_held "$r" "$f")
      [ "$v" = "$k" ] && break
      sleep 0.1
    done
    if [ "$v" != "$k" ]; then
      bad "rank $r, version $k: dcr export gave version '${v}': $(cat "$W/export.out")"
      return
    fi
    if ! "$DCR" verify -q "$f" "$W/srv/ckpt/step$k.safetensors" >"$W/verify.out" 2>&1; then
      bad "rank $r, version $k: dcr verify: $(cat "$W/verify.out")"
      return
    fi
  done
  ok "version $k: ranks $* exported by dcr export, verified by dcr verify against the trainer's checkpoint"
}
# in_bound LINE: the trainer's "version K: ... S s" line shows rc 0 and S within the bound.
in_bound() {
  python3 - "$1" "$VERSION_BOUND_S" <<'PY'
import re, sys
m = re.match(r"version (\d+): rc (\d+), (\d+) receivers committed, ([\d.]+) s", sys.argv[1])
sys.exit(0 if m and m.group(2) == "0" and float(m.group(4)) <= float(sys.argv[2]) else 1)
PY
}
alive() {  # alive RANKS...: how many of their processes run
  local n=0 r
  for r in "$@"; do kill -0 "${pids[$r]}" 2>/dev/null && n=$((n + 1)); done
  echo $n
}
# health R PATTERN: polls host R's /healthz until it matches PATTERN (extended regex), 30 s.
health() {
  local b
  for _ in $(seq 300); do
    b=$(ip netns exec "$P-h$1" curl -s --max-time 1 \
          "http://$(netns_addr "$NET" "$1"):$((9400 + $1))/healthz")
    echo "$b" | grep -qE "$2" && { echo "$b" | tr '\n' ' '; return 0; }
    sleep 0.1
  done
  return 1
}

t0=$(date +%s)
for r in 4 3 2 1; do start_node "$r"; done
start_trainer
# Version 1 with rank 5 not yet there and rank 6 never: the others commit it, the trainer names
# both dead, and rank 6's parent names its lost child.
health 0 "receivers declared dead: (.*, )?6" > "$W/health-0" & hp=$!
publish 1
in_bound "$line" || bad "version 1 not out within ${VERSION_BOUND_S} s with rank 6 absent: $line"
wait "$hp" && ok "the trainer's /healthz names rank 6: $(cat "$W/health-0")" \
  || bad "the trainer's /healthz did not name rank 6"
grep -q "receiver 6 declared dead at version 1" "$W/h0/trainer.err" \
  && ok "the trainer's log names rank 6 dead at version 1" || bad "rank 6 not named in the log"
python3 - "$(state 0)/node-0-v1.json" <<'PY' && ok "version 1's result names rank 6 dead" \
  || bad "version 1's result"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] and any(d.startswith("6:") for d in r["declared_dead"]), r
PY
check_version 1 1 2 3 4

# Rank 3 killed with -9; version 2 goes out without it.
kill -9 "${pids[3]}"; wait "${pids[3]}" 2>/dev/null
publish 2
in_bound "$line" || bad "version 2 not out within ${VERSION_BOUND_S} s with rank 3 killed: $line"
check_version 2 1 2 4
# The trainer killed with -9 while it trains version 3; rank 3 restarted, rank 5 joins late.
for _ in $(seq 100); do grep -q "^next version 3$" "$W/h0/trainer.out" && break; sleep 0.1; done
kill -9 "$trainer_pid"; wait "$trainer_pid" 2>/dev/null
start_node 3
start_node 5
sleep 2  # the trainer's restart takes a while; no receiver may exit meanwhile
[ "$(alive 1 2 3 4 5)" = 5 ] && ok "5/5 receivers running with the trainer dead" \
  || bad "$(alive 1 2 3 4 5)/5 receivers running with the trainer dead"
: > "$W/h0/trainer.out"
start_trainer
for _ in $(seq 300); do grep -q "^next version" "$W/h0/trainer.out" && break; sleep 0.1; done
grep -q "^next version 3$" "$W/h0/trainer.out" && ok "the restarted trainer resumes at version 3" \
  || die "the restarted trainer: $(head -1 "$W/h0/trainer.out") $(cat "$W/h0/trainer.err")"
publish 3
in_bound "$line" || bad "version 3 not out within ${VERSION_BOUND_S} s: $line"
check_version 3 1 2 4
# Rank 4 killed with kill -9 in the middle of version 4's transfer and started again at once: the
# link into its host is paced (tc tbf, 1 Mbit/s) so that the transfer lasts seconds, and the kill
# comes once its /metrics show version 4's bytes arriving and nothing committed. It resumes the
# version (or, declared dead, catches up); the returning rank 3 and the late rank 5 commit it.
ip netns exec "$P-r" tc qdisc add dev "$P-p4" root tbf rate 1mbit burst 16kb latency 5s \
  || bad "tc: cannot pace the link into host 4"
touch "$W/gate/4"
mid=""
for _ in $(seq 200); do
  m=$(ip netns exec "$P-h4" curl -s --max-time 1 "http://$(netns_addr "$NET" 4):9404/metrics")
  target=$(echo "$m" | awk '/^dcr_version_target\{/ {print $2}')
  committed=$(echo "$m" | awk '/^dcr_node_committed\{/ {print $2}')
  got=$(echo "$m" | awk '/^dcr_bytes_received_total\{/ {print $2}')
  if [ "$target" = 4 ] && [ "$committed" = 0 ] && [ "${got:-0}" != 0 ]; then
    kill -9 "${pids[4]}"; wait "${pids[4]}" 2>/dev/null
    start_node 4
    mid="$got"
    break
  fi
  sleep 0.1
done
[ -n "$mid" ] && ok "rank 4 killed with kill -9 mid-transfer (version 4, $mid bytes in, not \
committed) and started again" || bad "rank 4 was never seen mid-transfer of version 4"
publish 4
ip netns exec "$P-r" tc qdisc del dev "$P-p4" root 2>/dev/null
in_bound "$line" || bad "version 4 not out within ${VERSION_BOUND_S} s: $line"
check_version 4 1 2 3 5
# What rank 4 committed of version 4 after its kill is the trainer's too (skipped when it took
# version 5 as a full frame instead).
for _ in $(seq 50); do [ -f "$(state 4)/node-4-v4.json" ] && break; sleep 0.1; done
[ "$(export_held 4 "$W/export-4.safetensors")" = 4 ] && check_version 4 4
# The versions after the kill: every receiver commits them, the restarted rank 4 included, and
# the trainer counts it (its line and its per-version result: rank 4's committed report, rank 4
# not declared dead).
for k in 5 6; do
  publish "$k"
  in_bound "$line" || bad "version $k not out within ${VERSION_BOUND_S} s: $line"
  echo "$line" | grep -q ", 5 receivers committed" || bad "version $k: not all 5 receivers"
  check_version "$k" 1 2 3 4 5
  python3 - "$(state 0)/node-0-v$k.json" <<'PY' \
    && ok "version $k: the trainer counts the restarted rank 4 in the joint commit" \
    || bad "version $k: the trainer does not count the restarted rank 4"
import json, sys
r = json.load(open(sys.argv[1]))
ranks = sorted(c["rank"] for c in r.get("reports", []) if c.get("ok"))
dead = r.get("declared_dead", [])
assert r["ok"] and 4 in ranks and not any(d.startswith("4:") for d in dead), (ranks, dead)
PY
done
# The trainer decides to stop after version 6 (nothing in the deployment says how many): it
# closes the publisher and exits 0; the receivers keep serving version 6 until they are
# stopped, as a service manager stops them, with SIGTERM.
stop_deployment() {  # stop_deployment LAST_VERSION
  local r rc
  touch "$W/gate/stop"
  wait "$trainer_pid"; rc=$?
  [ "$rc" = 0 ] && grep -q "^stopping before version $(( $1 + 1 ))$" "$W/h0/trainer.out" \
    && ok "the trainer stopped on its own after version $1, exit 0" || bad "trainer exit $rc"
  sleep 1
  [ "$(alive 1 2 3 4 5)" = 5 ] && ok "5/5 receivers still serving version $1" \
    || bad "$(alive 1 2 3 4 5)/5 receivers running after the trainer stopped"
  for r in 1 2 3 4 5; do kill -TERM "${pids[$r]}"; done
  for r in 1 2 3 4 5; do
    wait "${pids[$r]}"; rc=$?
    [ "$rc" = 143 ] && grep -q "stopped by SIGTERM after version $1 " "$W/h$r/result.json" \
      || bad "rank $r: exit $rc after SIGTERM: $(tail -2 "$W/h$r/log")"
  done
}
stop_deployment 6
took=$(( $(date +%s) - t0 ))
[ "$fail" = 0 ] && ok "ranks 1-5 stopped by SIGTERM after version 6 (exit 143, the result says \
so); the deployment ran in ${took} s"
python3 - $(for r in 1 2 3 4 5; do state "$r"; done) <<'PY' || fail=1
import json, sys
for r, d in zip((1, 2, 3, 4, 5), sys.argv[1:]):
    for v in range(1, 7):
        j = json.load(open("%s/node-%d-v%d.json" % (d, r, v)))
        assert j["ok"], (r, v, j.get("error"))
print("ok   ranks 1-5: every version's result ok")
PY
# The trainer's signed commitment of version 6 is what every receiver's storage was checked
# against at its commit (their results name it).
python3 - "$(state 0)/node-0-v6.json" $(for r in 1 2 3 4 5; do echo "$(state "$r")/node-$r-v6.json"; done) <<'PY' \
  && ok "ranks 1-5 hold the commitment the trainer signed for version 6" || fail=1
import json, sys
signed = json.load(open(sys.argv[1])).get("commitment", "")
assert len(signed) == 64, "the trainer's result names no commitment: %r" % signed
for f in sys.argv[2:]:
    got = json.load(open(f)).get("commitment")
    assert got == signed, "%s: commitment %r, the trainer signed %s" % (f, got, signed)
PY
grep -q "receiver 3 joins the joint commit\|receiver 5 joins the joint commit" "$W/h0/trainer.err" \
  && ok "the restarted rank 3 and the late rank 5 are back in the joint commit" \
  || bad "no receiver rejoined the joint commit"
# `dcr report` of node results: the receivers' version-6 results and final (SIGTERM) results, and
# the trainer's per-version results, found by `dcr report` in its state directory.
results=(); for r in 1 2 3 4 5; do results+=("$(state "$r")/node-$r-v6.json"); done
d0=$(state 0)
if "$DCR" report --no-figures -o "$W/report" "$W"/h[1-5]/result.json "${results[@]}" \
    "$W/h0/state" >"$W/report.out" 2>&1 &&
   grep -qE "^\| $d0/node-0-v1.json \| 0 \| sender \| yes \| .* \| 4 \| (.*; )?6: " \
     "$W/report/summary.md" &&
   [ "$(grep -cE "^\| $d0/node-0-v[1-6].json \| 0 \| sender \| yes \|" \
          "$W/report/summary.md")" = 6 ] &&
   [ "$(grep -cE "^\| $W/h[1-5]/state/deployment-[0-9a-f]{16}/node-[1-5]-v6.json \| [1-5] \| \
(relay|receiver) \| yes \|" \
          "$W/report/summary.md")" = 5 ] &&
   [ "$(grep -cE "^\| $W/h[1-5]/result.json \| [1-5] \| .* stopped by SIGTERM after version 6 " \
          "$W/report/summary.md")" = 5 ]; then
  ok "dcr report: ranks 1-5 ok at version 6 and stopped by SIGTERM, rank 6 dead at version 1"
else
  bad "dcr report of the node results: $(head -5 "$W/report.out")"
fi

# A second deployment in the same directories: new credentials (a new deployment id), the same
# state directories and store. It starts fresh at version 1.
declare -a first
for r in 0 1 2 3 4 5; do
  first[$r]=$(state "$r"); cp "${first[$r]}/node-$r-v1.json" "$W/first-$r-v1.json"
done
{
  # The first deployment's logs stay beside the second's (read with DCR_CLUSTER_KEEP=1).
  for f in "$W"/h*/log "$W/h0/trainer.err"; do cp "$f" "$f.first"; done
  rm -rf "$W/etc/keys" "$W/gate" && mkdir -p "$W/gate"
  "$DCR" keys "$S" -o "$W/etc/keys" >/dev/null 2>"$W/keys.log" || die "dcr keys again"
  for r in 1 2 3 4 5; do : > "$W/h$r/log"; start_node "$r"; done
  : > "$W/h0/trainer.out"; : > "$W/h0/trainer.err"
  start_trainer
  for _ in $(seq 300); do grep -q "^next version" "$W/h0/trainer.out" && break; sleep 0.1; done
  grep -q "^next version 1$" "$W/h0/trainer.out" && ok "the second deployment starts at version 1" \
    || die "second deployment: $(head -1 "$W/h0/trainer.out") $(cat "$W/h0/trainer.err")"
  for k in 1 2 3; do
    publish "$k"
    echo "$line" | grep -q "rc 0, 5 receivers committed" || bad "second deployment: $line"
    check_version "$k" 1 2 3 4 5
  done
  stop_deployment 3
  kept=0
  for r in 0 1 2 3 4 5; do
    [ "$(state "$r")" != "${first[$r]}" ] && [ -f "$(state "$r")/node-$r-v3.json" ] &&
      cmp -s "${first[$r]}/node-$r-v1.json" "$W/first-$r-v1.json" && kept=$((kept + 1))
  done
  [ "$kept" = 6 ] && ok "the second deployment's results are its own; the first's are kept" \
    || bad "$kept/6 hosts kept the first deployment's results apart from the second's"
}
[ "$fail" = 0 ] && echo PASS
exit $fail
