#!/usr/bin/env bash
# compare-sim-real.sh [SCENARIO.yaml] [DELTA_TOL] [FULL_TOL]: runs a small scenario for real on this
# machine (dcr run, emulated long link) and simulated (dcr sim), then prints refit times side by
# side with the ratio sim/real per run. Exit 0 when, per method, the median over the steps (the
# scenario's repeats) of sim/real is within 1 +- DELTA_TOL (default 0.10) for delta runs and
# 1 +- FULL_TOL (default 0.01) for full-checkpoint runs; exit 1 otherwise. The last lines (also in
# OUT/summary.txt) give each median, the number of steps it is over, and the verdict.
# The simulator is calibrated on this machine at run time: `dcr bench pipeline` times the real
# sender and receiver code on the scenario's checkpoints just before and just after the real run
# (the two are averaged). Each real delta step is predicted on its own: the share of the machine's
# cores that other tenants left to that step (recorded by dcr run from /proc/stat over its refit
# window) sets the simulated shared CPU of one simulation per step; full steps get the median of
# the delta steps' (below). Everything lands in OUT (calibration*.json, real.json, sim-*.json).
# Environment:
#   DCR (default build/dcr), OUT (default a new /tmp/dcr-compare.* folder).
#   DCR_AGREEMENT_PERTURB=F (e.g. 1.15): simulate a machine and long link F times slower (every
#     calibrated CPU rate and the long link's bandwidth divided by F): the check then fails, which
#     shows it can. Results go to OUT/perturbed-F/.
#   DCR_AGREEMENT_REUSE=1: keep OUT's real run and calibration (no bench, no real run) and only
#     simulate and compare again (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:-scenarios/compare-small.yaml}
DELTA_TOL=${2:-0.10}
FULL_TOL=${3:-0.01}
DCR=${DCR:-build/dcr}
OUT=${OUT:-$(mktemp -d /tmp/dcr-compare.XXXXXX)}
PERTURB=${DCR_AGREEMENT_PERTURB:-}
mkdir -p "$OUT"
if [ "${DCR_AGREEMENT_REUSE:-0}" != "1" ]; then
  # Nothing of an earlier run in OUT may be read as this one's.
  rm -rf "$OUT"/real.json "$OUT"/calibration*.json "$OUT"/sim-cores-*.json "$OUT"/cores.txt \
    "$OUT"/available.json "$OUT"/summary.txt "$OUT"/perturbed-*
  "$DCR" bench pipeline --scenario "$SCENARIO" --reps 5 --json "$OUT/calibration-before.json"
  "$DCR" run "$SCENARIO" --out "$OUT/real.json"
  "$DCR" bench pipeline --scenario "$SCENARIO" --reps 5 --json "$OUT/calibration-after.json"
fi
for f in calibration-before.json calibration-after.json real.json; do
  if [ ! -f "$OUT/$f" ]; then
    echo "compare-sim-real.sh: $OUT/$f missing (DCR_AGREEMENT_REUSE=1 needs a complete run)" >&2
    exit 2
  fi
done
SIM_DIR="$OUT"
SIM_SCENARIO="$SCENARIO"
if [ -n "$PERTURB" ]; then
  SIM_DIR="$OUT/perturbed-$PERTURB"
  mkdir -p "$SIM_DIR"
  SIM_SCENARIO="$SIM_DIR/scenario.yaml"
  # The scenario with its long link F times slower (the calibration is passed on the command line).
  python3 - "$SCENARIO" "$PERTURB" "$SIM_SCENARIO" <<'PY'
import re, sys
text, f = open(sys.argv[1]).read(), float(sys.argv[2])
def slower(m):
    return "%s%.6g%s" % (m.group(1), float(m.group(2)) / f, m.group(3))
text, n = re.subn(r"(long_link:\s*\{\s*bandwidth:\s*)([0-9.]+)(\s*[A-Za-z/]+)", slower, text)
if n != 1:
    sys.exit("compare-sim-real.sh: no long_link bandwidth to perturb in " + sys.argv[1])
text = re.sub(r"(?m)^(\s*)calibration:.*$", r"\1# calibration: from the command line", text)
open(sys.argv[3], "w").write(text)
PY
fi
# One calibration per real step: the mean of the two benches, with that step's available cores.
python3 - "$OUT/calibration-before.json" "$OUT/calibration-after.json" "$OUT/real.json" "$SIM_DIR" \
  "$PERTURB" <<'PY'
import json, os, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
real, out, perturb = json.load(open(sys.argv[3])), sys.argv[4], sys.argv[5]
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
if perturb:
    # A machine F times slower: every rate divided by F, every time per unit multiplied by F.
    f = float(perturb)
    def slower(x):
        if isinstance(x, dict):
            return {k: (v / f if k.endswith("bytes_per_s") else
                        v * f if k.endswith("_s") or "_s_per_" in k else slower(v))
                    if isinstance(v, (int, float)) and not isinstance(v, bool) else slower(v)
                    for k, v in x.items()}
        if isinstance(x, list):
            return [slower(v) for v in x]
        return x
    c = slower(c)
    c["timing"] += "; perturbed: every rate / %g (DCR_AGREEMENT_PERTURB)" % f
