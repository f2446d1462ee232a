#!/usr/bin/env bash
# dcr diff --wan-context through the shipped binary: a version 8 delta smaller than the plain one,
# applied bit-exact; refused against another base; dcr inspect with --base decodes it and reports
# bound0 and bound2, without --base it counts its chunks from their headers; --context-classes caps
# the classes per chunk.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 3 --out "$tmp/ck" -q >/dev/null; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"; s2="$tmp/ck/step2.safetensors"
"$dcr" diff "$s0" "$s1" -o "$tmp/plain.dcr" -q; check diff-plain 0 $?
"$dcr" diff --wan-context "$s0" "$s1" -o "$tmp/ctx.dcr" > "$tmp/diff.txt"; check diff-context 0 $?
grep -q "chunks context-coded (format version 8)" "$tmp/diff.txt"; check diff-says-context 0 $?
plain=$(stat -c %s "$tmp/plain.dcr"); ctx=$(stat -c %s "$tmp/ctx.dcr")
[ "$ctx" -lt "$plain" ]; check context-smaller 0 $?
"$dcr" apply "$s0" "$tmp/ctx.dcr" -o "$tmp/out.safetensors" --verify -q; check apply-context 0 $?
"$dcr" verify "$tmp/out.safetensors" "$s1" >/dev/null; check verify-identical 0 $?
# A class cap: fewer classes, still bit-exact; outside 1-16 or without --wan-context a usage error.
"$dcr" diff --wan-context --context-classes 6 "$s0" "$s1" -o "$tmp/ctx6.dcr" -q; check diff-classes 0 $?
"$dcr" apply "$s0" "$tmp/ctx6.dcr" -o "$tmp/out6.safetensors" --verify -q; check apply-classes 0 $?
cmp -s "$tmp/out6.safetensors" "$s1"; check classes-bit-exact 0 $?
python3 - "$tmp/ctx.dcr" "$tmp/ctx6.dcr" <<'PY'; check classes-size 0 $?
import os, sys
full, six = os.path.getsize(sys.argv[1]), os.path.getsize(sys.argv[2])
assert full <= six < 1.2 * full, (full, six)
PY
"$dcr" diff --wan-context --context-classes 17 "$s0" "$s1" -o "$tmp/bad.dcr" -q 2>/dev/null; check classes-17 2 $?
"$dcr" diff --wan-context --context-classes 0 "$s0" "$s1" -o "$tmp/bad.dcr" -q 2>/dev/null; check classes-0 2 $?
"$dcr" diff --context-classes 6 "$s0" "$s1" -o "$tmp/bad.dcr" -q 2>/dev/null; check classes-needs-context 2 $?
[ ! -e "$tmp/bad.dcr" ]; check classes-no-output 0 $?
# An unchanged step: a version 8 delta of no chunk (the smallest trailer) applies to the same bytes.
"$dcr" diff --wan-context "$s0" "$s0" -o "$tmp/same.dcr" -q; check diff-unchanged 0 $?
"$dcr" apply "$s0" "$tmp/same.dcr" -o "$tmp/same.safetensors" --verify -q; check apply-unchanged 0 $?
cmp -s "$tmp/same.safetensors" "$s0"; check unchanged-bit-exact 0 $?
# Another base: refused by its content hash, no output left.
"$dcr" apply "$s1" "$tmp/ctx.dcr" -o "$tmp/wrong.safetensors" -q 2>"$tmp/wrong.err"; check apply-wrong-base 14 $?
[ ! -e "$tmp/wrong.safetensors" ]; check no-output-left 0 $?
"$dcr" inspect "$tmp/ctx.dcr" --base "$s0" --json > "$tmp/ctx.json"; check inspect-base 0 $?
"$dcr" inspect "$tmp/ctx.dcr" --json > "$tmp/nobase.json"; check inspect-nobase 0 $?
"$dcr" inspect "$tmp/ctx.dcr" --base "$s0" > "$tmp/ctx.txt"; check inspect-text 0 $?
grep -q "bound2 = positions and ulp values conditioned on the base exponent" "$tmp/ctx.txt"; check inspect-bound2-line 0 $?
python3 - "$tmp" "$ctx" <<'PY'; check inspect-json 0 $?
import json, sys
d, size = sys.argv[1], int(sys.argv[2])
a, nb = json.load(open(f"{d}/ctx.json")), json.load(open(f"{d}/nobase.json"))
assert a["format_version"] == 8, a["format_version"]
assert a["context_chunks"] > 0 and a["context_chunks"] == nb["context_chunks"], (a["context_chunks"], nb["context_chunks"])
t = a["total"]
assert t["payload_bytes"] == size, t
assert 0 < t["bound2_bytes"] < t["bound_bytes"], t
assert abs(t["payload_vs_bound2"] - size / t["bound2_bytes"]) < 1e-6 * t["payload_vs_bound2"], t
# Decoded against the base, the change counts are exact; from the headers they add up too.
assert t["changed"] == nb["total"]["changed"] or abs(t["changed"] - nb["total"]["changed"]) <= len(a["tensors"]), (t["changed"], nb["total"]["changed"])
assert "bound2_bytes" not in nb["total"]
PY
# Version 6 and 7 deltas with context-coded chunks (the pinned golden ones) still apply bit-exact.
for v in 6 7; do
  "$dcr" apply tests/golden/float_base.safetensors tests/golden/v${v}_context.dcr -o "$tmp/v$v.safetensors" --verify -q
  check apply-version-$v-context 0 $?
  cmp -s "$tmp/v$v.safetensors" tests/golden/float_target.safetensors; check version-$v-bit-exact 0 $?
done
# The version 8 delta's context records are compact ("DCRX"), its trailer the compact one.
python3 - "$tmp/ctx.dcr" <<'PY'; check compact-parts 0 $?
import struct, sys
d = open(sys.argv[1], "rb").read()
assert struct.unpack_from("<I", d, 8)[0] == 8
t = struct.unpack_from("<Q", d, len(d) - 24)[0]
assert d[t:t + 8] == b"DCRTABLC", d[t:t + 8]
assert b"DCRX" in d[:t]
PY
exit $fail
