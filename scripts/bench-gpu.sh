#!/usr/bin/env bash
# GPU checks for a machine with a CUDA device (e.g. a lent H200): builds dcr with CUDA, runs the
# gpu-labelled tests (CPU/CUDA parity, byte for byte) and the device benchmarks, and writes
#   $OUT_DIR/gpu-tests.txt, $OUT_DIR/bench-apply-cuda.json, $OUT_DIR/bench-apply-cuda.txt
# Usage: scripts/bench-gpu.sh [OUT_DIR]   (default: build-gpu/results). Exit code != 0 if a test fails.
# Bounded: build ~3-6 min on 16 cores, tests < 1 min, benchmarks ~2-4 min.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-build-gpu/results}"
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt" || true
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCR_WITH_CUDA=ON -DDCR_BUILD_SIM=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" > "$OUT_DIR/configure.txt"
cmake --build build-gpu -j"$(nproc)" --target dcr_cuda_tests dcr_bench_apply_cuda dcr_receivers_tests
ctest --test-dir build-gpu -L gpu --output-on-failure 2>&1 | tee "$OUT_DIR/gpu-tests.txt"
if grep -q "Skipped" "$OUT_DIR/gpu-tests.txt"; then
  echo "bench-gpu: GPU tests were skipped (no usable device?)" >&2
fi
build-gpu/bench/dcr_bench_apply_cuda --benchmark_min_time=0.2 \
  --benchmark_out="$OUT_DIR/bench-apply-cuda.json" --benchmark_out_format=json \
  2>&1 | tee "$OUT_DIR/bench-apply-cuda.txt"
