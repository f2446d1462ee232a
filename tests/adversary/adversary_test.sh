#!/usr/bin/env bash
# Adversarial suite: performs the attacks of core/docs/security.md ("Protected now") against the
# real binaries and expects each to fail with a clear error, nothing of the attacker's applied,
# written or committed. The local-user attacks run as a second, unprivileged user (dcr-adversary,
# created here when missing), so the test needs root, setpriv and useradd; it skips (exit 77)
# otherwise. Label `adversary` (not part of `quick`); under a minute. The cases, in order:
#   - a second user races the ports of a loopback `dcr run` with its own delta (no certificate,
#     and its own `dcr keys`);
#     it cannot read the run's work dir, plans or keys; a squatter on a receiver port gets no frame;
#   - planted work dirs (the predictable name, one it owns, a world-writable one, a symlink), a
#     planted keys dir, outputs planted as symlinks to a root-owned file;
#   - apply onto a full or read-only tmpfs, into a directory the user may not write;
#   - hostile peers at a waiting node: its delta with no certificate and with its own `dcr keys`,
#     garbage, a silent peer, a 2^62-byte claim, and huge claims from a holder of a run
#     certificate (bounded peak RSS);
#   - a directory store with a symlink out of its root, a 1 TB sparse object in a shared store.
#   adversary_test.sh DCR    (dcr-node is found beside DCR)
set -u
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null || ! command -v useradd >/dev/null; then
  echo "adversary: needs root, setpriv and useradd (runs attackers as a second user); skipped"
  exit 77
fi
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
here=$(cd "$(dirname "$0")" && pwd)
peer="$here/hostile_peer.py"
tls_peer="$here/../cli/tls_peer.py"
py=/usr/bin/python3  # not a shim under root's home: the attacker runs it too
user=dcr-adversary
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user" ||
  { echo "FAIL useradd $user"; exit 1; }
as_attacker() { setpriv --reuid="$user" --regid="$user" --init-groups "$@"; }
# $tmp is root's; the attacker can traverse it, reaches a world-writable sticky $pub (a /tmp of
# its own) and its private $atk. The victim is a root-owned file no attacker may change.
chmod 755 "$tmp"
pub="$tmp/pub"; mkdir -m 1777 "$pub"
atk="$tmp/atk"; mkdir -m 700 "$atk"; chown "$user:" "$atk"
echo "root's file" > "$tmp/victim"; chmod 644 "$tmp/victim"
victim_sum=$(sha256sum < "$tmp/victim")
victim_unchanged() {  # victim_unchanged NAME
  [ "$(sha256sum < "$tmp/victim")" = "$victim_sum" ] && [ ! -L "$tmp/victim" ]; check "$1" 0 $?
}

"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
chmod 755 "$tmp/ck"
base="$tmp/ck/step0.safetensors"; target="$tmp/ck/step1.safetensors"
"$dcr" diff "$base" "$target" -o "$tmp/d.dcr" >/dev/null 2>&1; check diff 0 $?
# The attacker's delta, made with its own plain `dcr diff`: from the (readable) base toward the
# base with every byte of tensor data flipped.
as_attacker "$py" - "$base" "$atk/evil.safetensors" <<'PY'; check attacker-forge 0 $?
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
open(sys.argv[2], "wb").write(b[:8 + n] + bytes(x ^ 0xff for x in b[8 + n:]))
PY
as_attacker "$dcr" diff "$base" "$atk/evil.safetensors" -o "$atk/evil.dcr" >/dev/null 2>&1
check attacker-diff 0 $?

port=$(( 20000 + RANDOM % 12000 ))
addrs="127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
run_scenario() {  # run_scenario FILE [MODEL-EXTRA]: a 2-receiver loopback `dcr run`, fixed ports
  cat > "$1" <<YAML
name: adv
mode: real
model: {checkpoints: [$base, $target]${2:-}}
steps: 1
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {fan_out: 1, root_fan_out: 1, streams: 1}}
receivers: {count: 2}
network:
  base_port: $port
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 400Kbit/s, latency: 1ms}
  emulation: transport
