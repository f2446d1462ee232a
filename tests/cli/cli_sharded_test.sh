#!/usr/bin/env bash
# Sharded checkpoints end to end with the real `dcr` binary: `dcr synth --shard-bytes` writes
# Hugging Face shard directories (shards + model.safetensors.index.json); a pair round-trips
# through diff / apply / verify with every shard and the index byte-identical; verify of two
# different directories exits 1 naming the shard; a `dcr run` scenario (mode real, relay tree)
# whose model.checkpoints are shard directories verifies every receiver.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 6% --steps 3 --shard-bytes 3000000 --out "$tmp/ck" -q > "$tmp/paths.txt"
check synth-sharded 0 $?
has synth-prints-dir "$tmp/paths.txt" "$tmp/ck/step1"
s0="$tmp/ck/step0"; s1="$tmp/ck/step1"; s2="$tmp/ck/step2"
n=$(ls "$s0"/model-*-of-*.safetensors | wc -l)
[ "$n" -ge 3 ]; check synth-three-or-more-shards 0 $?
[ -f "$s0/model.safetensors.index.json" ]; check synth-index 0 $?
[ -f "$s0/model-00001-of-0000$n.safetensors" ]; check synth-shard-names 0 $?
[ ! -e "$tmp/ck/step0.safetensors" ]; check synth-no-single-file 0 $?
python3 - "$s0" <<'PY'; check synth-index-matches-shards 0 $?
import json, os, struct, sys
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
seen, total = {}, 0
for f in sorted(os.listdir(d)):
    if not f.endswith(".safetensors"): continue
    raw = open(os.path.join(d, f), "rb").read()
    h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    for k, v in h.items():
        if k == "__metadata__": continue
        seen[k] = f; total += v["data_offsets"][1] - v["data_offsets"][0]
assert seen == idx["weight_map"], "index and shards disagree"
assert idx["metadata"]["total_size"] == total, (idx["metadata"], total)
assert len(set(seen.values())) >= 3
PY

# diff DIR DIR, apply onto the base directory, verify against the target: shard by shard equal.
"$dcr" diff "$s0" "$s1" -o "$tmp/d.dcr" > "$tmp/diff.txt" 2>/dev/null; check diff-dirs 0 $?
"$dcr" apply "$s0" "$tmp/d.dcr" -o "$tmp/out" -q > "$tmp/o.txt" 2>&1; check apply-dir 0 $?
"$dcr" verify "$tmp/out" "$s1" > "$tmp/o.txt" 2>&1; check verify-applied 0 $?
has verify-applied-says "$tmp/o.txt" "IDENTICAL: $((n + 1)) shards"
for f in "$s1"/*; do
  cmp -s "$f" "$tmp/out/$(basename "$f")"; check "cmp-$(basename "$f")" 0 $?
done
[ "$(ls "$tmp/out" | wc -l)" = "$(ls "$s1" | wc -l)" ]; check apply-same-file-set 0 $?
"$dcr" verify "$s0" "$s1" > "$tmp/o.txt" 2>&1; check verify-different-dirs 1 $?
has verify-different-names-shard "$tmp/o.txt" "DIFFER in shard model-0000"
lacks verify-different-not-identical "$tmp/o.txt" "IDENTICAL"

# dcr run: three shard directories, two refits, three receivers on a relay tree.
scenario() {  # scenario FILE METHODS CHECKPOINTS...
  local file="$1" methods="$2"; shift 2
  local list; list=$(IFS=,; echo "$*")
  cat > "$file" <<YAML
name: cli-sharded
mode: real
model:
  checkpoints: [$list]
  work_dir: $tmp/work
steps: $(($# - 1))
methods: [$methods]
transport: {kinds: [relay_tree]}
receivers: {count: 3}
$(two_regions)
YAML
}
scenario "$tmp/s.yaml" delta "$s0" "$s1" "$s2"
"$dcr" run "$tmp/s.yaml" --out "$tmp/r.json" > "$tmp/table.md" 2> "$tmp/err.txt"; check run-sharded 0 $?
python3 - "$tmp/r.json" "$tmp/diff.txt" <<'PY'; check run-sharded-verified 0 $?
import json, re, sys
j = json.load(open(sys.argv[1]))
assert len(j["runs"]) == 2, j["runs"]
for r in j["runs"]:
    assert not r.get("error"), r["error"]
    assert r["receivers"] == 3 and r["receivers_verified"] == 3, r
    assert 0.04 < r["change_rate"] < 0.08, r["change_rate"]  # measured on the shards
m = re.search(r"(\d+) of (\d+) elements changed", open(sys.argv[2]).read())
want = int(m.group(1)) / int(m.group(2))
step1 = [r for r in j["runs"] if r["step"] == 1][0]
assert abs(step1["change_rate"] - want) < 1e-12, (step1["change_rate"], want)
PY
has run-sharded-table "$tmp/table.md" "| 3/3 |"

# The full-checkpoint stream sends one file image: a shard directory is refused before any node
# starts, naming the checkpoint and the method to use.
rm -rf "$tmp/work"
scenario "$tmp/full.yaml" full "$s0" "$s1"
"$dcr" run "$tmp/full.yaml" -q > /dev/null 2> "$tmp/err.txt"; check run-full-sharded-refused 11 $?
has run-full-sharded-says "$tmp/err.txt" "$s1 is a sharded checkpoint"
has run-full-sharded-way-out "$tmp/err.txt" "methods: [delta]"
[ -z "$(find "$tmp/work" -name 'node-*.log' 2>/dev/null)" ]; check run-full-no-node-started 0 $?

# The training side: per-rank deltas whose target is the exporter's shard directory.
"$dcr" train-delta --preset tiny --layout tp=2,pp=2,dp=2,dist_opt=1 --steps 2 -o "$tmp/td" \
  --verify --shard-bytes 3000000 > "$tmp/td.txt" 2>&1; check train-delta-sharded 0 $?
has train-delta-sharded-verified "$tmp/td.txt" "step 2: $tmp/td/step2.dcr"
has train-delta-sharded-bit-exact "$tmp/td.txt" "verified bit-exact against the exporter"
[ "$(ls "$tmp/td/step2" | grep -c 'safetensors$')" -ge 3 ]; check train-delta-three-shards 0 $?
"$dcr" apply "$tmp/td/step1" "$tmp/td/step2.dcr" -o "$tmp/td/out2" -q; check train-delta-apply 0 $?
"$dcr" verify "$tmp/td/out2" "$tmp/td/step2" > "$tmp/o.txt"; check train-delta-verify 0 $?
exit $fail
