#!/usr/bin/env bash
# Bounded libFuzzer run of the dcr fuzz targets (delta payload decoder + apply, whole delta
# streams, receiver journal) under AddressSanitizer + UBSan, built with clang.
#
#   scripts/run-fuzz.sh [SECONDS_PER_TARGET]     (default 20; CI: 60 s in all)
#
# Env: DCR_FUZZ_BUILD (build dir, default build-fuzz), DCR_FUZZ_JOBS (build jobs, default 2).
# Exit status: 0 when every target ran its time with no crash; non-zero otherwise (the crashing
# input is left in $DCR_FUZZ_BUILD/artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
build="${DCR_FUZZ_BUILD:-build-fuzz}"
jobs="${DCR_FUZZ_JOBS:-2}"

if ! command -v clang++ >/dev/null; then
  echo "run-fuzz: clang++ not found (apt-get install clang)" >&2
  exit 2
fi
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDCR_BUILD_FUZZ=ON -DDCR_SANITIZE="address,undefined" -DDCR_BUILD_TESTS=ON \
  -DDCR_BUILD_BENCH=OFF -DDCR_BUILD_SIM=OFF -DDCR_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target dcr_fuzz_chunk dcr_fuzz_delta dcr_fuzz_journal dcr_fuzz_seeds

corpus="$build/corpus"
mkdir -p "$corpus" "$build/artifacts"
"$build/tests/fuzz/dcr_fuzz_seeds" "$corpus/seeds" >/dev/null
status=0
for t in chunk delta journal; do
  mkdir -p "$corpus/$t"
  echo "== dcr_fuzz_$t: ${secs}s"
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
      "$build/tests/fuzz/dcr_fuzz_$t" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
      -timeout=10 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
      "$corpus/$t" "$corpus/seeds/$t" "tests/fuzz/corpus/$t" 2>"$build/fuzz-$t.log"; then
    echo "dcr_fuzz_$t: FAILED (see $build/fuzz-$t.log, artifacts in $build/artifacts)" >&2
    tail -40 "$build/fuzz-$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$build/fuzz-$t.log" | tail -2
  fi
done
exit $status
