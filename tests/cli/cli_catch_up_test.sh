#!/usr/bin/env bash
# Versions over time in a real multi-step `dcr run` (scenario block `catch_up:`): one set of
# dcr-node processes for five steps over a relay tree, plus two receivers in the rollout region
# that follow the versions from the in-region store the long-link relay fills:
#  - rank 7 is killed once it committed version 1 as step 2 starts and kept down until step 4
#    starts: the sender declares it dead at version 2 (no commit report within
#    receivers.deadline) and goes on without it; restarted, it comes back from its journal
#    holding version 1 (it does not take version 1 again), replays the retained deltas of the
#    versions it missed from the in-region store and is re-admitted;
#  - rank 8 joins when step 3 starts holding nothing: it asks for a full frame, which the
#    long-link relay (an in-region holder of the committed version) puts into the region store.
# Every receiver is bit-exact at every version it held (each verifies its bytes against that
# step's target checkpoint), the run exits 0, the result JSON names who caught up, how, and the
# long-link bytes it cost (none: the sender's long-link bytes stay one stream per child). The
# region receivers' commit reports in the store carry their rank's signature.
source "$(dirname "$0")/cli_lib.sh" "$@"
cat > "$tmp/s.yaml" <<YAML
name: catch-up
mode: real
model: {preset: tiny, work_dir: $tmp/work}
steps: 5
change_rate: 3%
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {topology: [-1, 0, 0, 1, 3, 2, 2]}}
receivers: {count: 6, deadline: 2s}
catch_up: {down_step: 2, down_versions: 2, join_step: 3}
$(two_regions)
YAML
"$dcr" run "$tmp/s.yaml" -q --out "$tmp/r.json" > "$tmp/table.md" 2> "$tmp/err.txt"; check run 0 $?
[ -s "$tmp/r.json" ] || { cat "$tmp/err.txt"; exit 1; }
python3 - "$tmp/r.json" "$tmp/work" <<'PY'; check caught-up-bit-exact 0 $?
import glob, json, os, sys
from runs import assert_bit_exact, load_steps
runs = load_steps(sys.argv[1], 5)
how = {}  # (rank, step) -> catch_up
events = []
for r in runs:
    assert_bit_exact(r)
    for x in r["receiver_results"]:
        how[(x["node"], r["step"])] = x.get("catch_up", "tree")
    # No catch-up crossed the long link: the sender sent its stream once to each of its two
    # children (payload plus frame headers), no second copy for a region receiver.
    assert r["wire_bytes"] <= 2 * r["payload_bytes"] * 1.05, r
    for e in r.get("catch_up", []):
        events.append((r["step"], e["node"], e["event"], e["long_link_bytes"], e["store_bytes"]))
print("events:", events)
print("how:", sorted(how.items()))
# Rank 7: declared dead at version 2, replayed the versions it missed from the region store;
# version 1 it took once, before the kill (its journal holds it across the restart).
assert (2, 7, "declared_dead", 0, 0) in events, events
assert how[(7, 1)] == "follow", how[(7, 1)]
assert not any(e[:3] == (1, 7, "replay") for e in events), events
for step in (2, 3):
    assert how[(7, step)] == "replay", (step, how[(7, step)])
    assert any(e[:3] == (step, 7, "replay") and e[3] == 0 and e[4] > 0 for e in events), events
assert any(e[1:3] == (7, "readmitted") and e[0] >= 4 for e in events), events
# Rank 8: absent before it joined, then a full frame from inside the region, then it follows.
assert how[(8, 1)] == "absent" and how[(8, 2)] == "absent", how
frame = [e for e in events if e[1:3] == (8, "full_frame")]
assert len(frame) == 1 and frame[0][3] == 0 and frame[0][4] > 0, events
for step in range(frame[0][0] + 1, 6):
    assert how[(8, step)] in ("follow", "replay"), (step, how[(8, step)])
assert any(e[1:3] == (8, "readmitted") for e in events), events
# One process per tree rank for every step; rank 7 ran twice (killed, started again).
(run_dir,) = glob.glob(os.path.join(sys.argv[2], "run-*"))
for rank in range(7):
    pids = {json.load(open(os.path.join(run_dir, "node-%d-v%d.json" % (rank, k))))["pid"]
            for k in range(1, 6)}
    assert len(pids) == 1, (rank, pids)
PY
python3 - "$(ls -d "$tmp"/work/run-*)" <<'PY'; check region-reports-signed 0 $?
import glob, os, struct, sys
reports = glob.glob(os.path.join(sys.argv[1], "region-store", "*", "step-*", "reports", "[78]"))
assert len(reports) >= 5, reports
for path in reports:
    b = open(path, "rb").read()
    (body,) = struct.unpack_from("<I", b, 0)
    (tail,) = struct.unpack_from("<I", b, 4 + body)
    assert tail > 64, (path, tail)  # certificate and Ed25519 signature (tls.h SignReport)
PY
# Each node's state of the versions before the one it holds is collected after each commit:
# v1..v4 hold no file of any rank; every rank holds version 5 (its .held record).
run_dir=$(ls -d "$tmp"/work/run-*)
left=$(find "$run_dir"/state/v[1-4] -type f | wc -l)
check earlier-versions-collected 0 "$left"
check every-rank-holds-v5 9 "$(grep -l '"version":5' "$run_dir"/state/rank-*.held | wc -l)"
if grep -q "refused the region store" "$(ls -d "$tmp"/work/run-*)/node-0.log"; then
  echo "FAIL: the sender refused a region receiver's own report"; fail=1
fi
has frame-logged "$(ls -d "$tmp"/work/run-*)/node-8.log" "full frame of version"
has served-logged "$(ls -d "$tmp"/work/run-*)/node-1.log" "full frame of version"
# A region receiver killed after it recorded version 5 done and before it put that version's
# report: its process started again (same plan, same state) puts the report of the version it
# holds, signed; started once more, it keeps the report that is there.
node="$(cd "$(dirname "$dcr")" && pwd)/dcr-node"
(report=$(ls "$run_dir"/region-store/*/step-5/reports/7) && cp "$report" "$tmp/report-7" &&
  rm "$report" && "$node" --plan "$run_dir/plan-7.json" > /dev/null 2> "$tmp/again.err" &&
  cmp -s "$report" "$tmp/report-7"); check report-put-again 0 $?
has report-put-again-logged "$tmp/again.err" "commit report of version 5 put again"
report=$(ls "$run_dir"/region-store/*/step-5/reports/7)
"$node" --plan "$run_dir/plan-7.json" > /dev/null 2> "$tmp/again2.err"; check restart-again 0 $?
lacks report-kept "$tmp/again2.err" "put again"
cmp -s "$report" "$tmp/report-7"; check report-unchanged 0 $?
exit $fail
