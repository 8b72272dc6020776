#!/usr/bin/env bash
# Sets up (see setup.sh) and runs the default fuzz campaign on the best device available.
# Findings land in gradfuzz-out/corpus, the report in gradfuzz-out/report.json.
# Extra arguments go to `gradfuzz fuzz` and replace these defaults
# (e.g. scripts/fuzz.sh --cases 5000 --seed 7, or --fault slot-order).
#
# With --backend te (the TE quick start, README): fuzzes the TransformerEngine that the
# Python on PATH imports (or $GRADFUZZ_PYTHON's), on CUDA, after checking up front that it
# imports, that a GPU is there and which versions run; loads known/te-<version>.json when one
# ships for that TE version, so only new findings fail the run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GRADFUZZ_BUILD:-$root/build}"

args=("$@")
defaults=()
given() {  # given OPTION: whether the user (or an earlier default) set OPTION
  local option="$1"
  for arg in ${args[@]+"${args[@]}"} ${defaults[@]+"${defaults[@]}"}; do
    [[ "$arg" == "$option" || "$arg" == "$option="* ]] && return 0
  done
  return 1
}
default() {  # default OPTION VALUE: OPTION VALUE unless OPTION is set
  given "$1" || defaults+=("$1" "$2")
}
backend=model
prev=""
for arg in "$@"; do
  [ "$prev" = "--backend" ] && backend="$arg"
  [[ "$arg" == --backend=* ]] && backend="${arg#--backend=}"
  prev="$arg"
done

if [ "$backend" = te ]; then
  # The user's Python, the one TE is installed in (the project's .venv has no TE).
  python="${GRADFUZZ_PYTHON:-$(command -v python3 || true)}"
  [ -n "$python" ] || { echo "fuzz.sh --backend te: no python3 on PATH (set GRADFUZZ_PYTHON to TE's Python)" >&2; exit 2; }
  if ! facts="$("$python" - <<'PY' 2>&1
import sys
try:
    import torch
except Exception as e:  # noqa: BLE001
    sys.exit(f"PyTorch does not import in {sys.executable}: {e}")
try:
    import transformer_engine
    import transformer_engine.pytorch  # noqa: F401
except Exception as e:  # noqa: BLE001
    sys.exit(f"transformer_engine.pytorch does not import in {sys.executable}: {e}\n"
             "  install TE for this Python (pip install transformer-engine[pytorch]) or set GRADFUZZ_PYTHON")
if not torch.cuda.is_available():
    sys.exit("no CUDA device is visible to PyTorch: the te backend runs te.ops on a GPU")
cap = ".".join(map(str, torch.cuda.get_device_capability()))
print(f"TE {transformer_engine.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()} (sm {cap}), "
      f"python {sys.version.split()[0]}")
print(transformer_engine.__version__.split('+')[0])
PY
)"; then
    echo "fuzz.sh --backend te: $facts" >&2
    exit 2
  fi
  echo "[fuzz.sh] $(echo "$facts" | head -1)" >&2
  te_version="$(echo "$facts" | tail -1)"
  export GRADFUZZ_PYTHON="$python"
  known="$root/known/te-$te_version.json"
  if ! given --known; then
    if [ -f "$known" ]; then
      defaults+=(--known "$known")
    else
      echo "[fuzz.sh] no known-issues file for TE $te_version (known/ has $(ls "$root/known" | tr '\n' ' '))):" \
           "every finding counts as new; gradfuzz known accept writes one (docs/KNOWN.md)" >&2
    fi
  fi
  default --device cuda
  default --dtypes float32,bfloat16,float16  # TE's dtypes: its GEMMs and activations refuse float64
  default --workers "$(( $(nproc) > 12 ? 12 : $(nproc) ))"
  given --time || default --cases 2000
fi

# GRADFUZZ_NO_SETUP=1: the build is there already (e.g. a binary carried to a GPU machine).
[ "${GRADFUZZ_NO_SETUP:-0}" = 1 ] || "$root/scripts/setup.sh"
default --device auto
given --time || default --cases 500
default --corpus "$root/gradfuzz-out/corpus"
default --report "$root/gradfuzz-out/report.json"
mkdir -p "$root/gradfuzz-out"
exec "$build/tools/gradfuzz" fuzz "${defaults[@]}" "$@"
