#!/usr/bin/env bash
# `dcr run --check FILE` against real runs (mode real, dcr-node processes on loopback) of a small
# delta-vs-full scenario: thresholds the run meets pass (exit 0, JUnit XML beside the JSON with
# every case passed); one threshold it misses (wire bytes per receiver) fails the command (exit
# 1) naming the case, and the XML carries that failure; a check file or scenario that cannot be
# gated is refused before any run (exit 11).
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" -q >/dev/null 2>&1; check synth 0 $?
scenario() {  # scenario FILE METHODS
  cat > "$1" <<YAML
name: run-check
mode: real
model:
  checkpoints: [$tmp/ck/step0.safetensors, $tmp/ck/step1.safetensors]
  work_dir: $tmp/work
steps: 1
methods: [$2]
transport: {kinds: [relay_tree]}
receivers: {count: 2}
network:
  regions: [{name: train}, {name: rollout, bandwidth: 10Gbit/s, latency: 0.1ms}]
  long_link: {bandwidth: 50Mbit/s, latency: 1ms}
  emulation: transport
YAML
}
scenario "$tmp/s.yaml" "delta, full"
printf 'min_speedup: 2\nmax_wire_bytes_per_receiver: 1MiB\nverified: true\n' > "$tmp/pass.yaml"
printf 'min_speedup: 2\nmax_wire_bytes_per_receiver: 16KiB\n' > "$tmp/miss.yaml"

"$dcr" run "$tmp/s.yaml" --out "$tmp/pass.json" --check "$tmp/pass.yaml" -q >"$tmp/pass.out" \
  2>"$tmp/pass.err"
check pass-exit 0 $?
has pass-summary "$tmp/pass.err" \
  "4 of 4 checks of $tmp/pass.yaml passed; JUnit XML $tmp/pass.junit.xml"
"$dcr" run "$tmp/s.yaml" --out "$tmp/miss.json" --check "$tmp/miss.yaml" -q >"$tmp/miss.out" \
  2>"$tmp/miss.err"
check miss-exit 1 $?
has miss-named "$tmp/miss.err" "dcr run --check: MISS delta/relay_tree/rate"
has miss-why "$tmp/miss.err" "wire bytes per receiver <= 16384: "
has miss-summary "$tmp/miss.err" "3 of 4 checks of $tmp/miss.yaml passed"
python3 - "$tmp" <<'PY'; check junit-xml 0 $?
import json, sys
import xml.etree.ElementTree as ET
t = sys.argv[1]
for name, failures in (("pass", 0), ("miss", 1)):
    root = ET.parse("%s/%s.junit.xml" % (t, name)).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert root.get("tests") == "4" and len(cases) == 4, ET.tostring(root)
    assert int(suite.get("failures")) == failures, (name, suite.attrib)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert len(failed) == failures, failed
    res = json.load(open("%s/%s.json" % (t, name)))
    delta = [r for r in res["runs"] if r["method"] == "delta"][0]
    if failures:
        assert "wire bytes per receiver" in failed[0], failed
        msg = [c for c in cases if c.find("failure") is not None][0].find("failure").get("message")
        per = delta["wire_bytes"] // delta["receivers"]
        assert msg.startswith("%d wire bytes per receiver" % per), (msg, per)
    # The cases name what was gated: receivers verified for both runs, the delta's speedup.
    names = " | ".join(c.get("name") for c in cases)
    assert "delta/relay_tree" in names and "full/relay_tree" in names, names
    assert "speedup >= 2x" in names and "every receiver verified" in names, names
print("ok   JUnit XML: 4 cases each, the miss is the wire-bytes case with the measured value")
PY

# Refused before any run: no result JSON, no JUnit XML.
refused() {  # refused NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  rm -f "$tmp/x.json" "$tmp/x.junit.xml"
  "$dcr" run "$@" -q >/dev/null 2>"$tmp/refused.err"
  check "$name" 11 $?
  has "$name-says" "$tmp/refused.err" "$pattern"
  [ ! -e "$tmp/x.json" ] && [ ! -e "$tmp/x.junit.xml" ]; check "$name-no-run" 0 $?
}
printf 'min_sped_up: 2\n' > "$tmp/typo.yaml"
refused unknown-key "min_sped_up: unknown key" "$tmp/s.yaml" --out "$tmp/x.json" \
  --check "$tmp/typo.yaml"
refused needs-out "--check needs --out" "$tmp/s.yaml" --check "$tmp/pass.yaml"
scenario "$tmp/delta-only.yaml" "delta"
refused speedup-needs-full "the scenario needs methods: [delta, full]" "$tmp/delta-only.yaml" \
  --out "$tmp/x.json" --check "$tmp/pass.yaml"
exit $fail
