#!/usr/bin/env bash
# dcr synth -> diff -> apply -> verify -> inspect, plus the refusals and exit codes.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 3 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"; s2="$tmp/ck/step2.safetensors"
"$dcr" diff "$s0" "$s1" -o "$tmp/d01.dcr" > "$tmp/diff.txt"; check diff 0 $?
grep -q "smaller" "$tmp/diff.txt"; check diff-summary 0 $?
"$dcr" apply "$s0" "$tmp/d01.dcr" -o "$tmp/out1.safetensors" --verify >/dev/null; check apply 0 $?
"$dcr" verify "$tmp/out1.safetensors" "$s1" >/dev/null; check verify-identical 0 $?
"$dcr" verify "$s0" "$s1" > "$tmp/v.txt"; check verify-differs 1 $?
grep -q "DIFFER at byte" "$tmp/v.txt"; check verify-names-offset 0 $?
"$dcr" verify "$s1" "$tmp/out_chain_check_missing" >/dev/null 2>&1; check verify-missing 12 $?
# Wrong base: exit 14 (failed precondition), no output file.
"$dcr" apply "$s2" "$tmp/d01.dcr" -o "$tmp/bad.safetensors" 2>"$tmp/err.txt"; check wrong-base 14 $?
[ ! -e "$tmp/bad.safetensors" ]; check wrong-base-no-output 0 $?
grep -q "built for" "$tmp/err.txt"; check wrong-base-message 0 $?
# Corrupt delta: exit 13 (data loss), no output.
cp "$tmp/d01.dcr" "$tmp/bad.dcr"
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0x55; open(p,'wb').write(b)" "$tmp/bad.dcr"
"$dcr" apply "$s0" "$tmp/bad.dcr" -o "$tmp/bad.safetensors" 2>/dev/null; check corrupt 13 $?
[ ! -e "$tmp/bad.safetensors" ] && ! ls "$tmp" | grep -q '\.tmp\.'; check corrupt-no-output 0 $?
# Missing file: 12.
"$dcr" apply "$tmp/nope" "$tmp/d01.dcr" -o "$tmp/x" 2>/dev/null; check missing 12 $?
# Full frame for a receiver without a base.
"$dcr" diff --full "$s1" -o "$tmp/full.dcr" -q; check diff-full 0 $?
"$dcr" apply none "$tmp/full.dcr" -o "$tmp/out_full.safetensors" -q; check apply-full 0 $?
cmp -s "$tmp/out_full.safetensors" "$s1"; check full-identical 0 $?
# inspect: JSON with totals; the XOR bound with --base.
"$dcr" inspect "$tmp/d01.dcr" --json --base "$s0" > "$tmp/i.json"; check inspect 0 $?
python3 - "$tmp/i.json" <<'PY'; check inspect-json 0 $?
import json, sys
j = json.load(open(sys.argv[1]))
t = j["total"]
assert 0.02 < t["change_rate"] < 0.05, t
assert t["ratio"] > 20, t
assert 0.8 < t["payload_vs_bound"] < 1.3, t
assert j["entropy_of"] == "xor"
assert len(j["tensors"]) > 10
PY
# Chained refit step1 -> step2 from the applied output.
"$dcr" diff "$s1" "$s2" -o "$tmp/d12.dcr" -q && "$dcr" apply "$tmp/out1.safetensors" "$tmp/d12.dcr" -o "$tmp/out2.safetensors" -q
check chain 0 $?
cmp -s "$tmp/out2.safetensors" "$s2"; check chain-identical 0 $?
# Usage errors: 2.
"$dcr" apply 2>/dev/null; check usage 2 $?

