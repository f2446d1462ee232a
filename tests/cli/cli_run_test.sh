#!/usr/bin/env bash
# `dcr run` (mode real, real dcr-node processes on loopback) on given checkpoints: the result
# carries the change rate measured on the checkpoints, not the configured one; an incompatible
# base and target are refused before any node starts, naming the tensor and the way out.
set -u
dcr="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_RC ACTUAL_RC
  if [ "$2" != "$3" ]; then echo "FAIL $1: exit $3, expected $2"; fail=1; else echo "ok   $1"; fi
}
has() {  # has NAME FILE PATTERN: FILE contains PATTERN (fixed string)
  if grep -qF -- "$3" "$2"; then echo "ok   $1"; else echo "FAIL $1: no '$3' in:"; cat "$2"; fail=1; fi
}
lacks() {  # lacks NAME FILE PATTERN
  if grep -qF -- "$3" "$2"; then echo "FAIL $1: '$3' in:"; cat "$2"; fail=1; else echo "ok   $1"; fi
}
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
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 1Gbit/s, latency: 1ms}
  emulation: transport
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
PY
pct=$(python3 -c "import json,sys; print('%.2f%%' % (100*json.load(open(sys.argv[1]))['runs'][0]['change_rate']))" "$tmp/r.json")
has run-table-measured "$tmp/table.md" "| delta | relay_tree | $pct | - |"
lacks run-table-not-configured "$tmp/table.md" "3.00%"
"$dcr" report "$tmp/r.json" -o "$tmp/rep" > /dev/null 2>&1; check report 0 $?
gpct=$(python3 -c "import json,sys; print('%g%%' % (100*json.load(open(sys.argv[1]))['runs'][0]['change_rate']))" "$tmp/r.json")
has report-measured "$tmp/rep/summary.md" "| $gpct | - | relay_tree | delta |"
exit $fail
