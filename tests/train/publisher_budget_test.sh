#!/usr/bin/env bash
# The retention budget of a deployment, through the shipped binaries: a C trainer
# (publisher_c_test.c) hands six versions to an open-ended deployment (model.base) of two dcr-node
# receivers over a relay tree with an in-region directory store, with the deployment's
# `retention: {keep_versions, budget}`. The publisher collects the store after every version:
#   - budget 1GiB, keep_versions 2: after version 6 the store holds versions 5 and 6 whole (and
#     version 4 when the last collection counted it needed) and nothing of versions 1-3 (the
#     oldest go first), no warning;
#   - budget 64KiB (less than one version's delta): the collection removes every version but the
#     one the joint commit's baseline holds, keeps that one whole although it exceeds the budget,
#     and the trainer's stderr says so after every version ("budget of 65536 bytes cannot be met
#     ... needed"), with the version's result naming it (retention.error); publishing goes on.
# Every receiver's held version 6, written by `dcr export`, is the trainer's content byte for byte.
#   publisher_budget_test.sh DCR DCR_NODE PUBLISHER_C_TEST
set -uo pipefail
dcr=$1; node=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); prog=$3
tmp=$(mktemp -d)
declare -a pids
trap 'kill -9 ${pids[*]:-} 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/train_lib.sh"
synth_trainer_checkpoints "$dcr" "$tmp/ck"

# deployment NAME BUDGET: six versions to two receivers under `retention: {keep_versions: 2,
# budget: BUDGET}`; the run's files in $tmp/NAME.
deployment() {
  local name=$1 budget=$2 d="$tmp/$1" r k
  local port=$(( 20000 + RANDOM % 12000 ))
  mkdir -p "$d/store" "$d/h0"
  cat >"$d/s.yaml" <<YAML
name: budget-$name
model: {base: $tmp/ck/step0.safetensors}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 16KiB}
  object_store: {kind: dir, path: $d/store}
receivers: {count: 2, deadline: 5s}
delta: {chunk_elems: 262144}
retention: {keep_versions: 2, budget: $budget}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))"]
  tls: false
timeout: 60s
YAML
  for r in 1 2; do
    mkdir -p "$d/h$r"
    (cd "$d/h$r" && exec "$node" "$d/s.yaml" --rank "$r" --state "$d/h$r/state") \
      >"$d/h$r/log" 2>&1 &
    pids[$r]=$!
  done
  local specs=()
  for k in $(seq 6); do
    local s=$(( (k - 1) % 3 + 1 ))
    specs+=("tensors:$tmp/ck/step$s.manifest:$tmp/ck/step$s.safetensors")
  done
  "$prog" "scenario:0:$d/h0/state:$d/s.yaml" "$d/h0/work" 2 "${specs[@]}" >"$d/prog.out" \
    2>"$d/prog.err"
  local rc=$?
  [ "$rc" = 0 ] && ok "$name: the trainer published 6 versions" \
    || { bad "$name: trainer exit $rc"; tail -5 "$d/prog.err"; }
  for r in 1 2; do
    "$dcr" export "$d/s.yaml" --rank "$r" --state "$d/h$r/state" --unsigned \
      -o "$d/export-$r.safetensors" >"$d/export.out" 2>&1 \
      && grep -q "^EXPORTED: rank $r, version 6 " "$d/export.out" \
      && "$dcr" verify -q "$d/export-$r.safetensors" "$tmp/ck/step3.safetensors" >/dev/null 2>&1 \
      && ok "$name: rank $r holds version 6, byte for byte the trainer's (dcr export, dcr verify)" \
      || bad "$name: rank $r: $(cat "$d/export.out")"
  done
  for r in 1 2; do kill -TERM "${pids[$r]}" 2>/dev/null; wait "${pids[$r]}" 2>/dev/null; done
  pids=()
}
# whole DIR K: version K's stream is whole in the store (header and trailer present).
whole() { ls "$1/store/refit/step-$2" 2>/dev/null | grep -q '\.hdr$' &&
          ls "$1/store/refit/step-$2" | grep -q '\.trl$'; }

deployment roomy 1GiB
d="$tmp/roomy"
kept=""; for k in 1 2 3 4 5 6; do whole "$d" "$k" && kept="$kept $k"; done
# Versions 5 and 6 are kept (keep_versions 2); version 4 may still be there when the last
# collection counted it needed (a catch-up delta to the baseline); versions 1-3 are gone.
why=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["retention"]["kept"])' \
  "$d/h0/state/node-0-v6.json" 2>/dev/null)
case "$kept" in
  " 5 6"|" 4 5 6") ok "roomy: the store holds versions$kept whole (kept: $why), versions 1-3 removed" ;;
  *) bad "roomy: the store holds versions$kept (kept: $why)" ;;
esac
grep -q "retention after version" "$d/prog.err" && bad "roomy: $(grep -m1 retention "$d/prog.err")" \
  || ok "roomy: no retention warning"

deployment tight 64KiB
d="$tmp/tight"
kept=""; for k in 1 2 3 4 5 6; do whole "$d" "$k" && kept="$kept $k"; done
[ "$kept" = " 6" ] && ok "tight: the store holds only version 6, the baseline's, whole (over the budget)" \
  || bad "tight: the store holds versions$kept"
warning="sender: retention after version [1-6]: RESOURCE_EXHAUSTED: budget of 65536 bytes"
warning="$warning cannot be met: .* needed"
n=$(grep -c "$warning" "$d/prog.err")
last=$(grep -m1 'retention after version 6' "$d/prog.err" | cut -c1-110)
[ "$n" = 6 ] && ok "tight: the trainer warned after each of the 6 versions: $last..." \
  || bad "tight: $n warnings: $(head -3 "$d/prog.err")"
python3 - "$d/h0/state/node-0-v6.json" <<'PY' \
  && ok "tight: version 6's result names the budget it could not meet and what it kept" \
  || bad "tight: node-0-v6.json: $(grep -A8 '"retention"' "$d/h0/state/node-0-v6.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"], r
g = r["retention"]
assert g["error"].startswith("RESOURCE_EXHAUSTED: budget of 65536 bytes cannot be met"), g
assert "v6 " in g["kept"] and g["store_bytes"] > 65536, g
PY
exit $fail
