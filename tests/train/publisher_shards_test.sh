#!/usr/bin/env bash
# The trainer-side C API fed per-rank shards, through the shipped binaries. A C program
# (publisher_shards_test.c) is a trainer of the tiny preset under tp=2, pp=2, dp=2 with the
# distributed optimizer's flat buffers: it steps its own rank shards and converts them with its
# own exporter. It first writes the exporter's canonical checkpoint of every version (the dense
# targets), then is the sender (rank 0, dcr_publisher_open_scenario) of a long-lived multi-host
# run whose three receivers are `dcr-node SCENARIO --rank R --state` processes over TLS with
# signed deltas. Versions 1, 3 and 4 are handed as shards, version 2 as a file:
#   v1: the trainer's delta goes out (built from version 0, the baseline);
#   v2: a file, the sender builds the delta;
#   v3: the trainer's delta is from version 1 (its shards of v2 were never handed), not the
#       baseline 2: the sender builds the delta from the canonical checkpoints, and says why;
#   v4: the trainer's delta (from version 3) goes out again.
# Then a run that context-codes its deltas: the trainer's plain delta is not streamed.
# Every receiver is verified byte for byte against the dense target at every version; bad shards
# (before attach, of another version, out of order, missing, wrong size, wrong rank, twice) are
# refused with their messages.
set -uo pipefail
dcr=$1; node=$2; prog=$3
tmp=$(mktemp -d); pids=()
trap 'for p in ${pids[@]:-}; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail=0
layout="tp=2,pp=2,dp=2,dist_opt=1,tied=0,fp32_norms=1,rope_permute=0,vocab_pad=96"
ck="$tmp/ck"; mkdir -p "$ck" "$tmp/store" "$tmp/h0"
"$prog" export "$layout" "$ck" 4 || { echo "FAIL export"; exit 1; }
node_abs="$(cd "$(dirname "$node")" && pwd)/$(basename "$node")"
port=$(( 20000 + RANDOM % 12000 ))
scenario() {  # scenario FILE [NETWORK-LINES]
  cat >"$1" <<YAML
name: publisher-shards
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors, $ck/step2.safetensors, $ck/step3.safetensors, $ck/step4.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}
  object_store: {kind: dir, path: $tmp/store}
receivers: {count: 3}
delta: {chunk_elems: 262144}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))", "127.0.0.1:$((port + 3))"]
${2:-}
timeout: 60s
YAML
}
scenario "$tmp/shape.yaml" "  tls: false"
"$dcr" keys "$tmp/shape.yaml" -o "$tmp/keys" >/dev/null 2>&1 || { echo "FAIL dcr keys"; exit 1; }
scenario "$tmp/s.yaml" "  tls: {ca: $tmp/keys/ca.crt, cert: '$tmp/keys/node-{rank}.crt', key: '$tmp/keys/node-{rank}.key'}
  signing: {key: $tmp/keys/trainer.key, trust: $tmp/keys/trainer.pub}"
for r in 3 2 1; do
  mkdir -p "$tmp/h$r"
  (cd "$tmp/h$r" && exec "$node_abs" "$tmp/s.yaml" --rank "$r" --state "$tmp/h$r/state") \
    >"$tmp/h$r/log" 2>&1 &
  pids+=($!)
done
"$prog" publish "$layout" "$tmp/s.yaml" "$tmp/h0/state" "$tmp/trainer" 3 shards \
  "file:$ck/step2.safetensors" shards shards >"$tmp/prog.out" 2>"$tmp/prog.err"
rc=$?
cat "$tmp/prog.out"
[ "$rc" = 0 ] || { echo "FAIL publisher program exit $rc"; cat "$tmp/prog.err"; fail=1; }
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL a receiver exited non-zero"; fail=1; }; done
pids=()
for want in "version 1: rc 0, delta from version 0, from_shards 1, committed 3" \
            "version 2: rc 0, delta from version 1, from_shards 0, committed 3" \
            "version 3: rc 0, delta from version 2, from_shards 0, committed 3" \
            "version 4: rc 0, delta from version 3, from_shards 1, committed 3"; do
  grep -qF "$want" "$tmp/prog.out" || { echo "FAIL expected: $want"; fail=1; }
done
if grep -q "sender: version 3: the trainer's delta is version 1 -> 3 .*; building it from the checkpoints" "$tmp/prog.err"; then
  echo "ok   version 3: the trainer's delta (from version 1) refused for the baseline 2, built from the checkpoints"
