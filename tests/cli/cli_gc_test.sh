#!/usr/bin/env bash
# Retention through the shipped binaries. A real four-step `dcr run` over the object store
# (one set of long-lived nodes) fills a directory store with four version prefixes; then
#   * `dcr gc --store` keeps the newest versions, and a budget that cannot be met without the
#     committed version exits 19 naming the needed bytes, the committed version's objects left
#     byte for byte (and still applying: the stream from the store rebuilds the target);
#   * a `dcr gc` SIGKILLed midway leaves every prefix whole or marked for removal, and the next
#     one finishes it;
#   * a run with a `retention:` block collects as versions commit (result JSON, store);
#   * `dcr gc --work-dir` removes old run folders, never the newest, and finishes an
#     interrupted removal;
#   * with DCR_S3_ENDPOINT set (scripts/start-s3-server.sh), the same collection of an S3 store.
# The run's versions are signed (the trainer's key dcr run made, run-1/tls/trainer.pub): gc
# counts them with --trust, and refuses the store without it.
source "$(dirname "$0")/cli_lib.sh" "$@"
scenario() {  # scenario NAME STORE_YAML [EXTRA]
  cat <<YAML
name: $1
mode: real
model: {preset: tiny, seed: 5, work_dir: $tmp/w-$1}
change_rate: 3%
steps: 4
methods: [delta]
transport:
  kinds: [object_store]
  object_store: $2
receivers: {count: 2}
delta: {chunk_elems: 262144}
network: {tls: false}
${3:-}
YAML
}
prefixes() { find "$1" -name '*.hdr' | sed "s|^$1/||; s|/[^/]*$||" | sort; }

scenario plain "{kind: dir, path: $tmp/store}" >"$tmp/plain.yaml"
"$dcr" run "$tmp/plain.yaml" --out "$tmp/plain.json" >"$tmp/plain.out" 2>&1; check run-plain 0 $?
[ "$(prefixes "$tmp/store" | wc -l)" = 4 ]; check four-versions-published 0 $?
cp -a "$tmp/store" "$tmp/store-copy"
pub="$tmp/w-plain/run-1/tls/trainer.pub"
"$dcr" gc --store "dir:$tmp/store" --keep 2 >"$tmp/notrust.out" 2>&1; check no-trust-refused 14 $?
has no-trust-says "$tmp/notrust.out" "give the trainer's public key"
newest=$(prefixes "$tmp/store" | tail -1)
(cd "$tmp/store/$newest" && sha256sum $(ls | sort)) >"$tmp/newest.sha"

"$dcr" gc --store "dir:$tmp/store" --trust "$pub" --keep 2 --dry-run --json "$tmp/dry.json" >"$tmp/dry.out" 2>&1
check dry-run 0 $?
[ "$(prefixes "$tmp/store" | wc -l)" = 4 ]; check dry-run-deletes-nothing 0 $?
python3 - "$tmp/dry.json" <<'PY'; check dry-run-report 0 $?
import json, sys
r = json.load(open(sys.argv[1]))
d = [v["decision"] for v in r["versions"]]
assert d == ["removed", "removed", "kept", "needed"], d
assert r["committed"] == 4 and r["removed_objects"] == 0 and r["bytes_after"] < r["bytes_before"], r
PY

"$dcr" gc --store "dir:$tmp/store" --trust "$pub" --keep 2 --json "$tmp/keep.json" >"$tmp/keep.out" 2>&1
check keep-two 0 $?
[ "$(prefixes "$tmp/store" | wc -l)" = 2 ]; check two-versions-left 0 $?
has keep-says-why "$tmp/keep.out" "older than the newest 2 versions"

