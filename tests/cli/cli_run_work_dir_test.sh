#!/usr/bin/env bash
# dcr run without model.work_dir works in a fresh $TMPDIR/dcr-run-* dir and removes it when the
# run ends: whole after a run that succeeded (the result JSON says so), all but the node logs the
# error names after one that failed, none of it with --keep-work-dir; a model.work_dir is the
# user's and stays as it is. stderr names what was removed or kept.
source "$(dirname "$0")/cli_lib.sh" "$@"
mkdir "$tmp/t"
cat > "$tmp/run.yaml" <<'Y'
name: wd
model: {preset: tiny}
change_rate: 3%
methods: [delta]
transport:
  kinds: [relay_tree]
receivers: 1
timeout: 60s
Y
work_of() { sed -n 's/^dcr run: work dir \([^ ]*\)$/\1/p' "$1"; }

# A run that succeeded: the dir is gone, stderr and the result say so.
TMPDIR="$tmp/t" "$dcr" run "$tmp/run.yaml" -q --out "$tmp/ok.json" >/dev/null 2>"$tmp/ok.err"
check run-ok 0 $?
work=$(work_of "$tmp/ok.err")
[ -n "$work" ]; check ok-names-work-dir 0 $?
[ ! -e "$work" ] && [ -z "$(ls -A "$tmp/t")" ]; check ok-work-dir-removed 0 $?
has ok-says-removed "$tmp/ok.err" "work dir $work removed"
has ok-result-says-removed "$tmp/ok.json" "$work (removed)"

# --keep-work-dir: the dir stays whole, with the run's checkpoints and plans.
TMPDIR="$tmp/t" "$dcr" run "$tmp/run.yaml" -q --keep-work-dir --out "$tmp/keep.json" \
  >/dev/null 2>"$tmp/keep.err"
check run-keep 0 $?
work=$(work_of "$tmp/keep.err")
[ -d "$work" ] && [ -e "$work/run-1/plan-1.json" ] && [ -n "$(ls -d "$work"/ckpt-* 2>/dev/null)" ]
check keep-work-dir-whole 0 $?
has keep-says-kept "$tmp/keep.err" "work dir $work kept (--keep-work-dir)"
lacks keep-result-not-removed "$tmp/keep.json" "(removed"
rm -rf "$work"

# A run that failed (nodes past their deadline): only the logs the error names are left.
sed 's/timeout: 60s/timeout: 0.05s/' "$tmp/run.yaml" > "$tmp/fail.yaml"
TMPDIR="$tmp/t" "$dcr" run "$tmp/fail.yaml" -q >/dev/null 2>"$tmp/fail.err"
check run-fail 1 $?
work=$(work_of "$tmp/fail.err")
log=$(sed -n 's/.*\[log: \([^]]*\)\].*/\1/p' "$tmp/fail.err" | head -1)
[ -n "$log" ] && [ -f "$log" ]; check fail-named-log-kept 0 $?
[ -z "$(find "$work" -type f ! -name '*.log')" ]; check fail-only-logs-left 0 $?
has fail-says-logs-kept "$tmp/fail.err" "work dir $work removed but for its"
rm -rf "$work"

# A run refused before any node (no delta between unlike checkpoints): nothing is left.
"$dcr" synth --preset tiny --rate 3% --steps 1 --out "$tmp/a" -q >/dev/null 2>&1; check synth-a 0 $?
"$dcr" synth --preset tiny-moe --rate 3% --steps 1 --out "$tmp/b" -q >/dev/null 2>&1
check synth-b 0 $?
cat > "$tmp/unlike.yaml" <<Y
name: unlike
model: {checkpoints: [$tmp/a/step0.safetensors, $tmp/b/step0.safetensors]}
methods: [delta]
transport:
  kinds: [relay_tree]
receivers: 1
timeout: 60s
Y
TMPDIR="$tmp/t" "$dcr" run "$tmp/unlike.yaml" -q >/dev/null 2>"$tmp/unlike.err"
[ $? -ne 0 ]; check run-unlike-fails 0 $?
[ -z "$(ls -A "$tmp/t")" ]; check unlike-work-dir-removed 0 $?

# model.work_dir is the user's: left as it is, however the run ends.
sed "s|preset: tiny}|preset: tiny, work_dir: $tmp/mine}|" "$tmp/run.yaml" > "$tmp/mine.yaml"
"$dcr" run "$tmp/mine.yaml" -q >/dev/null 2>"$tmp/mine.err"; check run-mine 0 $?
[ -e "$tmp/mine/run-1/plan-1.json" ]; check mine-work-dir-untouched 0 $?
lacks mine-says-nothing-removed "$tmp/mine.err" "removed"
exit $fail
