#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing, build, and run the quickstart
# scenario (synthetic checkpoints, local directory store, loopback relay tree, emulated WAN), then print
# its result table. Usage: scripts/quickstart.sh [SCENARIO.yaml]   (default scenarios/quickstart.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:-scenarios/quickstart.yaml}"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCR_BUILD_TESTS=OFF -DDCR_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target dcr dcr_shared dcr_preload
# The Python package (`import dcr` with /usr/bin/python3): python/CMakeLists.txt.
$([ "$(id -u)" -ne 0 ] && echo sudo) cmake --install build --component python >/dev/null
mkdir -p out
build/dcr run "$scenario" --out out/quickstart.json
echo "result: out/quickstart.json (and out/quickstart.md)"
