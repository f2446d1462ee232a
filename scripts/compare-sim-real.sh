#!/usr/bin/env bash
# compare-sim-real.sh [SCENARIO.yaml] [TOLERANCE]: runs a small scenario for real on this machine
# (dcr run, emulated long link) and simulated (dcr sim), then prints refit times side by side with
# the ratio sim/real per run. Exit 0 when every ratio is within 1 +- TOLERANCE (default 0.10).
# The simulator is calibrated on this machine at run time: `dcr bench pipeline` times the real sender and
# receiver code on the scenario's checkpoints just before and just after the real run (the two are
# averaged), and the share of the machine's cores that other tenants left to the real delta runs
# (recorded by dcr run from /proc/stat) sets the simulated shared CPU; the result records it all.
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:-scenarios/compare-small.yaml}
TOL=${2:-0.10}
DCR=${DCR:-build/dcr}
OUT=${OUT:-$(mktemp -d /tmp/dcr-compare.XXXXXX)}
mkdir -p "$OUT"
"$DCR" bench pipeline --scenario "$SCENARIO" --reps 5 --json "$OUT/calibration-before.json"
"$DCR" run "$SCENARIO" --out "$OUT/real.json"
"$DCR" bench pipeline --scenario "$SCENARIO" --reps 5 --json "$OUT/calibration-after.json"
python3 - "$OUT/calibration-before.json" "$OUT/calibration-after.json" "$OUT/calibration.json" "$OUT/real.json" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
real = json.load(open(sys.argv[4]))
def mean(x, y):
    if isinstance(x, dict):
        return {k: mean(v, y[k]) if k in y else v for k, v in x.items()}
    if isinstance(x, list):
        return [mean(u, v) for u, v in zip(x, y)]
    if isinstance(x, (int, float)) and not isinstance(x, bool) and isinstance(y, (int, float)):
        return (x + y) / 2
    return x
c = mean(a, b)
c["timing"] = "mean of two `dcr bench pipeline` runs, before and after the real run; " + a["timing"]
# The real nodes run mutual TLS and sign their deltas (network.tls and network.signing default on):
# the simulator charges both from the repository's measured costs.
import os
for k in ("tls", "signing"):
    c[k] = os.path.abspath(os.path.join("sim", "calibration", k + ".json"))
# The cores the machine left to the real delta runs (recorded by dcr run from /proc/stat and the
# runs' own CPU time; other tenants take the rest): the shared CPU the simulator gives the run.
avail = sorted(float(v) for k, v in real["setup"].items() if k.startswith("available_cores.delta."))
if avail:
    c["bench_available_cores"] = c.get("available_cores")
    c["available_cores"] = avail[len(avail) // 2]
    c["available_cores_source"] = "median over the real delta runs of (their CPU + idle CPU) / wall"
json.dump(c, open(sys.argv[3], "w"), indent=2)
PY
"$DCR" sim "$SCENARIO" -q --calibration "$OUT/calibration.json" --out "$OUT/sim.json" > /dev/null
python3 - "$OUT/real.json" "$OUT/sim.json" "$TOL" <<'PY'
import json, sys
real, sim, tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
key = lambda r: (r["method"], r["transport"], round(r.get("configured_change_rate", r["change_rate"]), 6))
s = {key(r): r for r in sim["runs"]}
# Every step of a real run is alike (same rate, same code): the median refit over the steps is
# what the simulation (one run per method) predicts.
steps = {}
for r in real["runs"]:
    steps.setdefault(key(r), []).append(r)
med = lambda xs: sorted(xs)[len(xs) // 2]
ok = True
print("| method | transport | change | real refit s (median; steps) | sim refit s | sim/real | real build s | sim build s |")
print("|---|---|---|---|---|---|---|---|")
for k, rs in steps.items():
    m = s.get(k)
    refits = [r["refit_seconds"] for r in rs]
    r_med = med(refits)
    if m is None or r_med <= 0 or any(r.get("error") for r in rs):
        ok = False
        print(f"| {k[0]} | {k[1]} | {k[2]:.0%} | {r_med:.3f} | - | - | | |")
        continue
    ratio = m["refit_seconds"] / r_med
    ok &= abs(ratio - 1) <= tol
    steps_txt = ", ".join(f"{x:.3f}" for x in refits)
    print(f"| {k[0]} | {k[1]} | {k[2]:.0%} | {r_med:.3f} ({steps_txt}) | {m['refit_seconds']:.3f} | "
          f"{ratio:.3f} | {med([r['phases']['build_s'] for r in rs]):.3f} | "
          f"{m['phases']['build_s']:.3f} |")
print(f"\nwithin +-{tol:.0%}: {'yes' if ok else 'NO'}")
sys.exit(0 if ok else 1)
PY
