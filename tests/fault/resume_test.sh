#!/usr/bin/env bash
# Resume of interrupted blobs in the shipped nodes: `kill -9` of a mid-tree relay (rank 2, two
# leaves below it) of a real `dcr run`, mid-stream. Its children lose their parent connection,
# and their ancestors a child; every node that falls back to the in-region store continues from
# the bytes it holds (whole blobs are not fetched again, a blob cut mid-stream is fetched from
# the byte offset it holds), so none of them receives a byte of the stream twice. The long link
# carries the stream once plus what the sender put into the store because the store lacked it
# (`long_link_fill_bytes`). Every receiver ends bit-exact.
set -uo pipefail
source "$(dirname "$0")/../lib/runs.sh"
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir="$work/k"
cat > "$work/s.yaml" <<YAML
name: resume
mode: real
model: {preset: tiny, seed: 3, work_dir: $dir}
change_rate: 3%
steps: 1
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 6}
delta: {chunk_elems: 1048576}
network:
  long_link: {bandwidth: 1Mbit/s, latency: 20ms}
  tls: false
YAML
"$DCR" run "$work/s.yaml" --out "$work/r.json" > "$work/out.txt" 2>&1 &
run_pid=$!
# Mid-stream: the stream takes about 1.2 s on this link.
wait_for "$dir/run-1/go" 30
sleep 0.5
if ! kill_rank "$run_pid" 2 > /dev/null; then
  echo "no node process of rank 2 to kill"; wait "$run_pid"; exit 1
fi
wait "$run_pid"; rc=$?
if [ "$rc" != 0 ]; then echo "dcr run exit $rc"; cat "$work/out.txt"; exit 1; fi
python3 - "$work/r.json" "$dir/run-1" <<'PY'
import glob, json, sys
from runs import assert_bit_exact, kill_restarts, load_steps
(run,) = load_steps(sys.argv[1], 1)
assert_bit_exact(run, receivers=6)
assert len(run["receiver_results"]) == 6, run
assert kill_restarts([run], 2), run.get("restarts")
rec, payload = run["recovery"], run["payload_bytes"]
assert rec["fallbacks"] >= 1 and rec["resumed_blobs"] >= 1 and rec["resumed_bytes"] > 0, rec
# Nodes that kept their process: tree bytes and store bytes together are the stream once.
for x in run["receiver_results"]:
    if x["node"] == 2:
        continue  # restarted: its memory died with it, it fetches what its journal lacks
    assert x["bytes_received"] <= payload, (x["node"], x["bytes_received"], payload)
# The long link: the stream once (framing and heartbeats included), plus the fill, which is
# what the store lacked, not the stream again.
fill = rec["long_link_fill_bytes"]
assert fill < payload, (fill, payload)
assert run["wire_bytes"] <= 1.05 * payload + fill, (run["wire_bytes"], payload, fill)
partial = []
for f in glob.glob(sys.argv[2] + "/node-*.json"):
    partial += [l for l in json.load(open(f))["recovery"]["log"].splitlines()
                if l.startswith("resumed blob")]
print("kill -9 of relay 2: %d/6 bit-exact; %d fallbacks resumed %d blobs (%d bytes held, "
      "%d at a byte offset), %d bytes fetched from the store; long link %d bytes for a %d-byte "
      "stream, of which %d put into the store after the tree failed" %
      (run["receivers_verified"], rec["fallbacks"], rec["resumed_blobs"], rec["resumed_bytes"],
       len(partial), rec["store_fetched_bytes"], run["wire_bytes"], payload, fill))
for x in run["receiver_results"]:
    print("  node %d: %d bytes received" % (x["node"], x["bytes_received"]))
for l in partial[:5]:
    print("  " + l)
PY
