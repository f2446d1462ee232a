#!/usr/bin/env bash
# Installs what dcr needs from Debian 12 packages (as root, or through sudo). Idempotent.
#   scripts/install-deps.sh          build + test dependencies
#   DCR_WITH_S3_SERVER=1 ...          also the OpenStack Swift S3 server used by the S3 tests
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(cmake ninja-build g++ pkg-config ccache libzstd-dev zstd libxxhash-dev libyaml-cpp-dev
      libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev libsimgrid-dev nlohmann-json3-dev
      libcli11-dev libcurl4-openssl-dev libssl-dev openssl gnuplot-nox iproute2 python3 clang libclang-rt-14-dev
      clang-format
      python3-numpy python3-pytest python3-hypothesis python3-torch)
if [ "${DCR_WITH_S3_SERVER:-0}" = "1" ]; then
  PKGS+=(swift swift-proxy swift-account swift-container swift-object memcached stunnel4)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
# Swift's packages must not pull their recommends (they start services we do not want).
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
