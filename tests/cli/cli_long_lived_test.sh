#!/usr/bin/env bash
# `dcr run` of a multi-step scenario keeps ONE set of dcr-node processes across the steps
# (long-lived nodes, one version per step): every receiver of a relay tree with two relay levels
# is verified byte for byte at every step, its own commit report reaches the sender for that
# step's version, and each rank's results of every step come from one process.
source "$(dirname "$0")/cli_lib.sh" "$@"
cat > "$tmp/s.yaml" <<YAML
name: long-lived
mode: real
model: {preset: tiny, work_dir: $tmp/work}
steps: 3
change_rate: 3%
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {topology: [-1, 0, 0, 1, 3, 2, 2]}}
receivers: {count: 6}
$(two_regions)
YAML
"$dcr" run "$tmp/s.yaml" -q --out "$tmp/r.json" > "$tmp/table.md" 2> "$tmp/err.txt"; check run 0 $?
python3 - "$tmp/r.json" "$tmp/work" <<'PY'; check steps-verified-one-process 0 $?
import glob, json, os, sys
from runs import assert_bit_exact, load_steps
runs = load_steps(sys.argv[1], 3)
hashes = []
for r in runs:
    assert_bit_exact(r, receivers=6, committed=True)
    assert len(r["receiver_results"]) == 6, r
    step_hashes = set()
    for rx in r["receiver_results"]:
        assert rx["report"]["ok"] and rx["report"]["version"] == r["step"], rx
        step_hashes.add(rx["report"]["target_hash"])
    assert len(step_hashes) == 1, step_hashes
    hashes.append(step_hashes.pop())
assert len(set(hashes)) == 3, hashes  # three distinct versions
# One process per rank for all three steps, one run folder for the session.
(run_dir,) = glob.glob(os.path.join(sys.argv[2], "run-*"))
for rank in range(7):
    pids = {json.load(open(os.path.join(run_dir, "node-%d-v%d.json" % (rank, k))))["pid"]
            for k in (1, 2, 3)}
    assert len(pids) == 1 and 0 not in pids, (rank, pids)
    res = json.load(open(os.path.join(run_dir, "node-%d-v3.json" % rank)))
    assert res["ok"], res
PY
exit $fail