else
  echo "FAIL no fallback message for version 3"; cat "$tmp/prog.err"; fail=1
fi
python3 - "$tmp" <<'PY' || fail=1
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment's directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
t = sys.argv[1]
for v in (1, 2, 3, 4):
    for r in (1, 2, 3):
        j = json.load(open(result_of("%s/h%d/state/node-%d-v%d.json" % (t, r, r, v))))
        assert j["ok"] and j["verified"], (r, v, j.get("error"), j.get("verify_message"))
    s = json.load(open(result_of("%s/h0/state/node-0-v%d.json" % (t, v))))
    assert s["ok"] and s["receivers_committed"] == 3, s
    assert s.get("trainer_delta", False) == (v in (1, 4)), (v, s)
    assert ("trainer_delta_skipped" in s) == (v == 3), (v, s)
# The checkpoint the publisher exported from the shards is the dense target, byte for byte; it
# keeps only the last version's files (the baseline's), those of versions 1-3 went as the
# baseline passed them.
import os
assert open("%s/trainer/version-4.safetensors" % t, "rb").read() == \
    open("%s/ck/step4.safetensors" % t, "rb").read()
kept = sorted(os.listdir("%s/trainer" % t))
assert kept == ["version-4.dcr", "version-4.safetensors"], kept
print("ok   4 versions (3 as per-rank shards, 1 file) to 3 dcr-node receivers over TLS, signed; "
      "each receiver verified byte for byte at each version")
PY
# The trainer's delta is an ordinary delta file: it applies to the dense base (version 4's, built
# from version 3).
"$dcr" apply "$ck/step3.safetensors" "$tmp/trainer/version-4.dcr" -o "$tmp/v4.safetensors" \
  >/dev/null 2>&1 && cmp -s "$tmp/v4.safetensors" "$ck/step4.safetensors" \
  && echo "ok   the trainer's delta of version 4 applies to the dense base, byte for byte" \
  || { echo "FAIL dcr apply of the trainer's delta"; fail=1; }
# A run that context-codes its deltas (delta.wan_context) gets the context form: the trainer's
# plain delta is not streamed, the sender builds the version from the checkpoints.
c="$tmp/ctx"; mkdir -p "$c/store" "$c/h0"
cport=$(( port + 10 ))
cat >"$c/s.yaml" <<YAML
name: publisher-shards-context
model: {checkpoints: [$ck/step0.safetensors, $ck/step1.safetensors]}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}
  object_store: {kind: dir, path: $c/store}
receivers: {count: 2}
delta: {chunk_elems: 262144, wan_context: true}
network:
  hosts: ["127.0.0.1:$cport", "127.0.0.1:$((cport + 1))", "127.0.0.1:$((cport + 2))"]
  tls: false
timeout: 60s
YAML
for r in 2 1; do
  mkdir -p "$c/h$r"
  (cd "$c/h$r" && exec "$node_abs" "$c/s.yaml" --rank "$r" --state "$c/h$r/state") \
    >"$c/h$r/log" 2>&1 &
  pids+=($!)
done
"$prog" publish "$layout" "$c/s.yaml" "$c/h0/state" "$c/trainer" 2 shards >"$c/prog.out" \
  2>"$c/prog.err"
rc=$?
for p in "${pids[@]}"; do wait "$p" || { echo "FAIL a context-run receiver exited non-zero"; fail=1; }; done
pids=()
if [ "$rc" = 0 ] && grep -qF "version 1: rc 0, delta from version 0, from_shards 0, committed 2" "$c/prog.out" \
   && grep -q "sender: version 1: the run context-codes its deltas" "$c/prog.err" \
   && python3 -c '
import glob, json, sys
def result_of(path):  # a per-version node result: in the deployment directory under --state
    found = glob.glob(path.replace("/state/", "/state/deployment-*/", 1)) or [path]
    assert len(found) == 1, (path, found)
    return found[0]
for r in (1, 2):
    j = json.load(open(result_of("%s/h%d/state/node-%d-v1.json" % (sys.argv[1], r, r))))
    assert j["ok"] and j["verified"], j
' "$c"; then
  echo "ok   a context-coded run builds its delta from the checkpoints; 2/2 receivers verified"
else
  echo "FAIL context-coded run: exit $rc"; cat "$c/prog.out" "$c/prog.err"; fail=1
fi
[ "$fail" = 0 ] && echo "ok   publisher C API with per-rank shards"
exit $fail