# The real nodes run mutual TLS and sign their deltas (network.tls and network.signing default on):
# the simulator charges both from the repository's measured costs.
for k in ("tls", "signing"):
    c[k] = os.path.abspath(os.path.join("sim", "calibration", k + ".json"))
c["bench_available_cores"] = c.get("available_cores")
c["available_cores_source"] = ("one real step's (CPU of its node processes + idle CPU) / wall over "
                               "its refit window, recorded by dcr run")
json.dump(c, open(os.path.join(out, "calibration.json"), "w"), indent=2)
# The distinct available-cores values of the steps: one simulation each (see below).
avail = {k[len("available_cores."):]: v for k, v in real["setup"].items()
         if k.startswith("available_cores.")}
delta = sorted(v for k, v in avail.items() if k.startswith("delta."))
if delta:
    avail["delta-median"] = delta[len(delta) // 2]
cores = sorted(set(avail.values()))
json.dump(avail, open(os.path.join(out, "available.json"), "w"), indent=2)
for v in cores:
    c["available_cores"] = float(v)
    json.dump(c, open(os.path.join(out, "calibration-cores-" + v + ".json"), "w"), indent=2)
print("\n".join(cores), file=open(os.path.join(out, "cores.txt"), "w"))
PY
while read -r cores; do
  [ -n "$cores" ] || continue
  "$DCR" sim "$SIM_SCENARIO" -q --calibration "$SIM_DIR/calibration-cores-$cores.json" \
    --out "$SIM_DIR/sim-cores-$cores.json" > /dev/null
done < "$SIM_DIR/cores.txt"
python3 - "$SIM_DIR" "$DELTA_TOL" "$FULL_TOL" "$OUT/real.json" "$SCENARIO" "$PERTURB" <<'PY'
import json, os, sys
out, tols = sys.argv[1], {"delta": float(sys.argv[2]), "full": float(sys.argv[3])}
real = json.load(open(sys.argv[4]))
name = os.path.splitext(os.path.basename(sys.argv[5]))[0]
perturb = sys.argv[6]
rate_of = lambda r: r.get("configured_change_rate") or r["change_rate"]
key = lambda r: (r["method"], r["transport"], round(rate_of(r), 6))
med = lambda xs: sorted(xs)[len(xs) // 2]
sims = {}
# The simulator gives one run per key (its step 1 stands for every step) and, for durable delta
# runs, one more for the step whose commit writes the version log's image, when one is due.
def sim_for(cores, step):
    if cores not in sims:
        s = json.load(open(os.path.join(out, "sim-cores-" + cores + ".json")))
        sims[cores] = {}
        for r in s["runs"]:
            sims[cores].setdefault(key(r), {})[r.get("step", 1)] = r
    return {k: by_step.get(step, by_step.get(1)) for k, by_step in sims[cores].items()}
# A delta step is CPU-bound: the cores it got (its CPU + idle CPU, over its wall time) are what
# the machine gave it. A full step is link-bound and uses a fraction of a core, so on a saturated
# machine its own figure is its usage, not what it could have had: full steps get the median of
# the delta steps (the cores a CPU-bound run got in the same session), or their own without any.
avail = json.load(open(os.path.join(out, "available.json")))
steps = {}
for r in real["runs"]:
    tag = "%s.%s.%g.%d" % (r["method"], r["transport"], rate_of(r) * 100, r["step"])
    cores = avail.get(tag)
    if r["method"] != "delta" and "delta-median" in avail:
        cores = avail["delta-median"]
    steps.setdefault(key(r), []).append((r, cores))
ok = True
summary = {}
print("| method | transport | change | step | cores left | real refit s | sim refit s | sim/real |")
print("|---|---|---|---|---|---|---|---|")
for k, rs in steps.items():
    ratios = []
    for r, cores in rs:
        m = sim_for(cores, r["step"]).get(k) if cores is not None else None
        if m is None or r["refit_seconds"] <= 0 or r.get("error") or m.get("error"):
            ok = False
            print(f"| {k[0]} | {k[1]} | {k[2]:.0%} | {r['step']} | {cores} | "
                  f"{r['refit_seconds']:.3f} | - | - |")
            continue
        ratio = m["refit_seconds"] / r["refit_seconds"]
        ratios.append(ratio)
        print(f"| {k[0]} | {k[1]} | {k[2]:.0%} | {r['step']} | {cores} | {r['refit_seconds']:.3f} | "
              f"{m['refit_seconds']:.3f} | {ratio:.3f} |")
    if not ratios:
        continue
    tol = tols.get(k[0], tols["delta"])
    within = abs(med(ratios) - 1) <= tol
    ok &= within
    summary[k] = (med(ratios), len(ratios), tol, within)
if not summary:
    ok = False
lines = []
tag = f" (simulator perturbed x{perturb})" if perturb else ""
for k, (ratio, n, tol, within) in summary.items():
    lines.append(f"agreement {name}{tag}: {k[0]} {k[1]} {k[2]:.0%}: median sim/real {ratio:.3f} "
                 f"over {n} steps (tolerance +-{tol:.0%}): {'within' if within else 'OUTSIDE'}")
lines.append(f"agreement {name}{tag}: {'PASS' if ok else 'FAIL'}")
print()
print("\n".join(lines))
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
sys.exit(0 if ok else 1)
PY
