#!/usr/bin/env bash
# Bounds before allocation (core/docs/security.md "Bounded resources"): hostile chunk records,
# their checksums right, against the real `dcr apply` and `dcr inspect` (also `inspect --base`,
# which decodes context-coded records against the base). Each is refused with DATA_LOSS (exit 13)
# naming what does not fit, no output file appears, and the process's peak RSS stays under
# $bound_kib: the records ask for 1 GiB (a 32 KiB zstd stream of RLE blocks), 16 GiB (the base
# bits of a 108-byte context-coded record over 2^33 elements) and 2^64 elements (segment counts
# that wrap in 64 bits). tests/adversary/craft.py writes them into copies of the golden deltas.
# Needs no second user; label `adversary`; a few seconds.
#   bounds_test.sh DCR
set -u
source "$(dirname "$0")/../cli/cli_lib.sh" "$@"
here=$(cd "$(dirname "$0")" && pwd)
g=tests/golden
bound_kib=$((96 * 1024))  # the golden models are under 100 KB: 96 MiB is the binary and slack
py=/usr/bin/python3
# tensor 3 of the golden base is 'model.layers.0.mask' (33 BOOL elements, width 1)
"$py" "$here/craft.py" zstd_bomb "$g/v5_delta.dcr" "$tmp/bomb.dcr" 3 >/dev/null; check craft-bomb 0 $?
"$py" "$here/craft.py" context_wide "$g/v8_context.dcr" "$tmp/wide.dcr" 0 >/dev/null
check craft-wide 0 $?
"$py" "$here/craft.py" segments_wrap "$g/v5_delta.dcr" "$tmp/wrap.dcr" 3 >/dev/null
check craft-wrap 0 $?

refused() {  # refused NAME WANT-RC MESSAGE CMD...: exit WANT-RC, MESSAGE on stderr, RSS bounded
  local name=$1 want=$2 msg=$3
  shift 3
  /usr/bin/time -f %M -o "$tmp/$name.rss" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  check "$name" "$want" $?
  has "$name-says" "$tmp/$name.err" "$msg"
  lacks "$name-no-bad-alloc" "$tmp/$name.err" "bad_alloc"
  local rss
  rss=$(tail -1 "$tmp/$name.rss")
  if [ "$rss" -lt "$bound_kib" ]; then
    echo "ok   $name-rss ($rss KiB)"
  else
    echo "FAIL $name-rss: peak RSS $rss KiB, bound $bound_kib KiB"; fail=1
  fi
}

refused apply-bomb 13 "lies outside its tensor's elements" \
  "$dcr" apply -q "$g/base.safetensors" "$tmp/bomb.dcr" -o "$tmp/out.safetensors"
[ ! -e "$tmp/out.safetensors" ]; check apply-bomb-no-output 0 $?
refused inspect-bomb 13 "lies outside its tensor's elements" "$dcr" inspect "$tmp/bomb.dcr"
refused apply-wide 13 "lies outside its tensor's elements" \
  "$dcr" apply -q "$g/float_base.safetensors" "$tmp/wide.dcr" -o "$tmp/out2.safetensors"
[ ! -e "$tmp/out2.safetensors" ]; check apply-wide-no-output 0 $?
refused inspect-base-wide 13 "lies outside its tensor's elements" \
  "$dcr" inspect --base "$g/float_base.safetensors" "$tmp/wide.dcr"
refused apply-wrap 13 "segment too large" \
  "$dcr" apply -q "$g/base.safetensors" "$tmp/wrap.dcr" -o "$tmp/out3.safetensors"
refused inspect-wrap 13 "segment too large" "$dcr" inspect "$tmp/wrap.dcr"
# The untouched golden deltas still apply (the bounds refuse nothing real).
"$dcr" apply -q "$g/base.safetensors" "$g/v5_delta.dcr" -o "$tmp/ok.safetensors"
check apply-golden 0 $?
cmp -s "$tmp/ok.safetensors" "$g/target.safetensors"; check apply-golden-bytes 0 $?
"$dcr" inspect --base "$g/float_base.safetensors" "$g/v8_context.dcr" >/dev/null
check inspect-golden 0 $?
exit $fail
