#!/usr/bin/env bash
# A durable signed receiver killed at each step of its version log's commit keeps what proves the
# version it holds (core/docs/security.md "Commitments", a restarted long-lived receiver).
# `dcr run` of a two-step signed refit (one receiver, long-lived nodes with their state), nine
# process runs with one SIGKILL each through `dcr-node-faults`, the fault runner's kinds in order:
# a receiver between and inside chunks, a relay and the sender mid-stream, a kill from outside,
# and the receiver at its version log's `entries-synced`, `marker-synced`, `image-half-written`
# and `image-renamed` kill points. Every kill is survived bit-exact, and in every run each
# version a receiver recorded done has its signed state beside it (`v<k>/rank-<r>.signed`, the
# trainer's final manifest with the commitment), so the next restart proves the held version
# against the trainer's commitment; no restart takes a version the log committed without one.
#   signed_state_kill_test.sh DCR    (dcr-node-faults is found beside DCR)
set -uo pipefail
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/s.yaml" <<YAML
name: signed-state-kills
mode: real
model: {preset: tiny, seed: 3, work_dir: $work/w}
change_rate: 3%
steps: 2
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 1, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 1}
delta: {chunk_elems: 16384}
network:
  long_link: {bandwidth: 100Mbit/s, latency: 10ms}
  tls: false
faults:
  runs: 0
  process_runs: 9
  process_kills: 1
  seed: 1
  only: true
YAML
"$DCR" run "$work/s.yaml" --out "$work/r.json" > "$work/out.txt" 2>&1
rc=$?
if [ $rc != 0 ]; then echo "FAIL dcr run: exit $rc"; tail -20 "$work/out.txt"; exit 1; fi
python3 - "$work/r.json" "$work/w" <<'PY'
import glob, json, os, sys
r = json.load(open(sys.argv[1])); w = sys.argv[2]
f = r["faults"]
print("kills: %d injected, %d survived, %d/%d receivers bit-exact" %
      (f["faults_injected"], f["faults_survived"], f["receivers_verified"], f["receivers"]))
fail = []
for k in ["process:receiver_log_entries_synced", "process:receiver_log_marker_synced",
          "process:receiver_log_image_half_written", "process:receiver_log_image_renamed"]:
    if f["injected_by_kind"].get(k, 0) == 0: fail.append("no " + k + " injected")
if f["faults_survived"] != f["faults_injected"]: fail.append("not survived: %s" % f.get("errors"))
if f["receivers_verified"] != f["receivers"]: fail.append("not bit-exact: %s" % f.get("errors"))
runs = sorted(glob.glob(os.path.join(w, "run-*")))
if len(runs) != 9: fail.append("%d run folders" % len(runs))
for run in runs:
    for done in glob.glob(os.path.join(run, "state", "v*", "rank-*.done")):
        rank = os.path.basename(done).split(".")[0]
        if rank == "rank-0": continue
        signed = os.path.join(os.path.dirname(done), rank + ".signed")
        if not os.path.exists(signed):
            fail.append("%s: %s recorded done without its signed state" %
                        (os.path.relpath(done, w), rank))
    for log in glob.glob(os.path.join(run, "node-*.log")):
        text = open(log, errors="replace").read()
        if "ended before writing its signed state" in text:
            fail.append("%s: a restart took a version without its signed state" %
                        os.path.relpath(log, w))
for x in fail: print("FAIL " + x)
if not fail: print("ok   every held version has its signed state after every kill")
sys.exit(1 if fail else 0)
PY
