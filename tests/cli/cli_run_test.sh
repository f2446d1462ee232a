#!/usr/bin/env bash
# `dcr run` (mode real, real dcr-node processes on loopback) on given checkpoints: the result
# carries the change rate measured on the checkpoints, not the configured one; an incompatible
# base and target are refused before any node starts, naming the tensor and the way out.
source "$(dirname "$0")/cli_lib.sh" "$@"
scenario() {  # scenario FILE BASE TARGET [METHODS]
  cat > "$1" <<YAML
name: cli-run
mode: real
model:
  checkpoints: [$2, $3]
  work_dir: $tmp/work
steps: 1
methods: [${4:-delta, full}]
transport: {kinds: [relay_tree]}
receivers: {count: 2}
$(two_regions)
YAML
}
"$dcr" synth --preset tiny --rate 6% --steps 2 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"
"$dcr" diff "$s0" "$s1" -o "$tmp/d.dcr" > "$tmp/diff.txt"; check diff 0 $?

# Measured change rate in the JSON and the table: the diff's changed / elements, for both methods.
scenario "$tmp/s.yaml" "$s0" "$s1"
"$dcr" run "$tmp/s.yaml" --out "$tmp/r.json" > "$tmp/table.md" 2> "$tmp/err.txt"; check run 0 $?
python3 - "$tmp/r.json" "$tmp/diff.txt" <<'PY'; check run-measured-rate 0 $?
import json, re, sys
j = json.load(open(sys.argv[1]))
m = re.search(r"(\d+) of (\d+) elements changed", open(sys.argv[2]).read())
want = int(m.group(1)) / int(m.group(2))
assert abs(want - 0.03) > 0.01, want  # the checkpoints' rate is far from the 3% default
assert len(j["runs"]) == 2, j["runs"]
for r in j["runs"]:
    assert abs(r["change_rate"] - want) < 1e-12, (r["change_rate"], want)
    assert "configured_change_rate" not in r, r  # given checkpoints: no trainer input
    # Every receiver's own commit report reached the sender: committed, this step's version,
    # one content hash for all of them (a delta's: the target's; the full stream carries none).
    hashes = set()
    for rx in r["receiver_results"]:
        rep = rx["report"]
        assert rep["ok"] and rep["version"] == r["step"] and rx["committed"], rx
        hashes.add(rep["target_hash"])
    assert len(hashes) == 1, hashes
    assert (hashes.pop() == "0" * 32) == (r["method"] == "full"), r
PY
pct=$(python3 -c "import json,sys; print('%.2f%%' % (100*json.load(open(sys.argv[1]))['runs'][0]['change_rate']))" "$tmp/r.json")
has run-table-measured "$tmp/table.md" "| delta | relay_tree | $pct | - |"
lacks run-table-not-configured "$tmp/table.md" "3.00%"
"$dcr" report "$tmp/r.json" -o "$tmp/rep" > /dev/null 2>&1; check report 0 $?
gpct=$(python3 -c "import json,sys; print('%g%%' % (100*json.load(open(sys.argv[1]))['runs'][0]['change_rate']))" "$tmp/r.json")
has report-measured "$tmp/rep/summary.md" "| $gpct | - | relay_tree | delta |"

# Base and target that no delta can join: refused before any node starts (no node log), naming
# the tensor, both shapes and the way out; a full refit of the same pair works.
python3 - "$s1" "$tmp" <<'PY'
import json, struct, sys
src, out = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
names = [k for k in hdr if k != "__metadata__"]
def write(path, tensors):  # tensors: [(name, dtype, shape, bytes)]
    h, off, blob = {}, 0, b""
    for name, dt, shape, b in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b); blob += b
    j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + blob)
ts = sorted(((k, hdr[k]["dtype"], hdr[k]["shape"], data[slice(*hdr[k]["data_offsets"])]) for k in names),
            key=lambda t: hdr[t[0]]["data_offsets"][0])
