#!/usr/bin/env bash
# Simulated scenarios run from any directory, with no path of the source tree built into the
# binary: a relative sim.calibration is the scenario file's (a paper scenario run from a scratch
# folder uses the repository's sim/calibration/ through its own ../../ path; a copy elsewhere
# uses the calibration beside the copy); without one, the default is the build's
# share/dcr/calibration/ beside the binary; a missing one fails naming the path resolved against
# the scenario's folder, never falling back to another file.
source "$(dirname "$0")/cli_lib.sh" "$@"
src=$(pwd)
build=$(cd "$(dirname "$dcr")" && pwd); dcr="$build/$(basename "$dcr")"
mkdir -p "$tmp/elsewhere" "$tmp/s/cal"
cp "$src"/sim/calibration/*.json "$tmp/s/cal/"
source_of() {  # source_of RESULT.json: the calibration file a simulation used
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['setup']['calibration.source'])" \
    "$1"
}
same() {  # same NAME GOT WANT: both name the same file
  if [ "$(realpath "$2")" = "$(realpath "$3")" ]; then echo "ok   $1: $2"; else
    echo "FAIL $1: $2, expected $3"; fail=1; fi
}

cd "$tmp/elsewhere" || exit 1
"$dcr" run "$src/scenarios/paper/paper-30b-3.yaml" --out p.json -q >p.out 2>p.err
check paper-from-elsewhere 0 $?
same paper-calibration "$(source_of p.json)" "$src/sim/calibration/default.json"

small() {  # small FILE [SIM-LINE]: a small simulated scenario
  cat > "$1" <<YAML
name: anywhere
mode: sim
model: {preset: qwen3-30b-a3b, seed: 1}
change_rate: 3%
methods: [delta]
transport: {kinds: [relay_tree], relay_tree: {fan_out: 2, root_fan_out: 1, chunk: 1MiB}}
receivers: {count: 4, per_node: 2}
network:
  regions:
    - {name: train, bandwidth: 100Gbit/s, latency: 0.1ms}
    - {name: rollout, bandwidth: 100Gbit/s, latency: 0.1ms}
  long_link: {bandwidth: 394.7MB/s, latency: 35ms}
sim:
  gpus_per_node: 2
${2:-}
YAML
}
small "$tmp/s/own.yaml" "  calibration: cal/default.json"
"$dcr" run ../s/own.yaml --out own.json -q >own.out 2>own.err; check copy-with-calibration 0 $?
same copy-calibration "$(source_of own.json)" "$tmp/s/cal/default.json"
small "$tmp/s/default.yaml"
"$dcr" run ../s/default.yaml --out def.json -q >def.out 2>def.err; check default-calibration 0 $?
same default-beside-binary "$(source_of def.json)" "$build/share/dcr/calibration/default.json"
small "$tmp/s/missing.yaml" "  calibration: nope.json"
"$dcr" run ../s/missing.yaml --out m.json -q >m.out 2>m.err; check missing-calibration 12 $?
has missing-names-path m.err "calibration file '../s/nope.json' cannot be read"
exit $fail
