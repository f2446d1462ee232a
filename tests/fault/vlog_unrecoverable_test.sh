#!/usr/bin/env bash
# A receiver whose version log cannot recover the version it holds never holds other bytes under
# that version's number, through the shipped binaries. A real three-step `dcr run` of long-lived
# nodes (relay tree, two receivers, recovering: each a version log under its --state), unsigned
# and signed; once step 3 starts, receiver 2's log image is made unreadable (a byte appended: the
# log records another size) and the node is killed with `kill -9`. Its restarts find the log
# unable to recover version 2 and its plan's base path, the base checkpoint (version 0's bytes,
# the layout of the log), unable to stand in for it: unsigned, each restart refuses with the error
# naming both (signed, the held version is refused before it is proven); the log stays as it was
# (its header still names its image) and the run fails. `dcr export` of the receiver then writes
# nothing, never version 0's bytes as "version 2".
#   vlog_unrecoverable_test.sh DCR
set -uo pipefail
source "$(dirname "$0")/../lib/runs.sh"
DCR=$1
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail=0
for signing in false true; do
dir="$work/m-$signing"
cat > "$work/s.yaml" <<YAML
name: vlog-unrecoverable
mode: real
model: {preset: tiny, seed: 5, work_dir: $dir}
change_rate: 3%
steps: 3
methods: [delta]
transport:
  kinds: [relay_tree]
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 4KiB}
receivers: {count: 2}
delta: {chunk_elems: 16384}
network:
  long_link: {bandwidth: 2Mbit/s, latency: 20ms}
  tls: false
  signing: $signing
YAML
"$DCR" run "$work/s.yaml" --out "$work/r.json" > "$work/out.txt" 2>&1 &
run_pid=$!
if ! wait_for "$dir/run-1/go.v3" 120; then
  echo "FAIL: step 3 never started"; cat "$work/out.txt"; kill -9 "$run_pid"; exit 1
fi
plan="$dir/run-1/plan-2.json"
vlog=$(python3 - "$plan" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
print(p.get("version_log_dir") or "%s/rank-2.vlog" % p["state_dir"])
PY
)
image=$(ls "$vlog"/image-* 2>/dev/null | head -1)
if [ -z "$image" ]; then
  echo "FAIL: no version log image under $vlog"; kill -9 "$run_pid"; exit 1
fi
printf '\0' >> "$image"
head -c 64 "$vlog/log" > "$work/log.before"
cp "$image" "$work/image.before"
kill_rank "$run_pid" 2 > /dev/null || { echo "FAIL: no node 2 to kill"; fail=1; }
wait "$run_pid"; rc=$?
log="$dir/run-1/node-2.log"
if [ "$rc" = 0 ]; then
  echo "FAIL: the run succeeded with receiver 2's log unrecoverable"; fail=1
fi
if [ "$signing" = false ]; then
  want="refusing to hold other bytes as version 2"
else
  want="rank 2: the held version: version log image"
fi
if ! grep -q "$want" "$log"; then
  echo "FAIL (signing $signing): receiver 2's restart did not refuse (\"$want\"):"
  tail -20 "$log"; fail=1
fi
if ! cmp -s <(head -c 64 "$vlog/log") "$work/log.before" || ! cmp -s "$image" "$work/image.before"
then
  echo "FAIL: receiver 2's version log was replaced: $(ls "$vlog")"; fail=1
fi
# Nothing exported as version 2 unless it is version 2's bytes.
unsigned=; [ "$signing" = false ] && unsigned=--unsigned
if "$DCR" export --plan "$plan" $unsigned -o "$work/export.safetensors" > "$work/export.out" 2>&1
then
  target=$(ls "$dir"/ckpt-*/step2.safetensors)
  if ! cmp -s "$work/export.safetensors" "$target"; then
    echo "FAIL: dcr export wrote other bytes: $(cat "$work/export.out")"; fail=1
  fi
fi
echo "signing $signing: run exit $rc; $(grep -c "$want" "$log") refusals; export:" \
  "$(head -c 300 "$work/export.out")"
done
exit $fail
