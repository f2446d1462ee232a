#!/usr/bin/env bash
# The metrics/health endpoint of real dcr-node processes (multi-host form, one process per rank,
# network.metrics_port): scraped with curl while the receivers and the relay wait for their
# parent (up, not committed, the version they hold, no bytes yet), then during a refit over a slow
# long link (bytes arriving, chunks applied, lag growing); /healthz answers ok; other paths 404,
# other methods 405; an endpoint port already taken fails the node at its start, naming it.
source "$(dirname "$0")/cli_lib.sh" "$@"
"$dcr" synth --preset tiny --rate 3% --steps 2 --out "$tmp/m" -q >/dev/null 2>&1; check synth 0 $?
base="$tmp/m/step0.safetensors"; target="$tmp/m/step1.safetensors"
port=$(( 20000 + RANDOM % 12000 )); mport=$((port + 10))
cat > "$tmp/s.yaml" <<YAML
name: metrics
model: {checkpoints: [$base, $target]}
methods: [delta]
delta: {chunk_elems: 16384}
transport:
  relay_tree: {fan_out: 2, root_fan_out: 1, streams: 1, chunk: 16KiB}
receivers: {count: 3}
network:
  hosts: ["127.0.0.1:$port", "127.0.0.1:$((port + 1))", "127.0.0.1:$((port + 2))", "127.0.0.1:$((port + 3))"]
  long_link: {bandwidth: 400Kbit/s, latency: 10ms}
  tls: false
  metrics_port: $mport
timeout: 120s
YAML
pids=()
for r in 3 2 1; do
  "$dcr" node "$tmp/s.yaml" --rank "$r" --base "$base" --target "$target" \
    >"$tmp/node-$r.out" 2>"$tmp/node-$r.err" &
  pids+=($!)
done
scrape() { curl -s --max-time 2 "http://127.0.0.1:$1/metrics"; }
value() {  # value FILE METRIC: the sample's value
  sed -n "s/^$2{[^}]*} \(.*\)$/\1/p" "$1" | head -1
}
for _ in $(seq 200); do  # both set up (the endpoint answers from the process start)
  scrape $((mport + 3)) | grep -q 'dcr_version_held{rank="3",role="receiver"' &&
    scrape $((mport + 1)) | grep -q 'role="relay"' && break
  sleep 0.1
done
scrape $((mport + 3)) >"$tmp/waiting-3.txt"
scrape $((mport + 1)) >"$tmp/waiting-1.txt"
has waiting-up "$tmp/waiting-3.txt" 'dcr_node_up{rank="3",role="receiver"} 1'
has waiting-not-committed "$tmp/waiting-3.txt" 'dcr_node_committed{rank="3",role="receiver"} 0'
has waiting-type "$tmp/waiting-3.txt" '# TYPE dcr_bytes_received_total counter'
has waiting-no-bytes "$tmp/waiting-3.txt" 'dcr_bytes_received_total{rank="3",role="receiver"} 0'
has waiting-holds-the-base "$tmp/waiting-3.txt" 'dcr_version_held{rank="3",role="receiver",hash="'
has waiting-relay "$tmp/waiting-1.txt" 'dcr_node_up{rank="1",role="relay"} 1'
has waiting-repairs "$tmp/waiting-3.txt" 'dcr_repairs_total{rank="3",role="receiver"} 0'
has waiting-repairs-type "$tmp/waiting-3.txt" '# TYPE dcr_repairs_total counter'
has waiting-starts "$tmp/waiting-3.txt" 'dcr_node_starts{rank="3",role="receiver"} 1'
has waiting-fallbacks "$tmp/waiting-3.txt" 'dcr_fallbacks_total{rank="3",role="receiver"} 0'
lacks waiting-no-error "$tmp/waiting-3.txt" "dcr_last_error_info"
curl -s -D "$tmp/h.txt" -o /dev/null "http://127.0.0.1:$((mport + 3))/metrics"
has content-type "$tmp/h.txt" "Content-Type: text/plain; version=0.0.4"
[ "$(curl -s "http://127.0.0.1:$((mport + 3))/healthz")" = ok ]; check healthz-ok 0 $?
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((mport + 3))/nope")" = 404 ]; check not-found 0 $?
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$((mport + 3))/metrics")" = 405 ]; check post-refused 0 $?

# A second node on an endpoint port that is taken (rank 3's) fails at its start, naming it.
sed "s/metrics_port: $mport/metrics_port: $((mport + 2))/" "$tmp/s.yaml" >"$tmp/taken.yaml"
"$dcr" node "$tmp/taken.yaml" --rank 1 --base "$base" --target "$target" >/dev/null 2>"$tmp/taken.err"
check taken-port-fails 15 $?
has taken-port-named "$tmp/taken.err" "metrics endpoint: listen on 127.0.0.1:$((mport + 3))"

# The refit: scrape receiver 3 while it runs; some scrape shows bytes and chunks arriving.
"$dcr" node "$tmp/s.yaml" --rank 0 --base "$base" --target "$target" \
  >"$tmp/node-0.out" 2>"$tmp/node-0.err" &
sender=$!
seen_bytes=0; seen_chunks=0; seen_lag=0
while kill -0 "${pids[0]}" 2>/dev/null; do
  if scrape $((mport + 3)) >"$tmp/during.txt" 2>/dev/null; then
    b=$(value "$tmp/during.txt" dcr_bytes_received_total); c=$(value "$tmp/during.txt" dcr_chunks_applied_total)
    l=$(value "$tmp/during.txt" dcr_lag_seconds)
    [ "${b:-0}" -gt 0 ] && seen_bytes=1
    [ "${c:-0}" -gt 0 ] && seen_chunks=1
    awk "BEGIN { exit !(${l:-0} > 0) }" && seen_lag=1
  fi
  sleep 0.1
done
wait "$sender"; check sender 0 $?
i=0
for r in 3 2 1; do wait "${pids[$i]}"; check "node-$r" 0 $?; i=$((i + 1)); done
[ "$seen_bytes" = 1 ]; check during-bytes-received 0 $?
[ "$seen_chunks" = 1 ]; check during-chunks-applied 0 $?
[ "$seen_lag" = 1 ]; check during-lag 0 $?
exit $fail