"$dcr" gc --store "dir:$tmp/store" --trust "$pub" --budget 1KiB --json "$tmp/budget.json" >"$tmp/budget.out" 2>&1
check unmeetable-budget-exit-19 19 $?
has unmeetable-budget-named "$tmp/budget.out" "budget of 1024 bytes cannot be met"
has unmeetable-budget-needed "$tmp/budget.out" "are needed"
[ "$(prefixes "$tmp/store")" = "$newest" ]; check only-the-committed-left 0 $?
(cd "$tmp/store/$newest" && sha256sum -c --quiet "$tmp/newest.sha"); check committed-bytes-intact 0 $?
python3 - "$tmp/budget.json" <<'PY'; check budget-report 0 $?
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["ok"] and "cannot be met" in r["budget_error"], r
assert [v["decision"] for v in r["versions"]] == ["removed", "needed"], r["versions"]
PY
# What is left still delivers the committed version: the stream from the store, applied to the
# version before, is the target byte for byte.
ck=$(ls -d "$tmp"/w-plain/ckpt-* | head -1)
cat "$tmp/store/$newest"/*.hdr "$tmp/store/$newest"/*.chk "$tmp/store/$newest"/*.trl >"$tmp/v4.dcr"
"$dcr" apply "$ck/step3.safetensors" "$tmp/v4.dcr" -o "$tmp/v4.safetensors" >/dev/null 2>"$tmp/apply.err"
check committed-still-applies 0 $?
cmp -s "$tmp/v4.safetensors" "$ck/step4.safetensors"; check committed-bit-exact 0 $?

# A collection killed after 3 deletes: the prefix it was removing has a tombstone and no
# trailer, every other prefix is whole; the next collection finishes.
"$dcr" gc --store "dir:$tmp/store-copy" --trust "$pub" --keep 1 --fault-kill-after-deletes 3 >/dev/null 2>&1
check killed-midway 137 $?
tombs=$(find "$tmp/store-copy" -name gc-removing | wc -l)
[ "$tombs" = 1 ]; check one-tombstone 0 $?
t=$(dirname "$(find "$tmp/store-copy" -name gc-removing)")
[ -z "$(ls "$t" | grep '\.trl$')" ]; check tombstoned-not-complete 0 $?
for p in $(prefixes "$tmp/store-copy"); do
  [ "$tmp/store-copy/$p" = "$t" ] && continue
  n_trl=$(ls "$tmp/store-copy/$p" | grep -c '\.trl$')
  [ "$n_trl" = 1 ] || { echo "FAIL prefix $p lost its trailer"; fail=1; }
done
"$dcr" gc --store "dir:$tmp/store-copy" --trust "$pub" --keep 1 --json "$tmp/finish.json" >"$tmp/finish.out" 2>&1
check finish-after-kill 0 $?
has finish-names-it "$tmp/finish.out" "an interrupted removal, finished"
[ "$(prefixes "$tmp/store-copy")" = "$newest" ]; check finish-leaves-committed 0 $?
[ -z "$(find "$tmp/store-copy" -name gc-removing)" ]; check no-tombstone-left 0 $?
(cd "$tmp/store-copy/$newest" && sha256sum -c --quiet "$tmp/newest.sha"); check finish-bytes-intact 0 $?

# Retention in the nodes: keep 2 versions as they commit.
scenario nodes "{kind: dir, path: $tmp/store-nodes}" "retention: {keep_versions: 2}" >"$tmp/nodes.yaml"
"$dcr" run "$tmp/nodes.yaml" --out "$tmp/nodes.json" >"$tmp/nodes.out" 2>&1; check run-retention 0 $?
[ "$(prefixes "$tmp/store-nodes" | wc -l)" = 2 ]; check nodes-keep-two 0 $?
python3 - "$tmp/nodes.json" <<'PY'; check nodes-result-json 0 $?
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert len(runs) == 4 and all(r["receivers_verified"] == 2 for r in runs), runs
assert runs[0]["retention"]["removed_objects"] == 0, runs[0]
assert runs[2]["retention"]["removed_objects"] > 0 and runs[2]["retention"]["removed_bytes"] > 0, runs[2]
assert runs[3]["retention_kept"] == "v3 kept, v4 needed", runs[3]["retention_kept"]
PY

# The work dir: three runs (run-1 plain, the copies below); the newest is needed.
w="$tmp/w-plain"
cp -a "$w/run-1" "$w/run-2"; cp -a "$w/run-1" "$w/run-3"
"$dcr" gc --work-dir "$w" --keep 1 --fault-kill-after-deletes 1 >/dev/null 2>&1
check workdir-killed 137 $?
[ ! -e "$w/run-1" ] && [ -d "$w/run-3" ]; check workdir-kill-consistent 0 $?
"$dcr" gc --work-dir "$w" --keep 1 --json "$tmp/wd.json" >"$tmp/wd.out" 2>&1; check workdir-gc 0 $?
[ ! -e "$w/run-2" ] && [ -d "$w/run-3" ] && [ -z "$(ls -a "$w" | grep '^\.gc-')" ]
check workdir-newest-kept 0 $?
"$dcr" gc --work-dir "$w" --keep 1 --budget 1KiB >"$tmp/wdb.out" 2>&1; check workdir-budget-19 19 $?
[ -d "$w/run-3" ]; check workdir-budget-keeps-newest 0 $?

if [ -n "${DCR_S3_ENDPOINT:-}" ]; then
  bucket="dcr-gc-$$-$RANDOM"
  spec="s3://$bucket?endpoint=$DCR_S3_ENDPOINT&region=${DCR_S3_REGION:-us-east-1}"
  [ -n "${DCR_S3_CA_FILE:-}" ] && spec="$spec&ca_file=$DCR_S3_CA_FILE"
  case "$DCR_S3_ENDPOINT" in http://*) spec="$spec&allow_http=1";; esac
  "$dcr" gc --store "$spec&create_bucket=1" --dry-run >/dev/null 2>&1; check s3-bucket 0 $?
  extra=""
  [ -n "${DCR_S3_CA_FILE:-}" ] && extra=", ca_file: $DCR_S3_CA_FILE"
  case "$DCR_S3_ENDPOINT" in http://*) extra="$extra, allow_http: true";; esac
  scenario s3 "{kind: s3, endpoint: '$DCR_S3_ENDPOINT', bucket: $bucket$extra}" \
    "retention: {keep_versions: 3}" >"$tmp/s3.yaml"
  "$dcr" run "$tmp/s3.yaml" --out "$tmp/s3.json" >"$tmp/s3.out" 2>&1; check s3-run-retention 0 $?
  "$dcr" gc --store "$spec" --trust "$tmp/w-s3/run-1/tls/trainer.pub" --keep 1 --json "$tmp/s3gc.json" >"$tmp/s3gc.out" 2>&1; check s3-gc 0 $?
  python3 - "$tmp/s3.json" "$tmp/s3gc.json" <<'PY'; check s3-reports 0 $?
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert all(r["receivers_verified"] == 2 for r in runs), runs
assert runs[3]["retention_kept"] == "v2 kept, v3 kept, v4 needed", runs[3]["retention_kept"]
g = json.load(open(sys.argv[2]))
assert [v["decision"] for v in g["versions"]] == ["removed", "removed", "needed"], g["versions"]
assert g["removed_objects"] > 0
PY
else
  echo "skip s3: DCR_S3_ENDPOINT unset (scripts/start-s3-server.sh)"
fi
exit $fail
