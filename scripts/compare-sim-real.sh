#!/usr/bin/env bash
# compare-sim-real.sh [SCENARIO.yaml] [TOLERANCE]: runs a small scenario for real on this machine
# (dcr run, emulated long link) and simulated (dcr sim), then prints refit times side by side with
# the ratio sim/real per run. Exit 0 when every ratio is within 1 +- TOLERANCE (default 0.10).
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:-scenarios/compare-small.yaml}
TOL=${2:-0.10}
DCR=${DCR:-build/dcr}
OUT=${OUT:-$(mktemp -d /tmp/dcr-compare.XXXXXX)}
"$DCR" run "$SCENARIO" --out "$OUT/real.json"
"$DCR" sim "$SCENARIO" -q --out "$OUT/sim.json" > /dev/null
python3 - "$OUT/real.json" "$OUT/sim.json" "$TOL" <<'PY'
import json, sys
real, sim, tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
key = lambda r: (r["method"], r["transport"], round(r["change_rate"], 6))
s = {key(r): r for r in sim["runs"]}
ok = True
print("| method | transport | change | real refit s | sim refit s | sim/real |")
print("|---|---|---|---|---|---|")
for r in real["runs"]:
    m = s.get(key(r))
    if m is None or r["refit_seconds"] <= 0:
        ok = False
        print(f"| {r['method']} | {r['transport']} | {r['change_rate']:.0%} | {r['refit_seconds']:.2f} | - | - |")
        continue
    ratio = m["refit_seconds"] / r["refit_seconds"]
    ok &= abs(ratio - 1) <= tol
    print(f"| {r['method']} | {r['transport']} | {r['change_rate']:.0%} | {r['refit_seconds']:.2f} | "
          f"{m['refit_seconds']:.2f} | {ratio:.3f} |")
print(f"\nwithin +-{tol:.0%}: {'yes' if ok else 'NO'}")
sys.exit(0 if ok else 1)
PY