timeout: 60s
YAML
}
verified_run() {  # verified_run NAME RESULT.json: both receivers committed the real target
  "$py" - "$2" <<'PY'; check "$1" 0 $?
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
assert "error" not in r, r
assert r["receivers_verified"] == 2, r
for x in r["receiver_results"]:
    assert x["committed"] and x["verified"], x
    assert x["verify_message"] == "byte-for-byte equal to the target", x
PY
}

echo "== a second user injects its delta into a real dcr run, races its ports, plants its work dir"
# The predictable name of the default work dir, planted with a symlink to root's file.
as_attacker mkdir -m 777 "$pub/dcr-run-adv"
as_attacker ln -s "$tmp/victim" "$pub/dcr-run-adv/run-1"
run_scenario "$tmp/run.yaml"
# Its own certificates, from its own `dcr keys` of the same scenario.
cp "$tmp/run.yaml" "$atk/run.yaml"; chown "$user:" "$atk/run.yaml"
as_attacker "$dcr" keys "$atk/run.yaml" -o "$atk/keys" >/dev/null 2>&1; check attacker-keys 0 $?
as_attacker "$py" "$peer" race "$addrs" --send "$atk/evil.dcr" --for 30 --stop "$pub/stop" \
  > "$tmp/race.txt" 2>&1 &
race_pid=$!
as_attacker "$py" "$peer" race "$addrs" --send "$atk/evil.dcr" --for 30 --stop "$pub/stop" \
  --cert "$atk/keys/node-0.crt" --key "$atk/keys/node-0.key" > "$tmp/race-keys.txt" 2>&1 &
race_keys_pid=$!
sleep 0.3
TMPDIR="$pub" "$dcr" run "$tmp/run.yaml" --keep-work-dir --out "$tmp/run.json" >/dev/null \
  2>"$tmp/run.err"
check run-under-attack 0 $?
touch "$pub/stop"; wait $race_pid $race_keys_pid
verified_run run-verified-at-real-target "$tmp/run.json"
for r in race race-keys; do
  lacks "$r-nothing-taken" "$tmp/$r.txt" "sent"
  has "$r-ran" "$tmp/$r.txt" "connections"
  echo "     ($r got $(sed -n 's/connections //p' "$tmp/$r.txt") connection(s) in the listen window)"
