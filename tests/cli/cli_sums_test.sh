#!/usr/bin/env bash
# Sums files with the real `dcr` binary: a chain of diffs, each taking its base's content hash from
# the sums file the previous diff wrote (--base-sums / --target-sums), makes deltas byte-identical
# to those that hash every base in full, on single files and shard directories; the written sums
# match `dcr sums --check`; a base changed after its sums were written, another checkpoint's sums
# and corrupted sums files are refused by name with no delta written.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 4 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
"$dcr" synth --preset tiny --rate 5% --steps 3 --shard-bytes 3000000 --out "$tmp/sh" -q >/dev/null 2>&1
check synth-sharded 0 $?

chain() {  # chain LABEL STEP0 STEP1 ...: the diffs of consecutive steps, with and without sums
  local label=$1; shift
  local steps=("$@") i
  "$dcr" sums "${steps[0]}" -o "$tmp/$label-0.sums" > "$tmp/o.txt"; check "$label-sums-0" 0 $?
  has "$label-sums-0-says" "$tmp/o.txt" "content hash"
  for ((i = 1; i < ${#steps[@]}; i++)); do
    "$dcr" diff "${steps[i-1]}" "${steps[i]}" -o "$tmp/$label-full-$i.dcr" -q
    check "$label-diff-$i" 0 $?
    "$dcr" diff "${steps[i-1]}" "${steps[i]}" -o "$tmp/$label-sums-$i.dcr" --threads 2 \
      --base-sums "$tmp/$label-$((i-1)).sums" --target-sums "$tmp/$label-$i.sums" > "$tmp/o.txt"
    check "$label-diff-with-sums-$i" 0 $?
    cmp -s "$tmp/$label-full-$i.dcr" "$tmp/$label-sums-$i.dcr"; check "$label-same-delta-$i" 0 $?
    "$dcr" sums "${steps[i]}" --check "$tmp/$label-$i.sums" > "$tmp/o.txt"; check "$label-check-$i" 0 $?
    has "$label-check-$i-says" "$tmp/o.txt" "MATCH"
    "$dcr" apply "${steps[i-1]}" "$tmp/$label-sums-$i.dcr" -o "$tmp/$label-out-$i" -q > /dev/null 2>&1
    check "$label-apply-$i" 0 $?
    "$dcr" verify "$tmp/$label-out-$i" "${steps[i]}" > /dev/null 2>&1; check "$label-verify-$i" 0 $?
  done
}
chain single "$tmp/ck/step0.safetensors" "$tmp/ck/step1.safetensors" "$tmp/ck/step2.safetensors" \
  "$tmp/ck/step3.safetensors"
chain sharded "$tmp/sh/step0" "$tmp/sh/step1" "$tmp/sh/step2"

s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"; s2="$tmp/ck/step2.safetensors"
refused() {  # refused LABEL RC PATTERN ARGS...: dcr diff exits RC naming PATTERN, writes no delta
  local label=$1 rc=$2 pattern=$3; shift 3
  rm -f "$tmp/x.dcr" "$tmp/x.sums"
  "$dcr" diff "$@" -o "$tmp/x.dcr" --target-sums "$tmp/x.sums" > "$tmp/o.txt" 2>&1; check "$label" "$rc" $?
  has "$label-says" "$tmp/o.txt" "$pattern"
  [ ! -e "$tmp/x.dcr" ] && [ ! -e "$tmp/x.sums" ]; check "$label-nothing-written" 0 $?
}
# Another checkpoint's sums (same size, other bytes).
refused other-sums 14 "differ from its sums file" "$s1" "$s2" --base-sums "$tmp/single-0.sums"
# A base changed in place after its sums were written: one byte of its data section.
cp "$s0" "$tmp/b.safetensors"
size=$(stat -c %s "$tmp/b.safetensors")
printf '\x5a' | dd of="$tmp/b.safetensors" bs=1 seek=$((size - 100)) conv=notrunc status=none
refused changed-base 14 "differ from its sums file" "$tmp/b.safetensors" "$s1" --base-sums "$tmp/single-0.sums"
"$dcr" sums "$tmp/b.safetensors" --check "$tmp/single-0.sums" > "$tmp/o.txt"; check check-changed 1 $?
has check-changed-says "$tmp/o.txt" "DIFFER: bytes"
# Sums of a shard directory for a single file, and of a single file for a directory.
refused sharded-sums-for-file 14 "another checkpoint's" "$s0" "$s1" --base-sums "$tmp/sharded-0.sums"
refused file-sums-for-dir 14 "another checkpoint's" "$tmp/sh/step0" "$tmp/sh/step1" --base-sums "$tmp/single-0.sums"
# Corrupted, truncated, missing sums files.
sed 's/^content \(.\)/content f/' "$tmp/single-0.sums" > "$tmp/bad.sums"
cmp -s "$tmp/bad.sums" "$tmp/single-0.sums" && sed -i 's/^content f/content 0/' "$tmp/bad.sums"
refused corrupted-sums 13 "it is corrupted" "$s0" "$s1" --base-sums "$tmp/bad.sums"
head -c 100 "$tmp/single-0.sums" > "$tmp/short.sums"
refused truncated-sums 13 "sums file" "$s0" "$s1" --base-sums "$tmp/short.sums"
refused missing-sums 12 "$tmp/none.sums" "$s0" "$s1" --base-sums "$tmp/none.sums"
refused delta-as-sums 13 "not a dcr sums file" "$s0" "$s1" --base-sums "$tmp/single-sums-1.dcr"
"$dcr" diff --full "$s0" -o "$tmp/f.dcr" --target-sums "$tmp/full0.sums" -q; check diff-full-target-sums 0 $?
"$dcr" sums "$s0" --check "$tmp/full0.sums" > "$tmp/o.txt"; check full-sums-check 0 $?
cmp -s "$tmp/full0.sums" "$tmp/single-0.sums"; check full-sums-same-as-sums 0 $?
"$dcr" diff --full "$s0" -o "$tmp/f.dcr" --base-sums "$tmp/full0.sums" > "$tmp/o.txt" 2>&1; check full-excludes-base-sums 2 $?
exit $fail
