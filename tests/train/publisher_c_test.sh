#!/usr/bin/env bash
# The trainer-side C API through the shipped binaries: a C program (publisher_c_test.c, built as
# C) is the sender of a long-lived three-version relay-tree run whose three receivers are real
# dcr-node processes. Version 1 is handed as a file, versions 2 and 3 as tensors in memory; every
# receiver commits every version, verified byte for byte against the trainer's checkpoint.
# The plans come from a `dcr run` of the same scenario (its plan-<r>.json), rewritten so that no
# barrier files are used and the sender's plan names no version contents. Then the multi-host
# form without plan files (dcr_publisher_open_scenario), and its refusals.
set -uo pipefail
dcr=$1; node=$2; prog=$3
tmp=$(mktemp -d); trap 'kill ${pids[*]:-} 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
cat >"$tmp/s.yaml" <<YAML
name: publisher
mode: real
model: {preset: tiny, seed: 7, work_dir: $tmp/w}
change_rate: 3%
steps: 3
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}}
receivers: {count: 3}
delta: {chunk_elems: 262144}
network: {tls: false}
YAML
"$dcr" run "$tmp/s.yaml" --out "$tmp/r.json" -q >"$tmp/run.out" 2>&1 || { echo "FAIL dcr run"; cat "$tmp/run.out"; exit 1; }
ck=$(ls -d "$tmp"/w/ckpt-* | head -1)
mkdir -p "$tmp/c"
python3 - "$tmp/w/run-1" "$tmp/c" "$ck" <<'PY' || exit 1
import json, struct, sys
run, out, ck = sys.argv[1:4]
for r in range(4):
    p = json.load(open("%s/plan-%d.json" % (run, r)))
    for k in ("ready_path", "go_path", "progress_path"):
        p.pop(k, None)
    p["result_path"] = "%s/node-%d.json" % (out, r)
    # Recovery state and the in-region store of this run, not those of the `dcr run` the plans
    # come from (whose sender's state records every version as published).
    if p.get("state_dir"):
        p["state_dir"] = "%s/state" % out
    if p.get("store", "").startswith("dir:"):
        p["store"] = "dir:%s/region-store" % out
    for v in p["versions"]:
        v["result_path"] = "%s/node-%d-v%d.json" % (out, r, v["version"])
        if r == 0:
            v["target_path"] = ""
    if r == 0:
        p["target_path"] = ""
    json.dump(p, open("%s/plan-%d.json" % (out, r), "w"))