# ---- local attackers and hostile filesystems ----
# Temporaries have unpredictable names, created exclusively: symlinks planted at every name a
# pid-based scheme would use are never followed.
echo precious > "$tmp/victim"
for i in $(seq 0 200); do ln -s "$tmp/victim" "$tmp/planted.safetensors.tmp.$(( $$ + i ))"; done
"$dcr" apply "$s0" "$tmp/d01.dcr" -o "$tmp/planted.safetensors" -q; check planted-tmp 0 $?
[ "$(cat "$tmp/victim")" = precious ] && cmp -s "$tmp/planted.safetensors" "$s1"; check planted-tmp-not-followed 0 $?
rm -f "$tmp"/planted.safetensors.tmp.*
# Replacing an output keeps its permission bits.
cp "$s0" "$tmp/mode.safetensors"; chmod 600 "$tmp/mode.safetensors"
"$dcr" apply "$s0" "$tmp/d01.dcr" -o "$tmp/mode.safetensors" -q; check mode-apply 0 $?
[ "$(stat -c %a "$tmp/mode.safetensors")" = 600 ]; check mode-kept 0 $?
# A full filesystem: exit 19 (resource exhausted), nothing left behind. A read-only one: 14.
if [ "$(id -u)" = 0 ] && mkdir -p "$tmp/small" && mount -t tmpfs -o size=1m tmpfs "$tmp/small" 2>/dev/null; then
  "$dcr" apply "$s0" "$tmp/d01.dcr" -o "$tmp/small/out.safetensors" 2>"$tmp/err.txt"; check enospc 19 $?
  grep -q "No space left" "$tmp/err.txt" && [ -z "$(ls -A "$tmp/small")" ]; check enospc-nothing-left 0 $?
  "$dcr" diff "$s0" "$s1" -o "$tmp/small/big.dcr" --full -q 2>/dev/null; check enospc-diff 19 $?
  [ -z "$(ls -A "$tmp/small")" ]; check enospc-diff-nothing-left 0 $?
  mount -o remount,ro "$tmp/small"
  "$dcr" apply "$s0" "$tmp/d01.dcr" -o "$tmp/small/out.safetensors" 2>"$tmp/err.txt"; check erofs 14 $?
  grep -q "Read-only file system" "$tmp/err.txt"; check erofs-message 0 $?
  umount "$tmp/small"
else
  echo "skip enospc/erofs: needs root to mount a small tmpfs"
fi
if [ "$(id -u)" != 0 ]; then
  mkdir "$tmp/ro"; chmod 555 "$tmp/ro"
  "$dcr" apply "$s0" "$tmp/d01.dcr" -o "$tmp/ro/out.safetensors" 2>/dev/null; check eacces 14 $?
  chmod 755 "$tmp/ro"
fi
# dcr run: the default work dir is fresh and private; a planted one (symlink) is not used. A
# named work dir that is a symlink or writable by others is refused (14) before anything runs.
cat > "$tmp/run.yaml" <<'Y'
name: planted
model: {preset: tiny}
change_rate: 3%
methods: [delta]
transport:
  kinds: [relay_tree]
receivers: 1
timeout: 60s
Y
mkdir "$tmp/tmpdir" "$tmp/plantdir"
ln -s "$tmp/plantdir" "$tmp/tmpdir/dcr-run-planted"
TMPDIR="$tmp/tmpdir" "$dcr" run "$tmp/run.yaml" -q --keep-work-dir --out "$tmp/run.json" >/dev/null 2>&1
check run-default-dir 0 $?
[ -z "$(ls -A "$tmp/plantdir")" ] && [ "$(stat -c %a "$tmp"/tmpdir/dcr-run-planted.*)" = 700 ]
check run-default-dir-private 0 $?
sed "s|preset: tiny}|preset: tiny, work_dir: $tmp/tmpdir/dcr-run-planted}|" "$tmp/run.yaml" > "$tmp/run-link.yaml"
"$dcr" run "$tmp/run-link.yaml" -q 2>"$tmp/err.txt" >/dev/null; check run-symlink-dir 14 $?
grep -q "not a directory" "$tmp/err.txt" && [ -z "$(ls -A "$tmp/plantdir")" ]; check run-symlink-dir-message 0 $?
mkdir "$tmp/open"; chmod 777 "$tmp/open"
sed "s|preset: tiny}|preset: tiny, work_dir: $tmp/open}|" "$tmp/run.yaml" > "$tmp/run-open.yaml"
"$dcr" run "$tmp/run-open.yaml" -q 2>"$tmp/err.txt" >/dev/null; check run-open-dir 14 $?
grep -q "lets other users write" "$tmp/err.txt" && [ -z "$(ls -A "$tmp/open")" ]; check run-open-dir-message 0 $?
exit $fail
