#!/usr/bin/env bash
# The device check, for a machine with a CUDA GPU (e.g. a lent H200). One command, each step under
# its own timeout, about 8 minutes in all on 16 cores (less with a prepared build directory):
#   1. configures and builds build-gpu with CUDA (`--build-only` prepares it beforehand and stops),
#   2. runs the gpu-labelled tests (CUDA backend against the host backend, byte for byte),
#   3. runs `dcr run scenarios/gpu.yaml` end to end: sender and receivers with device: cuda, several
#      receiver processes sharing the one GPU, every receiver verified on the device,
#   4. runs the Python package's device tests (tests/python/test_device.py: CUDA tensors through
#      dcr.apply_delta / encode_delta / EngineReceiver by device pointer) when the machine's
#      python3 imports torch and pytest (recorded as skipped otherwise; its CUDA cases skip unless
#      torch is a CUDA build),
#   5. runs the device benchmark on the CUDA backend and, for comparison, on the host backend,
#   6. writes every number to OUT_DIR/device-check.json (and the raw outputs beside it).
# Usage: scripts/device-check.sh [--build-only] [OUT_DIR]
#   OUT_DIR defaults to $OUT when set (the device machine's output folder), else build-gpu/results.
# Exit status: 0 when every step passed; otherwise the first failing step's status (its output is
# in OUT_DIR and the JSON says which step failed).
set -uo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = "--build-only" ]; then build_only=1; shift; fi
OUT_DIR="${1:-${OUT:-build-gpu/results}}"
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
jobs=$(nproc)
status=0
steps=()

step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to OUT_DIR/NAME.txt, records its status
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" >"$OUT_DIR/$name.txt" 2>&1
  rc=$?
  steps+=("$name $rc $(echo "$(date +%s.%N) - $t0" | bc)")
  echo "device-check: $name: exit $rc ($(tail -n 1 "$OUT_DIR/$name.txt"))"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT_DIR/gpu.txt" 2>&1 ||
  echo "device-check: nvidia-smi failed: $(cat "$OUT_DIR/gpu.txt")"
if [ ! -f build-gpu/build.ninja ]; then
  step configure 120 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCR_WITH_CUDA=ON \
    -DDCR_BUILD_SIM=OFF -DDCR_BUILD_TESTS=ON -DDCR_BUILD_BENCH=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" || exit $status
fi
step build 360 cmake --build build-gpu -j"$jobs" || exit $status
[ $build_only -eq 1 ] && exit 0

step gpu-tests 120 ctest --test-dir build-gpu -L gpu --output-on-failure
if grep -q "Skipped\|Not Run" "$OUT_DIR/gpu-tests.txt"; then
  echo "device-check: some GPU tests were skipped (no usable device?)"
fi
step gpu-run 240 build-gpu/dcr run scenarios/gpu.yaml -q \
  --out "$OUT_DIR/gpu-run.json"
if python3 -c "import torch, pytest, hypothesis" >/dev/null 2>&1; then
  step python-cuda 120 env PYTHONPATH=python DCR_LIBRARY="$PWD/build-gpu/libdcr.so" \
    PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_device.py
  if grep -q "torch.cuda.is_available() is False" "$OUT_DIR/python-cuda.txt"; then
    echo "device-check: python-cuda: torch here is not a CUDA build; its CUDA cases were skipped"
  fi
else
  echo "python3 here lacks torch, pytest or hypothesis: the Python CUDA tests were not run" \
    >"$OUT_DIR/python-cuda.txt"
  echo "device-check: python-cuda: skipped (no torch, pytest or hypothesis for python3)"
fi
step bench-cuda 150 build-gpu/bench/dcr_bench_device --device=cuda --benchmark_min_time=0.2 \
  --benchmark_out="$OUT_DIR/bench-cuda.json" --benchmark_out_format=json
step bench-host 90 build-gpu/bench/dcr_bench_device --device=host --benchmark_min_time=0.05 \
  --benchmark_filter='Copy|Apply/3|Diff/3|Receive' \
  --benchmark_out="$OUT_DIR/bench-host.json" --benchmark_out_format=json

python3 - "$OUT_DIR" "$status" "${steps[@]}" <<'PY'
import json, os, sys
out, status, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name):
    p = os.path.join(out, name)
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def bench(name):
    j = load(name)
    if not j:
        return None
    rows = {}
    for b in j.get("benchmarks", []):
        row = {k: v for k, v in b.items()
               if isinstance(v, (int, float)) and k not in ("family_index", "per_family_instance_index",
                                                              "repetition_index", "threads", "repetitions")}
        if b.get("error_occurred"):
            row = {"error": b.get("error_message", "")}
        rows[b["name"]] = row
    return {"context": j.get("context", {}), "benchmarks": rows}
summary = {
    "gpu": open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else None,
    "steps": [{"step": s.split()[0], "exit": int(s.split()[1]), "seconds": float(s.split()[2])} for s in steps],
    "exit": status,
    "gpu_run": load("gpu-run.json"),
    "bench_cuda": bench("bench-cuda.json"),
    "bench_host": bench("bench-host.json"),
}
t = os.path.join(out, "python-cuda.txt")
if os.path.exists(t):
    summary["python_cuda"] = open(t).read().strip().splitlines()[-12:]
t = os.path.join(out, "gpu-tests.txt")
if os.path.exists(t):
    summary["gpu_tests"] = [l for l in open(t).read().splitlines() if "tests passed" in l or "Skipped" in l]
with open(os.path.join(out, "device-check.json"), "w") as f:
    json.dump(summary, f, indent=1)
print("device-check: wrote", os.path.join(out, "device-check.json"))
PY
exit $status
