#!/usr/bin/env bash
# Deltas built on a device with the real `dcr` binary: `dcr diff --device host` and
# `dcr train-delta --device host` (the device path on the host backend) write the same bytes as the
# default host scan, for single files, shard directories, several options and full frames;
# `--device cuda` either builds the same bytes (a machine with a usable GPU) or is refused with
# exit 15 naming CUDA and writes nothing; an unknown device name is a usage error.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 6% --steps 3 --out "$tmp/ck" -q > /dev/null
check synth 0 $?
"$dcr" synth --preset tiny --rate 90% --steps 2 --shard-bytes 3000000 --out "$tmp/sh" -q > /dev/null
check synth-sharded 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"; s2="$tmp/ck/step2.safetensors"

same_diff() {  # same_diff NAME ARGS...: default and --device host give identical delta files
  local name="$1"; shift
  "$dcr" diff "$@" -o "$tmp/$name.cpu.dcr" -q; check "$name-cpu" 0 $?
  "$dcr" diff --device host "$@" -o "$tmp/$name.host.dcr" -q; check "$name-host" 0 $?
  cmp -s "$tmp/$name.cpu.dcr" "$tmp/$name.host.dcr"; check "$name-same-bytes" 0 $?
}
same_diff default "$s0" "$s1"
same_diff two-steps "$s0" "$s2"
same_diff small-cells "$s0" "$s1" --chunk-elems 1000 --small-elems 50000 --threads 3
same_diff ulp "$s1" "$s2" --values ulp --level 3
same_diff absolute "$s1" "$s0" --values absolute --threads 1
same_diff unchanged "$s1" "$s1"
same_diff full --full "$s1"
same_diff sharded-most-changed "$tmp/sh/step0" "$tmp/sh/step1" --chunk-elems 70000
same_diff file-to-dir "$s0" "$tmp/sh/step1" --device-index 0

# The host-device delta applies to the base and verifies against the target.
"$dcr" apply "$s0" "$tmp/default.host.dcr" -o "$tmp/out.safetensors" -q > /dev/null 2>&1
check apply-host-delta 0 $?
"$dcr" verify "$tmp/out.safetensors" "$s1" > /dev/null 2>&1; check verify-host-delta 0 $?

# The summary names the device.
"$dcr" diff --device host "$s0" "$s1" -o "$tmp/named.dcr" > "$tmp/o.txt" 2>/dev/null
check summary-host 0 $?
has summary-names-device "$tmp/o.txt" "on device host"

# --device cuda: the same bytes where a GPU is usable, otherwise exit 15 naming CUDA, no file.
"$dcr" diff --device cuda "$s0" "$s1" -o "$tmp/cuda.dcr" -q > "$tmp/cuda.txt" 2>&1
rc=$?
if [ $rc = 0 ]; then
  cmp -s "$tmp/default.cpu.dcr" "$tmp/cuda.dcr"; check cuda-same-bytes 0 $?
else
  check cuda-refused 15 $rc
  has cuda-refusal-names-cuda "$tmp/cuda.txt" "dcr diff: UNAVAILABLE: CUDA"
  [ ! -e "$tmp/cuda.dcr" ]; check cuda-refusal-no-file 0 $?
  "$dcr" train-delta --preset tiny --steps 1 --device cuda -o "$tmp/td-cuda" > "$tmp/tdc.txt" 2>&1
  check train-delta-cuda-refused 15 $?
  has train-delta-refusal-names-cuda "$tmp/tdc.txt" "dcr train-delta: UNAVAILABLE: CUDA"
  [ ! -e "$tmp/td-cuda" ]; check train-delta-refusal-writes-nothing 0 $?
fi
"$dcr" diff --device cuda --device-index 4096 "$s0" "$s1" -o "$tmp/cuda9.dcr" -q > "$tmp/o.txt" 2>&1
check cuda-index-out-of-range 15 $?
has cuda-index-names-cuda "$tmp/o.txt" "CUDA"
[ ! -e "$tmp/cuda9.dcr" ]; check cuda-index-no-file 0 $?
"$dcr" diff --device gpu "$s0" "$s1" -o "$tmp/gpu.dcr" -q > "$tmp/o.txt" 2>&1
check unknown-device 2 $?
has unknown-device-lists-names "$tmp/o.txt" "cpu,host,cuda"

# train-delta: per-rank deltas built on the host backend equal the host units' byte for byte, and
# verify against the exporter.
layout="tp=2,pp=2,dp=2,dist_opt=1,fold_layers=1"
"$dcr" train-delta --preset tiny --layout "$layout" --steps 2 --chunk-elems 5000 --threads 2 \
  -o "$tmp/td-cpu" > /dev/null 2>&1
check train-delta-cpu 0 $?
"$dcr" train-delta --preset tiny --layout "$layout" --steps 2 --chunk-elems 5000 --threads 2 \
  --device host --verify -o "$tmp/td-host" > "$tmp/td.txt" 2>&1
check train-delta-host 0 $?
has train-delta-host-verified "$tmp/td.txt" "verified bit-exact"
for k in 1 2; do
  cmp -s "$tmp/td-cpu/step$k.dcr" "$tmp/td-host/step$k.dcr"; check "train-delta-step$k-same-bytes" 0 $?
done
exit $fail
