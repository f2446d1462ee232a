#!/usr/bin/env bash
# S3 faults through the real Swift s3api server: `dcr run scenarios/faults-s3.yaml` puts a
# `dcr s3-fault-proxy` process in front of the endpoint of real object-store refits and injects
# 503 answers, connections cut mid-body, stalls past the read deadline, truncated bodies and wrong
# ETags, on uploads (the sender's puts) and downloads (the receivers' ranged gets). Every kind and
# direction must be injected and survived, every receiver end bit-exact (each verifies its storage
# byte for byte against the target after committing), and each fault be noticed by the nodes' S3
# client: in every run the nodes count at least one failed store call per injected fault, and
# at least one refused response (kDataLoss) per truncated body or wrong ETag. Skips (exit 77) when no S3 server is set up
# (DCR_S3_ENDPOINT unset; scripts/start-s3-server.sh prints the environment).
set -euo pipefail
DCR=$1
if [ -z "${DCR_S3_ENDPOINT:-}" ]; then
  echo "skip: DCR_S3_ENDPOINT unset (scripts/start-s3-server.sh)"
  exit 77
fi
SRC=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ca=${DCR_S3_CA_FILE:-}
extra=""
case "$DCR_S3_ENDPOINT" in http://*) extra=", allow_http: true";; esac
bucket="dcr-faults-$$"
sed "s|^  seed: 3|  seed: 3\n  work_dir: $work/run|; s|object_store: {kind: s3, endpoint: \"https://127.0.0.1:8443\", ca_file: /tmp/dcr-swift/tls/ca.crt,|object_store: {kind: s3, endpoint: \"$DCR_S3_ENDPOINT\", ca_file: \"$ca\"$extra,|; s|bucket: dcr-faults,|bucket: $bucket,|; s|region: us-east-1,|region: ${DCR_S3_REGION:-us-east-1},|" \
  "$SRC/scenarios/faults-s3.yaml" > "$work/s3.yaml"
grep -q "$DCR_S3_ENDPOINT" "$work/s3.yaml"
"$DCR" run -q "$work/s3.yaml" --out "$work/s3.json" > "$work/s3.txt"
python3 - "$work/s3.json" "$work/run" <<'PY'
import glob, json, os, re, sys
r = json.load(open(sys.argv[1]))
f = r["faults"]
print("s3: %d runs, %d faults injected, %d survived, %d/%d receivers bit-exact, %d restarts, %.0f s" %
      (f["runs"], f["faults_injected"], f["faults_survived"], f["receivers_verified"],
       f["receivers"], f["restarts"], f["seconds"]))
for k, v in sorted(f["injected_by_kind"].items()):
    print("  %-24s injected %3d survived %3d" % (k, v, f["survived_by_kind"].get(k, 0)))
assert f["faults_survived"] == f["faults_injected"], f.get("errors")
assert f["receivers_verified"] == f["receivers"], f.get("errors")
for kind in ["5xx", "cut", "stall", "truncate", "bad_etag"]:
    for d in ["upload", "download"]:
        k = "s3:%s:%s" % (kind, d)
        assert f["injected_by_kind"].get(k, 0) > 0, "no " + k
logs = sorted(glob.glob(os.path.join(sys.argv[2], "run-*", "s3-proxy.log.json")),
              key=lambda p: int(re.search(r"run-(\d+)", p).group(1)))
assert len(logs) == len(r["runs"]) == f["runs"], (len(logs), len(r["runs"]))
for run, log in zip(r["runs"], logs):
    injected = json.load(open(log))["injected"]
    rec = run["recovery"]
    corrupt = sum(1 for e in injected if e["kind"] in ("truncate", "bad_etag"))
    assert rec["store_failures"] >= len(injected), (log, rec, injected)
    assert rec["store_refused"] >= corrupt, (log, rec, injected)
for run in r["runs"]:
    assert not run.get("error"), run.get("error")
    assert run["receivers_verified"] == run["receivers"]
    for rr in run["receiver_results"]:
        assert rr["verified"], rr
PY