big = next(i for i, t in enumerate(ts) if len(t[2]) == 2 and t[2][0] != t[2][1])
reshaped = list(ts); n0, dt, sh, b = ts[big]; reshaped[big] = (n0, dt, [sh[1], sh[0]], b)
write(out + "/reshaped.safetensors", reshaped)
write(out + "/removed.safetensors", ts[:big] + ts[big + 1:])
open(out + "/names.txt", "w").write("%s\n[%d, %d] %s\n[%d, %d] %s\n" % (n0, sh[0], sh[1], dt, sh[1], sh[0], dt))
PY
check make-incompatible 0 $?
name=$(sed -n 1p "$tmp/names.txt"); was=$(sed -n 2p "$tmp/names.txt"); now=$(sed -n 3p "$tmp/names.txt")
rm -rf "$tmp/work"
scenario "$tmp/shape.yaml" "$s0" "$tmp/reshaped.safetensors"
"$dcr" run "$tmp/shape.yaml" -q > /dev/null 2> "$tmp/err.txt"; check run-shape-refused 14 $?
has run-shape-names-tensor "$tmp/err.txt" "tensor '$name' is $was in the base but $now in the target"
has run-shape-says-full "$tmp/err.txt" "method full"
[ -z "$(find "$tmp/work" -name 'node-*.log' 2>/dev/null)" ]; check run-shape-no-node-started 0 $?
scenario "$tmp/removed.yaml" "$s0" "$tmp/removed.safetensors"
"$dcr" run "$tmp/removed.yaml" -q > /dev/null 2> "$tmp/err.txt"; check run-removed-refused 14 $?
has run-removed-names-tensor "$tmp/err.txt" "tensor '$name' is in the base but not in the target (removed)"
scenario "$tmp/shape-full.yaml" "$s0" "$tmp/reshaped.safetensors" full
"$dcr" run "$tmp/shape-full.yaml" -q --out "$tmp/rf.json" > /dev/null 2> "$tmp/err.txt"; check run-shape-full-works 0 $?
"$dcr" diff "$s0" "$tmp/reshaped.safetensors" -o "$tmp/x.dcr" > /dev/null 2> "$tmp/err.txt"; check diff-shape-refused 14 $?
has diff-shape-names-tensor "$tmp/err.txt" "tensor '$name' is $was in the base but $now in the target"
has diff-shape-says-full "$tmp/err.txt" "dcr diff --full"

# The sender dies mid-refit (kill -9 from outside): `dcr run` restarts it with its plan, the
# restarted sender republishes into the in-region store, and the run ends bit-exact everywhere,
# its result naming the restart.
rm -rf "$tmp/work"
scenario "$tmp/slow.yaml" "$s0" "$s1" full
sed -i 's|bandwidth: 1Gbit/s, latency: 1ms|bandwidth: 8Mbit/s, latency: 1ms|' "$tmp/slow.yaml"
"$dcr" run "$tmp/slow.yaml" -q --out "$tmp/killed.json" > /dev/null 2> "$tmp/err.txt" &
runner=$!
plan="$tmp/work/run-1/plan-0.json"
sender=""
for _ in $(seq 100); do
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "--plan $plan"; then sender=${p#/proc/}; fi
  done
  [ -n "$sender" ] && [ -e "$tmp/work/run-1/go" ] && break
  sleep 0.1
done
sleep 0.5
[ -n "$sender" ] && kill -9 "$sender"; check found-sender 0 $?
wait "$runner"; check run-sender-killed-recovered 0 $?
python3 - "$tmp/killed.json" <<'PY'; check run-sender-restart-reported 0 $?
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
assert not run.get("error"), run.get("error")
assert run["receivers_verified"] == run["receivers"], run
assert any(l.startswith("node 0: killed by signal 9") for l in run.get("restarts", [])), run
PY
exit $fail