done
work=$(sed -n 's/^dcr run: work dir \(.*\) kept (--keep-work-dir)$/\1/p' "$tmp/run.err")
[ -d "$work" ] && [ "$work" != "$pub/dcr-run-adv" ]; check work-dir-fresh 0 $?
[ "$(stat -c '%U %a' "$work")" = "root 700" ]; check work-dir-0700 0 $?
for f in "$work"/run-1/tls/*.key; do
  name="key-0600-$(basename "$f")"; [ "$(stat -c %a "$f")" = 600 ]; check "$name" 0 $?
done
[ "$(readlink "$pub/dcr-run-adv/run-1")" = "$tmp/victim" ]; check planted-dir-untouched 0 $?
victim_unchanged planted-work-dir-victim-unchanged
for f in "$work" "$work/run-1/plan-1.json" "$work/run-1/tls/node-0.key"; do
  name="attacker-cannot-read-$(basename "$f")"
  as_attacker cat "$f" >/dev/null 2>"$tmp/read.err"; check "$name" 1 $?
  has "$name-denied" "$tmp/read.err" "Permission denied"
done
as_attacker ls "$work" >/dev/null 2>&1; check attacker-cannot-list-work-dir 2 $?
[ -e "$work/run-1/plan-1.json" ]; check plan-file-exists 0 $?
rm -rf "$work"

# A squatter listening on a receiver's port before the run: that receiver cannot listen (its
# log names the port) and is restarted by `dcr run`; restarted, it recovers from the run's
# in-region store instead of the tree, so the run still ends with the real target committed
# everywhere. The squatter never gets a frame (at most a TLS handshake).
as_attacker "$py" - "$((port + 2))" > "$tmp/squat.txt" 2>&1 <<'PY' &
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8); s.settimeout(20)
print("listening", flush=True)
got = b""
try:
    c, _ = s.accept(); c.settimeout(3)
    while True:
        d = c.recv(65536)
        if not d: break
        got += d
except OSError:
    pass
print("got frames" if b"DCRF" in got else "no frames", "tls" if got[:1] == b"\x16" else "not-tls")
PY
squat_pid=$!
for _ in $(seq 1 100); do grep -q listening "$tmp/squat.txt" 2>/dev/null && break; sleep 0.1; done
TMPDIR="$pub" "$dcr" run "$tmp/run.yaml" --keep-work-dir --out "$tmp/squat.json" >/dev/null \
  2>"$tmp/squat.err"
check squatted-run-recovers 0 $?
wait "$squat_pid"
squat_work=$(sed -n 's/^dcr run: work dir \(.*\) kept (--keep-work-dir)$/\1/p' "$tmp/squat.err")
has squat-log-names-port "$squat_work/run-1/node-2.log" "listen on 127.0.0.1:$((port + 2)): Address already in use"
# (the run may end before its relay dials the squatter; when it does, it gets a TLS hello)
has squatter-got-no-frame "$tmp/squat.txt" "no frames"
verified_run squatted-target-committed "$tmp/squat.json"
"$py" - "$tmp/squat.json" <<'PY'; check squatted-receiver-restarted 0 $?
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
assert any(l.startswith("node 2: exit 15") for l in r.get("restarts", [])), r.get("restarts")
PY
rm -rf "$pub"/dcr-run-adv.*

echo "== a named model.work_dir the attacker owns, made world-writable, or planted as a symlink"
as_attacker mkdir -m 755 "$pub/theirs"
run_scenario "$tmp/w1.yaml" ", work_dir: $pub/theirs"
"$dcr" run "$tmp/w1.yaml" --out "$tmp/w1.json" >/dev/null 2>"$tmp/w1.err"; check work-dir-theirs-refused 14 $?
has work-dir-theirs-says "$tmp/w1.err" "not by this user"
[ -z "$(ls -A "$pub/theirs")" ]; check work-dir-theirs-empty 0 $?
mkdir -m 755 "$pub/open"; chmod 777 "$pub/open"
run_scenario "$tmp/w2.yaml" ", work_dir: $pub/open"
"$dcr" run "$tmp/w2.yaml" --out "$tmp/w2.json" >/dev/null 2>"$tmp/w2.err"; check work-dir-open-refused 14 $?
has work-dir-open-says "$tmp/w2.err" "lets other users write"
mkdir -m 700 "$tmp/rootdir"; echo keep > "$tmp/rootdir/f"
as_attacker ln -s "$tmp/rootdir" "$pub/link"
run_scenario "$tmp/w3.yaml" ", work_dir: $pub/link"
"$dcr" run "$tmp/w3.yaml" --out "$tmp/w3.json" >/dev/null 2>"$tmp/w3.err"; check work-dir-symlink-refused 14 $?
has work-dir-symlink-says "$tmp/w3.err" "symlink"
[ "$(ls -A "$tmp/rootdir")" = f ]; check work-dir-symlink-target-untouched 0 $?

echo "== outputs at paths the attacker planted as symlinks to root's file"
for o in out.safetensors x.dcr r.json; do as_attacker ln -s "$tmp/victim" "$pub/$o"; done
"$dcr" apply "$base" "$tmp/d.dcr" -o "$pub/out.safetensors" >/dev/null 2>&1; check apply-over-link 0 $?
"$dcr" diff "$base" "$target" -o "$pub/x.dcr" >/dev/null 2>&1; check diff-over-link 0 $?
TMPDIR="$pub" "$dcr" run "$tmp/run.yaml" --out "$pub/r.json" >/dev/null 2>"$tmp/r.err"
check run-out-over-link 0 $?
victim_unchanged outputs-victim-unchanged
for o in out.safetensors x.dcr r.json; do
  [ -f "$pub/$o" ] && [ ! -L "$pub/$o" ] && [ "$(stat -c %U "$pub/$o")" = root ]
  check "$o-replaced-not-followed" 0 $?
done
cmp -s "$pub/out.safetensors" "$target"; check apply-over-link-is-target 0 $?
[ -z "$(find "$pub" -maxdepth 1 -name '*tmp*')" ]; check no-temporaries-left 0 $?

echo "== dcr apply onto a full or read-only filesystem, into a directory it may not write"
mkdir "$tmp/full"
if mount -t tmpfs -o size=1m adversary-full "$tmp/full" 2>/dev/null; then
  "$dcr" apply "$base" "$tmp/d.dcr" -o "$tmp/full/out.safetensors" >/dev/null 2>"$tmp/full.err"
  check apply-full-fs-exit-19 19 $?
  has apply-full-fs-says "$tmp/full.err" "RESOURCE_EXHAUSTED"
  [ -z "$(ls -A "$tmp/full")" ]; check apply-full-fs-nothing-left 0 $?
  # The delta (~140 KiB) into the 16 KiB a filler leaves free.
  head -c $(( (1024 - 16) << 10 )) /dev/zero > "$tmp/full/filler"
  "$dcr" diff "$base" "$target" -o "$tmp/full/x.dcr" >/dev/null 2>"$tmp/fulld.err"
  check diff-full-fs-exit-19 19 $?
  [ "$(ls -A "$tmp/full")" = filler ]; check diff-full-fs-nothing-left 0 $?
  umount "$tmp/full"
  mount -t tmpfs -o size=1m,ro adversary-ro "$tmp/full"
  "$dcr" apply "$base" "$tmp/d.dcr" -o "$tmp/full/out.safetensors" >/dev/null 2>"$tmp/ro.err"
  check apply-read-only-fs-refused 14 $?
  has apply-read-only-fs-says "$tmp/ro.err" "Read-only file system"
  umount "$tmp/full"
else
  echo "skip full-filesystem cases: cannot mount a tmpfs here"
fi
# The second user writing into root's directory: a clear refusal, nothing left behind.
mkdir -m 755 "$tmp/roots"
as_attacker "$dcr" apply "$base" "$tmp/d.dcr" -o "$tmp/roots/out.safetensors" >/dev/null 2>"$tmp/acc.err"
check apply-no-permission-refused 14 $?
has apply-no-permission-says "$tmp/acc.err" "Permission denied"
[ -z "$(ls -A "$tmp/roots")" ]; check apply-no-permission-nothing-left 0 $?
# An existing output keeps its mode (a private 0600 checkpoint stays private).
cp "$base" "$tmp/roots/private.safetensors"; chmod 600 "$tmp/roots/private.safetensors"
"$dcr" apply "$base" "$tmp/d.dcr" -o "$tmp/roots/private.safetensors" >/dev/null 2>&1
check apply-over-private 0 $?
[ "$(stat -c %a "$tmp/roots/private.safetensors")" = 600 ]; check apply-keeps-mode-0600 0 $?

echo "== hostile peers at a node waiting for its parent (multi-host form)"
cat > "$tmp/mh.yaml" <<YAML
name: adv-mh
model: {checkpoints: [$base, $target]}
transport:
  relay_tree: {fan_out: 1, root_fan_out: 1, streams: 1}
receivers: {count: 2}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
timeout: 90s
YAML
# A keys dir the attacker made first (it could swap the CA there later): refused, nothing written.
as_attacker mkdir -m 777 "$pub/keys"
"$dcr" keys "$tmp/mh.yaml" -o "$pub/keys" >/dev/null 2>"$tmp/pk.err"; check keys-planted-dir-refused 14 $?
has keys-planted-dir-says "$tmp/pk.err" "not by this user"
[ -z "$(ls -A "$pub/keys")" ]; check keys-planted-dir-empty 0 $?
"$dcr" keys "$tmp/mh.yaml" -o "$tmp/keys" >/dev/null 2>&1; check keys 0 $?
sed -i "/^network:/a\\  tls: {ca: '$tmp/keys/ca.crt', cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}" "$tmp/mh.yaml"
"$dcr" node "$tmp/mh.yaml" --rank 2 --base "$base" --target "$target" >"$tmp/n2.out" 2>"$tmp/n2.err" &
p2=$!
"$dcr" node "$tmp/mh.yaml" --rank 1 --base "$base" --target "$target" >"$tmp/n1.out" 2>"$tmp/n1.err" &
p1=$!
for _ in $(seq 100); do  # node 1 listens once it has connected to its child
  "$py" -c "import socket; socket.create_connection(('127.0.0.1', $((port + 1))), 0.2)" 2>/dev/null && break
  sleep 0.1
done
a1="127.0.0.1:$((port + 1))"
as_attacker "$py" "$tls_peer" "$a1" --rank 0 --send "$atk/evil.dcr" > "$tmp/h-nocert.txt"
as_attacker "$py" "$tls_peer" "$a1" --rank 0 --send "$atk/evil.dcr" --cert "$atk/keys/node-0.crt" \
  --key "$atk/keys/node-0.key" > "$tmp/h-own-keys.txt"
as_attacker "$py" "$peer" garbage "$a1" > "$tmp/h-garbage.txt"
as_attacker "$py" "$peer" silent "$a1" > "$tmp/h-silent.txt"
as_attacker "$py" "$peer" huge "$a1" --plain > "$tmp/h-huge-plain.txt"
for a in nocert own-keys garbage huge-plain; do has "peer-$a-dropped" "$tmp/h-$a.txt" "refused"; done
has peer-silent-dropped "$tmp/h-silent.txt" "closed after"
kill -0 $p1 2>/dev/null; check node-still-running 0 $?
hwm=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$p1/status")
echo "     node 1 VmHWM after the hostile peers: ${hwm:-?} kB"
[ -n "$hwm" ] && [ "$hwm" -lt $((256 * 1024)) ]; check node-rss-bounded 0 $?
"$dcr" node "$tmp/mh.yaml" --rank 0 --base "$base" --target "$target" >"$tmp/n0.out" 2>"$tmp/n0.err"
check real-sender 0 $?
wait $p1; check relay-verified 0 $?
wait $p2; check receiver-verified 0 $?
has log-no-cert "$tmp/n1.err" "peer did not return a certificate"
has log-other-run "$tmp/n1.err" "certificate verify failed"
has log-garbage "$tmp/n1.err" "wrong version number"
has log-silent "$tmp/n1.err" "no hello within the deadline"
"$py" - "$tmp/n0.out" "$tmp/n1.out" "$tmp/n2.out" <<'PY'; check hostile-peers-results 0 $?
import json, sys
s, r1, r2 = (json.load(open(f)) for f in sys.argv[1:])
assert s["ok"] and s["receivers_committed"] == 2, s
for r in (r1, r2):
    assert r["ok"] and r["verified"], r
    assert r["verify_message"] == "byte-for-byte equal to the target", r
PY
# Huge claims past TLS, from a holder of the run's relay certificate (rank 1, node 2's parent):
# refused before anything is allocated, naming the claim; the node ends with DATA_LOSS (an
# authenticated parent that sends a bad frame ends the refit), never an abort; its peak RSS stays
# that of the tiny model.
maxrss() {  # maxrss OUT ERR CMD...: runs CMD; prints "EXIT MAXRSS_KB"
  local out=$1 err=$2; shift 2
  "$py" -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[3:], stdout=open(sys.argv[1], "w"), stderr=open(sys.argv[2], "w"))
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$out" "$err" "$@"
}
for claim in $((1 << 62)) $((4 << 30)); do
  maxrss "$tmp/hg.out" "$tmp/hg.err" "$dcr" node "$tmp/mh.yaml" --rank 2 --base "$base" \
    --target "$target" > "$tmp/hg.rss" &
  ph=$!
  for _ in $(seq 100); do
    "$py" -c "import socket; socket.create_connection(('127.0.0.1', $((port + 2))), 0.2)" 2>/dev/null && break
    sleep 0.1
  done
  # A first hello of run 0 is dropped naming the node's run id; the claim is made in that run.
  "$py" "$peer" huge "127.0.0.1:$((port + 2))" --rank 1 --claim "$claim" \
    --cert "$tmp/keys/node-1.crt" --key "$tmp/keys/node-1.key" > "$tmp/hg-run0.txt"
  run_id=$(grep -o "this node's run 0x[0-9a-f]*" "$tmp/hg.err" | head -1 | sed 's/.* //')
  "$py" "$peer" huge "127.0.0.1:$((port + 2))" --rank 1 --claim "$claim" --run "$run_id" \
    --cert "$tmp/keys/node-1.crt" --key "$tmp/keys/node-1.key" > "$tmp/hg.txt"
  wait $ph
  read -r rc rss < "$tmp/hg.rss"
  echo "     claim $claim: node 2 exit $rc, peak RSS $rss kB"
  check "huge-$claim-data-loss" 13 "$rc"
  has "huge-$claim-names-claim" "$tmp/hg.err" "claiming $claim bytes, more than"
  lacks "huge-$claim-no-bad-alloc" "$tmp/hg.err" "bad_alloc"
  [ "$rss" -lt $((256 * 1024)) ]; check "huge-$claim-rss-bounded" 0 $?
done

echo "== a directory store with a symlink out of its root, planted by the attacker"
mkdir -m 1777 "$pub/store"; as_attacker mkdir -m 777 "$pub/store/refit"
as_attacker mkdir -m 777 "$atk/elsewhere"; chmod 711 "$atk"
as_attacker ln -s "$atk/elsewhere" "$pub/store/refit/step-1"
cat > "$tmp/os.yaml" <<YAML
name: adv-os
model: {checkpoints: [$base, $target]}
transport: {object_store: {kind: dir, path: $pub/store}}
receivers: {count: 1}
timeout: 8s
YAML
"$dcr" node "$tmp/os.yaml" --rank 1 --transport object_store --base "$base" --target "$target" \
  >"$tmp/os1.out" 2>"$tmp/os1.err" &
po=$!
"$dcr" node "$tmp/os.yaml" --rank 0 --transport object_store --base "$base" --target "$target" \
  >"$tmp/os0.out" 2>"$tmp/os0.err"
rc=$?; [ $rc -ne 0 ]; check store-upload-refused 0 $?
has store-upload-says "$tmp/os0.err" "is a symlink; objects stay inside"
# The downloader never lists an object through the link: it ends at its deadline, nothing taken.
wait $po; rc=$?; [ $rc -ne 0 ]; check store-download-fails 0 $?
[ -z "$(ls -A "$atk/elsewhere")" ]; check store-nothing-outside-root 0 $?
lacks store-nothing-committed "$tmp/os1.out" '"committed": true'

echo "== a 1 TB sparse object planted in a shared directory store"
mkdir -m 1777 "$pub/store2"; as_attacker mkdir -p -m 777 "$pub/store2/refit/step-1"
as_attacker truncate -s 1T "$pub/store2/refit/step-1/0000000000.hdr"
sed "s|$pub/store|$pub/store2|" "$tmp/os.yaml" > "$tmp/os2.yaml"
maxrss "$tmp/os2.out" "$tmp/os2.err" "$dcr" node "$tmp/os2.yaml" --rank 1 --transport object_store \
  --base "$base" --target "$target" > "$tmp/os2.rss"
read -r rc rss < "$tmp/os2.rss"
echo "     downloader exit $rc, peak RSS $rss kB"
[ "$rc" -ne 0 ]; check sparse-object-refused 0 $?
has sparse-object-names-size "$tmp/os2.err" "is 1099511627776 bytes, larger than"
[ "$rss" -lt $((256 * 1024)) ]; check sparse-object-rss-bounded 0 $?
lacks sparse-nothing-committed "$tmp/os2.out" '"committed": true'
exit $fail
