#!/usr/bin/env bash
# Slow test: the committed reference results of the paper sweep (reports/paper/results/) are what
# the code on this commit simulates. Re-runs every scenarios/paper/*.yaml with `dcr run` and
# compares each run's refit time (relative 1e-6), wire and payload bytes (exact) with the committed
# file. A difference means the figures in reports/paper/ are stale: regenerate them (see
# reports/paper/README.md) in the change that moved them.
#   reproduce_paper.sh DCR_BINARY
set -euo pipefail
dcr="$1"
cd "$(dirname "$0")/../.."
out=$(mktemp -d /tmp/dcr-paper-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
status=0
for f in scenarios/paper/*.yaml; do
  name=$(basename "$f" .yaml)
  ref="reports/paper/results/$name.json"
  if [ ! -f "$ref" ]; then
    echo "FAIL $name: no committed result $ref" >&2
    status=1
    continue
  fi
  "$dcr" run "$f" --out "$out/$name.json" > /dev/null
  python3 - "$ref" "$out/$name.json" "$name" <<'PY' || status=1
import json, sys
ref, got, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
key = lambda r: (r["method"], r["transport"], round(r.get("configured_change_rate", r["change_rate"]), 6))
want = {key(r): r for r in ref["runs"]}
have = {key(r): r for r in got["runs"]}
bad = []
if set(want) != set(have):
    bad.append(f"runs differ: committed {sorted(want)} vs simulated {sorted(have)}")
for k in sorted(set(want) & set(have)):
    w, h = want[k], have[k]
    if abs(h["refit_seconds"] - w["refit_seconds"]) > 1e-6 * abs(w["refit_seconds"]):
        bad.append(f"{k}: refit {h['refit_seconds']!r} s, committed {w['refit_seconds']!r} s")
    for b in ("wire_bytes", "payload_bytes"):
        if h.get(b) != w.get(b):
            bad.append(f"{k}: {b} {h.get(b)}, committed {w.get(b)}")
if bad:
    print(f"FAIL {name}:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
wall = str(got.get("setup", {}).get("wall_seconds", "?")).split()[0]
print(f"ok   {name}: {len(have)} runs reproduce ({wall} s wall)")
PY
done
exit $status
