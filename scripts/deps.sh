#!/usr/bin/env bash
# deps.sh: installs the Debian packages kwarm builds and tests with, when
# they are missing and we are root; otherwise names what is missing.
set -euo pipefail

pkgs=(gcc make cmake pkg-config libcjson-dev libsodium-dev liblmdb-dev
      libuv1-dev libxxhash-dev libhiredis-dev libsystemd-dev libcriterion-dev
      python3 python3-venv python3-setuptools python3-wheel systemd
      redis-server clang libclang-rt-14-dev libmicrohttpd-dev
      python3-prometheus-client prometheus)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if [ "$(id -u)" -eq 0 ]; then
    echo "deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing Debian packages: ${missing[*]}" >&2
    echo "deps: run 'make run' as root once, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

cuda=${KW_CUDA_ROOT:-/usr/local/cuda}
if [ ! -e "$cuda/include/nvrtc.h" ] || ! ls "$cuda"/lib64/libnvrtc.so* >/dev/null 2>&1; then
  echo "deps: no NVRTC under $cuda (the CUDA toolkit is needed to build; set KW_CUDA_ROOT)" >&2
  exit 1
fi
