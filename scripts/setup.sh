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
debs=(librapidcheck-dev libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev ninja-build ccache clang-format)

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
# The Python adapter's test suite (adapter/tests, run by ctest) needs pytest; its te tests
# run TE's own Python code over a stubbed extension and need numpy and pydantic (TE imports
# them) and TE's pure-Python wheel; ruff formats and lints the adapter (the format.ruff test).
py_tools=("pytest==9.2.0" "ruff==0.17.6" "numpy==2.4.6" "pydantic==2.14.4")
if ! "$venv/bin/python" - "${py_tools[@]}" <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
sys.exit(any(m.version(s.split("==")[0]) != s.split("==")[1] for s in sys.argv[1:]))
PY
  log "installing ${py_tools[*]} into $venv"
  "$venv/bin/pip" install -q "${py_tools[@]}"
fi
te_wheel="$root/.te/rest/transformer_engine-2.20.2-py3-none-any.whl"
if [ ! -f "$te_wheel" ]; then
  log "downloading TransformerEngine 2.20.2's pure-Python wheel into .te/rest (the adapter's te tests)"
  mkdir -p "$root/.te/rest"
  grep -qx '/.te/' "$root/.git/info/exclude" 2>/dev/null || echo '/.te/' >> "$root/.git/info/exclude" 2>/dev/null || true
  "$venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$root/.te/rest" "transformer-engine==2.20.2"
fi
prefix="$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"

if [ ! -f "$build/build.ninja" ]; then
  log "configuring $build"
  launcher=()
  # ccache and the precompiled LibTorch header: see cmake/GradfuzzWarnings.cmake.
  command -v ccache >/dev/null &&
    launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_SLOPPINESS=pch_defines,time_macros;ccache")
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" ${GRADFUZZ_CMAKE_ARGS:-}
fi
log "building"
cmake --build "$build" -j"$(nproc)"
