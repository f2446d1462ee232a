#!/usr/bin/env bash
# A long-lived node's state directory (`dcr-node --state DIR`) is its own, and a signed
# receiver's version floor lives in it, against the real binaries (multi-host form on loopback:
# a sender and one signed receiver, two versions over TLS):
#   - a state directory readable and writable by all (0777), one owned by another user (as root
#     only) and a symlink are refused at open, naming the path, owner and mode; nothing is
#     written in them and no version is applied;
#   - a fresh one is made 0700, the receiver commits both versions and its floor,
#     DIR/deployment-<id>/rank-1.floor (the deployment `dcr keys` made), records version 2 and
#     names the deployment;
#   - the floor deleted, the restarted receiver refuses to start over (a missing floor would
#     accept a rollback) and applies nothing;
#   - a second deployment (new `dcr keys`) in the same state directories starts fresh: both
#     versions committed again (versions 1 and 2 of the new deployment, never a rollback
#     refusal), in its own deployment directory; the first deployment's state stays as it was.
# Label `adversary` and `quick`; seconds.
#   state_dir_test.sh DCR
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
dcr="$(cd "$(dirname "$dcr")" && pwd)/$(basename "$dcr")"
"$dcr" synth --preset tiny --rate 3% --steps 3 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
ck="$tmp/ck"
port=$(( 20000 + RANDOM % 12000 ))
scenario() {  # scenario FILE [NETWORK-LINES]
  cat > "$1" <<YAML
name: state-dir
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1}
  object_store: {kind: dir, path: $tmp/region-store}
receivers: {count: 1}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))"]
${2:-}
timeout: 30s
YAML
}
scenario "$tmp/shape.yaml"
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
scenario "$tmp/s.yaml" "  tls: {ca: $tmp/keys/ca.crt, cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}
  signing: {key: $tmp/keys/trainer.key, trust: $tmp/keys/trainer.pub}"
mkdir -p "$tmp/region-store" "$tmp/h0" "$tmp/h1"
receiver() {  # receiver STATE LOG: rank 1 with --state STATE (a node that is refused exits at once)
  (cd "$tmp/h1" && exec timeout 60 "$dcr" node "$tmp/s.yaml" --rank 1 --state "$1") >"$2" 2>&1
}
refused() {  # refused NAME STATE PATTERN: rank 1 on STATE exits non-zero saying PATTERN, writes nothing
  local before; before=$(ls -A "$2" 2>/dev/null | wc -l)
  receiver "$2" "$tmp/$1.log"; local rc=$?
  [ "$rc" != 0 ]; check "$1-refused" 0 $?
  has "$1-says-why" "$tmp/$1.log" "$3"
  [ "$(ls -A "$2" | wc -l)" = "$before" ]; check "$1-nothing-written" 0 $?
  has "$1-nothing-received" "$tmp/$1.log" '"bytes_received": 0,'
  has "$1-not-ok" "$tmp/$1.log" '"ok": false,'
}

# Open to every local user.
mkdir "$tmp/open" && chmod 0777 "$tmp/open"
refused open "$tmp/open" "state directory $tmp/open: owner uid $(id -u), mode 0777"
has open-says-what-is-required "$tmp/open.log" "(mode 0700): refusing"
# Made by another user (mode 0700, but not this user's).
if [ "$(id -u)" = 0 ]; then
  mkdir "$tmp/foreign" && chmod 0700 "$tmp/foreign" && chown 65534 "$tmp/foreign"
  refused foreign "$tmp/foreign" "state directory $tmp/foreign: owner uid 65534, mode 0700"
else
  echo "skip foreign (needs root to make a directory of another user)"
fi
# A symlink to a directory of this user's.
mkdir "$tmp/target" && chmod 0700 "$tmp/target" && ln -s "$tmp/target" "$tmp/link"
refused link "$tmp/link" "state directory $tmp/link: not a directory (a symlink"

# A fresh state: made 0700, both versions committed, the floor recorded in it.
state="$tmp/h1/state"
receiver "$state" "$tmp/rx.log" & rx=$!
(cd "$tmp/h0" && exec timeout 60 "$dcr" node "$tmp/s.yaml" --rank 0 --state "$tmp/h0/state") \
  >"$tmp/tx.log" 2>&1
check sender 0 $?
wait $rx; check receiver 0 $?
[ "$(stat -c %a "$state")" = 700 ]; check fresh-state-made-0700 0 $?
dep=$(cat "$tmp/keys/deployment")
ds="$state/deployment-$dep"
has floor-in-state "$ds/rank-1.floor" "version 2"
has floor-names-deployment "$ds/rank-1.floor" "deployment $dep"
[ "$(stat -c %a "$ds")" = 700 ]; check deployment-state-0700 0 $?
[ ! -e "$tmp/h1/version-floor-1" ]; check no-floor-in-work-dir 0 $?

# The floor deleted: the restarted receiver refuses to start over.
rm "$ds/rank-1.floor"
refused floor-deleted "$state" "version floor $ds/rank-1.floor is missing, but state directory $ds records earlier starts of rank 1"
[ ! -e "$ds/rank-1.floor" ]; check floor-not-remade 0 $?

# A second deployment in the same state directories: a fresh start, not a rollback refusal.
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/keys2" >/dev/null 2>&1; check keys-2 0 $?
sed "s|$tmp/keys/|$tmp/keys2/|g" "$tmp/s.yaml" > "$tmp/s2.yaml"
(cd "$tmp/h1" && exec timeout 60 "$dcr" node "$tmp/s2.yaml" --rank 1 --state "$state") \
  >"$tmp/rx2.log" 2>&1 & rx=$!
(cd "$tmp/h0" && exec timeout 60 "$dcr" node "$tmp/s2.yaml" --rank 0 --state "$tmp/h0/state") \
  >"$tmp/tx2.log" 2>&1
check second-deployment-sender 0 $?
wait $rx; check second-deployment-receiver 0 $?
dep2=$(cat "$tmp/keys2/deployment")
has second-deployment-floor "$state/deployment-$dep2/rank-1.floor" "version 2"
has second-deployment-verified "$state/deployment-$dep2/node-1-v2.json" '"verified": true'
[ ! -e "$ds/rank-1.floor" ]; check first-deployment-untouched 0 $?
exit $fail
