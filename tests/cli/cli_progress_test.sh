#!/usr/bin/env bash
# Progress on stderr: plain lines with a rate when stderr is a file (never a carriage return),
# one line redrawn in place on a terminal, nothing with -q; stdout and the outputs unchanged.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" >/dev/null 2>"$tmp/synth.err"; check synth 0 $?
s0="$tmp/ck/step0.safetensors"; s1="$tmp/ck/step1.safetensors"
noncr() {  # noncr NAME FILE: FILE has no carriage return and no escape sequence
  if LC_ALL=C grep -q $'[\r\033]' "$2"; then echo "FAIL $1: a carriage return or escape in:"; cat -A "$2"; fail=1; else echo "ok   $1"; fi
}
rated() {  # rated NAME FILE PHASE: FILE has PHASE's final line, with bytes, a rate and the time
  if grep -Eq "^$3: [0-9.]+ (B|KiB|MiB|GiB) / [0-9.]+ (B|KiB|MiB|GiB), [0-9.]+ (B|KiB|MiB|GiB)/s, done in [0-9.]+ (ms|s)\$" "$2"; then
    echo "ok   $1"; else echo "FAIL $1: no rated '$3' line in:"; cat -A "$2"; fail=1; fi
}
noncr synth-plain "$tmp/synth.err"
rated synth-step "$tmp/synth.err" step

"$dcr" diff "$s0" "$s1" -o "$tmp/d.dcr" > "$tmp/diff.out" 2> "$tmp/diff.err"; check diff 0 $?
noncr diff-plain "$tmp/diff.err"
rated diff-hash-base "$tmp/diff.err" "hash base"
rated diff-diff "$tmp/diff.err" diff
has diff-summary-on-stdout "$tmp/diff.out" "smaller"
lacks diff-no-progress-on-stdout "$tmp/diff.out" "/s,"
"$dcr" diff "$s0" "$s1" -o "$tmp/dq.dcr" -q > "$tmp/q.out" 2> "$tmp/q.err"; check diff-quiet 0 $?
[ ! -s "$tmp/q.err" ] && [ ! -s "$tmp/q.out" ]; check diff-quiet-silent 0 $?
cmp -s "$tmp/d.dcr" "$tmp/dq.dcr"; check diff-progress-same-bytes 0 $?

"$dcr" apply "$s0" "$tmp/d.dcr" -o "$tmp/out.safetensors" --verify > /dev/null 2> "$tmp/apply.err"; check apply 0 $?
noncr apply-plain "$tmp/apply.err"
for phase in "hash base" "copy base" apply rehash; do rated "apply-$phase" "$tmp/apply.err" "$phase"; done
"$dcr" apply "$s0" "$tmp/d.dcr" -o "$tmp/outq.safetensors" -q 2> "$tmp/q.err"; check apply-quiet 0 $?
[ ! -s "$tmp/q.err" ]; check apply-quiet-silent 0 $?
cmp -s "$tmp/out.safetensors" "$s1" && cmp -s "$tmp/outq.safetensors" "$s1"; check apply-identical 0 $?

"$dcr" verify "$tmp/out.safetensors" "$s1" > "$tmp/v.out" 2> "$tmp/v.err"; check verify 0 $?
noncr verify-plain "$tmp/v.err"
rated verify-line "$tmp/v.err" verify
has verify-result "$tmp/v.out" "IDENTICAL"
"$dcr" verify -q "$tmp/out.safetensors" "$s1" > /dev/null 2> "$tmp/q.err"; check verify-quiet 0 $?
[ ! -s "$tmp/q.err" ]; check verify-quiet-silent 0 $?

# dcr run: per refit the nodes done and the bytes the receivers received (from the nodes'
# progress files), with a rate; plain lines into a file; nothing with -q.
cat > "$tmp/run.yaml" <<YAML
name: cli-progress
mode: real
model: {checkpoints: [$s0, $s1], work_dir: $tmp/work}
steps: 1
methods: [delta, full]
transport: {kinds: [relay_tree]}
receivers: {count: 2}
$(two_regions)
YAML
"$dcr" run "$tmp/run.yaml" > /dev/null 2> "$tmp/run.err"; check run 0 $?
noncr run-plain "$tmp/run.err"
for m in delta full; do
  if grep -Eq "^  $m / relay_tree / .* 3/3 nodes done, received [0-9.]+ (KiB|MiB) / [0-9.]+ (KiB|MiB), [0-9.]+ (B|KiB|MiB|GiB)/s\$" "$tmp/run.err"; then
    echo "ok   run-$m-bytes"; else echo "FAIL run-$m-bytes:"; cat -A "$tmp/run.err"; fail=1; fi
done
# full: every receiver receives the whole stream (the checkpoint file and a few bytes of framing):
# all of the expected total, about 2 x the file.
python3 - "$tmp/run.err" "$s1" <<'PY'; check run-full-bytes-exact 0 $?
import os, re, sys
line = [l for l in open(sys.argv[1]) if l.startswith("  full /")][0]
got, want = re.search(r"received (\S+ \S+) / (\S+ \S+),", line).groups()
assert got == want, line
size = 2 * os.path.getsize(sys.argv[2]) / 2**20
value, unit = want.split()
assert unit == "MiB" and abs(float(value) - size) < 0.01 * size, (want, size)
PY
"$dcr" run "$tmp/run.yaml" -q > /dev/null 2> "$tmp/q.err"; check run-quiet 0 $?
[ ! -s "$tmp/q.err" ]; check run-quiet-silent 0 $?

# A terminal (script(1) gives the command one): the line is redrawn in place.
if command -v script > /dev/null; then
  script -qec "'$dcr' diff '$s0' '$s1' -o '$tmp/dt.dcr'" /dev/null > "$tmp/tty.out" 2>&1; check diff-tty 0 $?
  if LC_ALL=C grep -q $'\r\033\\[K' "$tmp/tty.out"; then echo "ok   diff-tty-redraws"; else echo "FAIL diff-tty-redraws:"; cat -A "$tmp/tty.out"; fail=1; fi
  cmp -s "$tmp/d.dcr" "$tmp/dt.dcr"; check diff-tty-same-bytes 0 $?
else
  echo "skip tty: no script(1)"
fi
exit $fail
