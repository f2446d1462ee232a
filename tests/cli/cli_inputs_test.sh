#!/usr/bin/env bash
# The real `dcr` binary given the wrong kind of input: directories, shard directories, deltas or
# JSON where a checkpoint is expected. Each is refused by name (or compared, for two shard
# directories), never reported as a success it did not check.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"

# verify with directories: two shard directories are compared shard by shard.
mkdir "$tmp/A" "$tmp/B" "$tmp/E1" "$tmp/E2"
cp "$s0" "$tmp/A/model-00001-of-00002.safetensors"; cp "$s1" "$tmp/A/model-00002-of-00002.safetensors"
cp "$tmp/A/"* "$tmp/B/"
"$dcr" verify "$tmp/A" "$tmp/B" > "$tmp/o.txt" 2>&1; check verify-dirs-identical 0 $?
has verify-dirs-identical-says "$tmp/o.txt" "IDENTICAL: 2 shards"
cp "$s0" "$tmp/B/model-00002-of-00002.safetensors"
"$dcr" verify "$tmp/A" "$tmp/B" > "$tmp/o.txt" 2>&1; check verify-dirs-differ 1 $?
has verify-dirs-differ-names-shard "$tmp/o.txt" "DIFFER in shard model-00002-of-00002.safetensors at byte"
lacks verify-dirs-differ-not-identical "$tmp/o.txt" "IDENTICAL"
rm "$tmp/B/model-00002-of-00002.safetensors"
"$dcr" verify "$tmp/A" "$tmp/B" > "$tmp/o.txt" 2>&1; check verify-dirs-missing-shard 1 $?
has verify-dirs-missing-shard-names-it "$tmp/o.txt" "shard model-00002-of-00002.safetensors is in $tmp/A but not in $tmp/B"
"$dcr" verify "$tmp/E1" "$tmp/E2" > "$tmp/o.txt" 2>&1; check verify-empty-dirs 11 $?
has verify-empty-dirs-says "$tmp/o.txt" "$tmp/E1 is a directory without safetensors shards"
lacks verify-empty-dirs-not-identical "$tmp/o.txt" "IDENTICAL"
"$dcr" verify "$tmp/A" "$s0" > "$tmp/o.txt" 2>&1; check verify-dir-vs-file 11 $?
has verify-dir-vs-file-says "$tmp/o.txt" "$tmp/A is a directory but $s0 is a file"
"$dcr" verify "$s0" "$tmp/A" > "$tmp/o.txt" 2>&1; check verify-file-vs-dir 11 $?
has verify-file-vs-dir-says "$tmp/o.txt" "$tmp/A is a directory but $s0 is a file"

# A directory is a sharded checkpoint; two shards holding the same tensors are refused by name.
"$dcr" diff "$tmp/A" "$s1" -o "$tmp/d.dcr" > "$tmp/o.txt" 2>&1; check diff-dir-base-two-shards 13 $?
has diff-dir-base-two-shards-says "$tmp/o.txt" "is in two shards, model-00001-of-00002.safetensors and model-00002-of-00002.safetensors"
[ ! -e "$tmp/d.dcr" ]; check diff-dir-base-no-output 0 $?
"$dcr" diff "$s0" "$s1" -o "$tmp/d01.dcr" -q; check diff 0 $?
"$dcr" apply "$tmp/A" "$tmp/d01.dcr" -o "$tmp/out.safetensors" > "$tmp/o.txt" 2>&1; check apply-dir-base-two-shards 13 $?
has apply-dir-base-two-shards-says "$tmp/o.txt" "is in two shards"
[ ! -e "$tmp/out.safetensors" ]; check apply-dir-base-no-output 0 $?

# Other files where a checkpoint is expected are named for what they are.
"$dcr" diff "$tmp/d01.dcr" "$s1" -o "$tmp/x.dcr" > "$tmp/o.txt" 2>&1; check diff-delta-as-base 11 $?
has diff-delta-as-base-says "$tmp/o.txt" "$tmp/d01.dcr: a dcr delta file (magic DCRDELTA), not a safetensors checkpoint"
lacks diff-delta-as-base-not-header "$tmp/o.txt" "header size"
printf '{"weight_map": {"a": "model-00001-of-00002.safetensors"}}' > "$tmp/A/model.safetensors.index.json"
"$dcr" apply "$tmp/A/model.safetensors.index.json" "$tmp/d01.dcr" -o "$tmp/out.safetensors" > "$tmp/o.txt" 2>&1
check apply-index-disagrees 13 $?
has apply-index-disagrees-says "$tmp/o.txt" "is in shard model-00001-of-00002.safetensors but the index does not name it"
printf '{"hidden_size": 64}\n' > "$tmp/config.json"
"$dcr" diff "$s0" "$tmp/config.json" -o "$tmp/x.dcr" > "$tmp/o.txt" 2>&1; check diff-json-as-target 11 $?
has diff-json-as-target-says "$tmp/o.txt" "$tmp/config.json: JSON text, not a safetensors checkpoint"
[ ! -e "$tmp/x.dcr" ]; check diff-refused-no-output 0 $?

# inspect --base with another checkpoint: a warning naming both hashes, the base not used.
h0=$("$dcr" diff "$s0" "$s1" -o "$tmp/d01b.dcr" | sed -n 's/^base hash \([0-9a-f]*\) .*/\1/p')
"$dcr" diff --full "$s1" -o "$tmp/full.dcr" > "$tmp/o.txt"; check diff-full 0 $?
h1=$(sed -n 's/.*target hash \([0-9a-f]*\).*/\1/p' "$tmp/o.txt")
has diff-full-says-full-frame "$tmp/o.txt" "a full frame of all"
lacks diff-full-no-changed-count "$tmp/o.txt" "elements changed"
has diff-full-no-base-hash "$tmp/o.txt" "base none (full frame)"
"$dcr" inspect "$tmp/d01.dcr" --base "$s1" --json > "$tmp/i.json" 2> "$tmp/o.txt"; check inspect-wrong-base 0 $?
has inspect-wrong-base-warns "$tmp/o.txt" "warning: --base $s1 has content hash $h1 but the delta was built for base $h0"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['entropy_of'] != 'xor' and 'warning' in j, j" "$tmp/i.json"
check inspect-wrong-base-not-used 0 $?
"$dcr" inspect "$tmp/d01.dcr" --base "$s0" > /dev/null 2> "$tmp/o.txt"; check inspect-right-base 0 $?
lacks inspect-right-base-no-warning "$tmp/o.txt" "warning"
exit $fail
