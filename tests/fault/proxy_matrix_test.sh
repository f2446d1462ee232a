#!/usr/bin/env bash
# The fault-proxy matrix: `dcr run scenarios/faults-proxy.yaml` puts `dcr fault-proxy` processes on
# seeded relay-tree edges of real refits (mutual TLS and signed deltas on, the proxy's TLS
# terminated with certificates minted from each run's CA) and injects corrupt, duplicated,
# reordered and delayed chunk frames, dropped connections, a partitioned long link, and failed
# writes of the in-region store. Every kind must be injected and survived, every receiver end
# bit-exact (each verifies its storage byte for byte against the target after committing).
# Then a shorter pass with plain TCP edges (network.tls: false).
set -euo pipefail
DCR=$1
work=$(mktemp -d)
trap 'chattr -R -i "$work" 2>/dev/null || true; chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
check() {
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
f = r["faults"]
print("%s: %d runs, %d faults injected, %d survived, %d/%d receivers bit-exact, %.0f s" %
      (sys.argv[2], f["runs"], f["faults_injected"], f["faults_survived"], f["receivers_verified"],
       f["receivers"], f["seconds"]))
for k, v in sorted(f["injected_by_kind"].items()):
    print("  %-24s injected %3d survived %3d" % (k, v, f["survived_by_kind"].get(k, 0)))
print("  store fallbacks %d" % f["fallbacks_to_store"])
assert f["faults_survived"] == f["faults_injected"], f.get("errors")
assert f["receivers_verified"] == f["receivers"], f.get("errors")
kinds = ["proxy:corrupt", "proxy:duplicate", "proxy:reorder", "proxy:delay", "proxy:drop",
         "proxy:partition"]
if sys.argv[2] == "tls":  # every kind, under the default security
    for k in kinds + ["store:write_fail"]:
        assert f["injected_by_kind"].get(k, 0) > 0, "no " + k
else:
    assert f["faults_injected"] >= 6, "fewer than 6 faults injected"
for run in r["runs"]:
    assert not run.get("error"), run.get("error")
    assert run["receivers_verified"] == run["receivers"]
    for rr in run["receiver_results"]:
        assert rr["verified"], rr
PY
}
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/tls|" scenarios/faults-proxy.yaml > "$work/tls.yaml"
"$DCR" run -q "$work/tls.yaml" --out "$work/tls.json" > "$work/tls.txt"
check "$work/tls.json" tls
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/plain|; s|^  read_deadline: 1s|  read_deadline: 1s\n  tls: false|; s|proxy_runs: 14|proxy_runs: 7|; s|^  seed: 1|  seed: 5|" \
  scenarios/faults-proxy.yaml > "$work/plain.yaml"
"$DCR" run -q "$work/plain.yaml" --out "$work/plain.json" > "$work/plain.txt"
check "$work/plain.json" plain