for step in (2, 3):  # the manifests of the versions handed as tensors
    path = "%s/step%d.safetensors" % (ck, step)
    f = open(path, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    with open("%s/step%d.manifest" % (out, step), "w") as m:
        for k, v in h.get("__metadata__", {}).items():
            m.write("meta %s %s\n" % (k, v))
        ts = sorted((t for t in h if t != "__metadata__"), key=lambda t: h[t]["data_offsets"][0])
        for t in ts:
            b, e = h[t]["data_offsets"]
            m.write("tensor %s %s %d %d %d %s\n" % (t, h[t]["dtype"], 8 + n + b, e - b,
                    len(h[t]["shape"]), " ".join(str(d) for d in h[t]["shape"])))
PY
pids=()
for r in 3 2 1; do
  "$node" --plan "$tmp/c/plan-$r.json" >"$tmp/c/node-$r.out" 2>&1 &
  pids+=($!)
done
"$prog" "$tmp/c/plan-0.json" "$tmp/c/trainer" 3 "file:$ck/step1.safetensors" \
  "tensors:$tmp/c/step2.manifest:$ck/step2.safetensors" \
  "tensors:$tmp/c/step3.manifest:$ck/step3.safetensors" >"$tmp/c/prog.out" 2>&1
rc=$?
cat "$tmp/c/prog.out"
[ "$rc" = 0 ] || { echo "FAIL publisher program exit $rc"; fail=1; }
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL a receiver exited non-zero"; fail=1; }; done
pids=()
python3 - "$tmp/c" "$ck" <<'PY' || fail=1
import json, sys
out, ck = sys.argv[1:3]
for v in (1, 2, 3):
    for r in (1, 2, 3):
        j = json.load(open("%s/node-%d-v%d.json" % (out, r, v)))
        assert j["ok"] and j["verified"], (r, v, j.get("error"), j.get("verify_message"))
    s = json.load(open("%s/node-0-v%d.json" % (out, v)))
    assert s["ok"] and s["receivers_committed"] == 3, s
# The versions handed as tensors were written as the trainer's files, byte for byte; the
# publisher keeps only the one the next delta is built from (version 2's went once version 3
# was every receiver's).
import os
assert open("%s/trainer/version-3.safetensors" % out, "rb").read() == \
    open("%s/step3.safetensors" % ck, "rb").read()
assert os.listdir("%s/trainer" % out) == ["version-3.safetensors"], os.listdir(out + "/trainer")
print("ok   3 versions (1 file, 2 as tensors) published through the C API; 3/3 receivers "
      "verified byte for byte at each; the trainer's work dir keeps version 3 only")
PY

# hosts_verified DIR MESSAGE: every receiver DIR/h<r> (r = 1..3) committed versions 1-3, verified
# byte for byte (its state's node-<r>-v<k>.json); prints "ok   MESSAGE" or the first failure.
hosts_verified() {
  python3 - "$1" "$2" <<'PY'
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment's directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
d, message = sys.argv[1:3]
for v in (1, 2, 3):
    for r in (1, 2, 3):
        j = json.load(open(result_of("%s/h%d/state/node-%d-v%d.json" % (d, r, r, v))))
        assert j["ok"] and j["verified"], (r, v, j.get("error"), j.get("verify_message"))
print("ok   " + message)
PY
}

# The multi-host form, no `dcr run` and no plan file: the receivers are `dcr-node SCENARIO --rank
# R --state` processes of a scenario naming the checkpoints (they verify against them), the C
# program opens the sender from the same scenario and rank 0 with its own state directory.
port=$(( 20000 + RANDOM % 12000 ))
m="$tmp/m"; mkdir -p "$m/store" "$m/h0"
node_abs="$(cd "$(dirname "$node")" && pwd)/$(basename "$node")"
cat >"$m/s.yaml" <<YAML
name: publisher-multihost
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors, $ck/step3.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}
  object_store: {kind: dir, path: $m/store}
receivers: {count: 3}
delta: {chunk_elems: 262144}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))", "127.0.0.1:$((port + 3))"]
  tls: false
timeout: 60s
YAML
pids=()
for r in 3 2 1; do
  mkdir -p "$m/h$r"
  (cd "$m/h$r" && exec "$node_abs" "$m/s.yaml" --rank "$r" --state "$m/h$r/state") >"$m/h$r/log" 2>&1 &
  pids+=($!)
done
"$prog" "scenario:0:$m/h0/state:$m/s.yaml" "$m/trainer" 3 "file:$ck/step1.safetensors" \
  "tensors:$tmp/c/step2.manifest:$ck/step2.safetensors" \
  "tensors:$tmp/c/step3.manifest:$ck/step3.safetensors" >"$m/prog.out" 2>&1
rc=$?
cat "$m/prog.out"
[ "$rc" = 0 ] || { echo "FAIL scenario publisher exit $rc"; fail=1; }
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL a multi-host receiver exited non-zero"; fail=1; }; done
pids=()
hosts_verified "$m" "3 versions through dcr_publisher_open_scenario (no plan file); 3/3 dcr-node \
SCENARIO --rank R receivers verified byte for byte at each" || fail=1
# The same state again: a finished run, refused at open naming the state and the version.
"$prog" "scenario:0:$m/h0/state:$m/s.yaml" "$m/trainer" 3 "file:$ck/step1.safetensors" \
  >"$m/again.out" 2>&1
rc=$?
if [ "$rc" = 3 ] && grep -q "FAILED_PRECONDITION: state $m/h0/state: version 3, the plan's last, is already published" "$m/again.out"; then
  echo "ok   a finished state directory is refused, naming the state and the version"
else
  echo "FAIL finished state: exit $rc"; cat "$m/again.out"; fail=1
