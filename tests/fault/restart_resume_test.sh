#!/usr/bin/env bash
# A restarted receiver resumes from the bytes it kept in its state dir: `kill -9` of a leaf
# (rank 6) of a real `dcr run` mid-stream, which `dcr run` restarts. The killed process kept
# every piece it received in its spool (<state>/rank-6.spool); the restarted one reads back the
# records that verify and its store download continues by (blob, offset) from them, so it
# fetches about what the dead process had not yet received, not the stream again. Every
# receiver ends bit-exact.
set -uo pipefail
source "$(dirname "$0")/../lib/runs.sh"
DCR=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dir="$work/k"
cat > "$work/s.yaml" <<YAML
name: restart-resume
mode: real
model: {preset: tiny, seed: 5, work_dir: $dir}
change_rate: 3%
steps: 1
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 6}
delta: {chunk_elems: 1048576}
network:
  long_link: {bandwidth: 256Kbit/s, latency: 20ms}
  tls: false
YAML
"$DCR" run "$work/s.yaml" --out "$work/r.json" > "$work/out.txt" 2>&1 &
run_pid=$!
# Mid-stream: once rank 6 has kept about a third of the ~145 KB stream (the stream takes about
# 5 s on this link).
spool="$dir/run-1/state/rank-6.spool"
for _ in $(seq 1 3000); do
  [ "$(stat -c %s "$spool" 2>/dev/null || echo 0)" -ge 50000 ] && break
  sleep 0.02
done
if ! kill_rank "$run_pid" 6 > /dev/null; then
  echo "no node process of rank 6 to kill"; wait "$run_pid"; exit 1
fi
wait "$run_pid"; rc=$?
if [ "$rc" != 0 ]; then echo "dcr run exit $rc"; cat "$work/out.txt"; exit 1; fi
python3 - "$work/r.json" "$dir/run-1" <<'PY'
import json, sys
from runs import assert_bit_exact, kill_restarts, load_steps
run = load_steps(sys.argv[1], 1)[0]
assert_bit_exact(run, receivers=6)
assert kill_restarts([run], 6), run.get("restarts")
payload = run["payload_bytes"]
node = json.load(open(sys.argv[2] + "/node-6.json"))
rec = node["recovery"]
restored, fetched = rec["restored_bytes"], node["bytes_received"]
# The dead process had received part of the stream: the restart read it back from the spool.
assert rec["restored_blobs"] >= 1 and restored > 0, rec
assert "from the state dir" in rec["log"], rec["log"]
assert run["recovery"]["restored_bytes"] >= restored, run["recovery"]
# What the restarted process fetched is what it did not hold: together with what it restored,
# the stream once (plus the pieces in flight at the kill, at most a 64 KiB window per stream:
# received into memory, not yet in the spool).
assert fetched + restored <= payload + 65536, (fetched, restored, payload)
assert fetched < payload, (fetched, payload)
print("kill -9 of leaf 6 mid-stream: %d/6 bit-exact; the restart restored %d bytes (%d blobs) "
      "from its state dir and fetched %d bytes of a %d-byte stream" %
      (run["receivers_verified"], restored, rec["restored_blobs"], fetched, payload))
PY
