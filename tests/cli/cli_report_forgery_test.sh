#!/usr/bin/env bash
# Commit reports against a hostile child, through the real dcr-node: the sender (rank 0) feeds
# rank 1, a forging child (forging_child.py), and rank 2, a real receiver. Rank 1 reports itself
# twice and a committed rank 2 (not in its subtree): the sender keeps rank 1's first record and
# the real rank 2's own, refuses the duplicate and the forgery naming each, and ends OK.
source "$(dirname "$0")/cli_lib.sh" "$@"
node="$(dirname "$dcr")/dcr-node"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/ck" >/dev/null 2>&1; check synth 0 $?
ports=$(python3 -c "
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))")
python3 - "$tmp" "$ports" <<'PY'
import json, sys
tmp, ports = sys.argv[1], sys.argv[2].split()
for rank in (0, 2):
    plan = {
        "rank": rank, "transport": "relay_tree", "method": "delta", "parents": [-1, 0, 0],
        "addresses": ["127.0.0.1:" + p for p in ports], "run_id": 77, "version": 1,
        "relay": {"piece_bytes": 1 << 20, "window_bytes": 4 << 20, "root_streams": 1,
                  "apply": True, "max_parallel_applies": 2, "max_parallel_puts": 2,
                  "max_parallel_fetches": 2, "prefix": "p", "poll_interval_s": 0.01,
                  "poll_timeout_s": 10, "retry_backoff_s": 0.05, "max_retries": 3},
        "emulate_wan": False, "long_bandwidth_Bps": 0, "long_latency_s": 0, "store": "",
        "base_path": tmp + "/ck/step0.safetensors", "target_path": tmp + "/ck/step1.safetensors",
        "chunk_elems": 65536, "zstd_level": 1, "build_threads": 1, "full_slice_bytes": 1 << 20,
        "receiver_base_path": tmp + "/ck/step0.safetensors",
        "verify_path": tmp + "/ck/step1.safetensors", "timeout_s": 30,
        "result_path": "%s/result-%d.json" % (tmp, rank)}
    json.dump(plan, open("%s/plan-%d.json" % (tmp, rank), "w"))
PY
check plans 0 $?
set -- $ports
python3 "$(dirname "$0")/forging_child.py" --listen "127.0.0.1:$2" --forge 2 & child=$!
"$node" --plan "$tmp/plan-2.json" > "$tmp/node2.log" 2>&1 & rx=$!
"$node" --plan "$tmp/plan-0.json" > "$tmp/node0.log" 2>&1; check sender 0 $?
wait $rx; check receiver 0 $?
wait $child
has forged-refused "$tmp/node0.log" "refused a commit report: child node 1 reported rank 2, which is not in its subtree"
has duplicate-refused "$tmp/node0.log" "refused a commit report: child node 1 reported rank 1 a second time"
python3 - "$tmp/result-0.json" <<'PY'; check reports-kept 0 $?
import json, sys
r = json.load(open(sys.argv[1]))
ranks = sorted(c["rank"] for c in r["reports"])
assert ranks == [1, 2], r["reports"]
(real,) = [c for c in r["reports"] if c["rank"] == 2]
assert real["ok"] and real["target_hash"] == r["target_hash"] != "0" * 32, (real, r["target_hash"])
assert r["ok"], r
PY
exit $fail
