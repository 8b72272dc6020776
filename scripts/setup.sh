#!/usr/bin/env bash
# Installs what gradfuzz needs on a fresh Debian 12 machine and configures the build.
# Idempotent: on a ready machine every step is a quick check (seconds, not minutes).
#   GRADFUZZ_VENV   virtualenv holding the torch wheel (default: .venv in the project)
#   GRADFUZZ_BUILD  build directory (default: build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${GRADFUZZ_VENV:-$root/.venv}"
build="${GRADFUZZ_BUILD:-$root/build}"
torch_version="2.11.0"
debs=(librapidcheck-dev libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev ninja-build ccache)

log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! "$venv/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  log "installing torch==$torch_version into $venv (large download, once)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==$torch_version"
fi
# The Python adapter's test suite (adapter/tests, run by ctest) needs pytest.
if ! "$venv/bin/python" -c "import pytest" 2>/dev/null; then
  log "installing pytest into $venv"
  "$venv/bin/pip" install -q pytest
fi
prefix="$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"

if [ ! -f "$build/build.ninja" ]; then
  log "configuring $build"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" ${GRADFUZZ_CMAKE_ARGS:-}
fi
log "building"
cmake --build "$build" -j"$(nproc)"