fi
"$prog" "scenario:2:$m/h0/state:$m/s.yaml" "$m/trainer" 3 "file:$ck/step1.safetensors" \
  >"$m/rank.out" 2>&1
rc=$?
if [ "$rc" = 3 ] && grep -q "rank 2 is a receiver" "$m/rank.out"; then
  echo "ok   a receiver's rank is refused"
else
  echo "FAIL receiver rank: exit $rc"; cat "$m/rank.out"; fail=1
fi

# A trainer slower than the version timeout, then killed with kill -9 and started again on the
# same state. The scenario's timeout is 4 s; the trainer computes 6 s after version 1: the
# receivers wait for version 2 to begin (its timeout counts from there). Then the trainer is
# killed; started again it resumes at version 2 (dcr_publisher_next_version says so), the
# receivers keep running through the gap and commit versions 2 and 3 from the new trainer,
# verified byte for byte.
k="$tmp/k"; mkdir -p "$k/store" "$k/h0"
kport=$(( port + 10 ))
sed -e "s#$m/store#$k/store#" -e "s#127.0.0.1:$port\"#127.0.0.1:$kport\"#" \
    -e "s#127.0.0.1:$((port + 1))\"#127.0.0.1:$((kport + 1))\"#" \
    -e "s#127.0.0.1:$((port + 2))\"#127.0.0.1:$((kport + 2))\"#" \
    -e "s#127.0.0.1:$((port + 3))\"#127.0.0.1:$((kport + 3))\"#" -e "s#^timeout: .*#timeout: 4s#" \
    "$m/s.yaml" >"$k/s.yaml"
pids=()
for r in 3 2 1; do
  mkdir -p "$k/h$r"
  (cd "$k/h$r" && exec "$node_abs" "$k/s.yaml" --rank "$r" --state "$k/h$r/state") >"$k/h$r/log" 2>&1 &
  pids+=($!)
done
"$prog" "scenario:0:$k/h0/state:$k/s.yaml" "$k/trainer" 3 "file:$ck/step1.safetensors" sleep:6 pause \
  >"$k/first.out" 2>&1 &
trainer=$!
for _ in $(seq 600); do grep -q "^paused" "$k/first.out" && break; kill -0 "$trainer" 2>/dev/null || break; sleep 0.1; done
kill -9 "$trainer"; wait "$trainer" 2>/dev/null
if grep -q "^version 1: rc 0.* 3 receivers committed" "$k/first.out"; then
  echo "ok   first trainer published version 1 and was killed with SIGKILL"
else
  echo "FAIL first trainer"; cat "$k/first.out"; fail=1
fi
alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
if [ "$alive" = 3 ]; then
  echo "ok   3/3 receivers alive through 6 s of trainer compute (timeout 4 s) and its death"
else
  echo "FAIL $alive/3 receivers alive after the trainer's compute and death"; fail=1
fi
"$prog" "scenario:0:$k/h0/state:$k/s.yaml" "$k/trainer" 3 \
  "tensors:$tmp/c/step2.manifest:$ck/step2.safetensors" \
  "tensors:$tmp/c/step3.manifest:$ck/step3.safetensors" >"$k/second.out" 2>&1
rc=$?
cat "$k/second.out"
if [ "$rc" = 0 ] && grep -q "^next version 2$" "$k/second.out"; then
  echo "ok   the restarted trainer resumed at version 2"
else
  echo "FAIL restarted trainer: exit $rc"; fail=1
fi
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL a receiver exited non-zero after the trainer's restart"; fail=1; }; done
pids=()
if grep -l "DEADLINE_EXCEEDED\|not done after" "$k"/h[123]/log "$k"/h[123]/state/*.json 2>/dev/null; then
  echo "FAIL a receiver ran past a version's timeout while the trainer computed"; fail=1
else
  echo "ok   no receiver counted the trainer's compute in a version's timeout"
fi
hosts_verified "$k" "trainer killed and restarted: 3/3 receivers committed versions 1-3, verified \
byte for byte, none exited" || { fail=1; for r in 1 2 3; do tail -5 "$k/h$r/log"; done; }
[ "$fail" = 0 ] && echo "ok   publisher C API"
exit $fail
