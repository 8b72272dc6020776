#!/usr/bin/env bash
# Runs on the lent H200 (device tool): installs TransformerEngine 2.20.2 from the parts that
# ../shared/te/fetch.sh laid out (carry .te/c0..c3 in four calls first, then this call carries
# .te/rest and build/tools/gradfuzz, a binary built here: the GPU machine has the same LibTorch
# 2.11 + CUDA 13), then runs the te backend's acceptance stages of docs/TE.md.
#   STAGES  space-separated subset of: smoke fp32 bf16 replay export throughput caps
#           (default: all). Outputs and logs go to $OUT.
set -uo pipefail
out="${OUT:-/tmp/gradfuzz-te}"
mkdir -p "$out"
stages="${STAGES:-caps smoke fp32 bf16 replay export throughput}"
cases="${CASES:-2000}"
seed="${SEED:-1}"
workers="${WORKERS:-4}"

if ! bash .te/rest/install.sh >"$out/te-install.log" 2>&1; then
  echo "TE install failed:"; tail -20 "$out/te-install.log"; exit 1
fi
tail -2 "$out/te-install.log"
export PYTHONPATH=/tmp/te-site
if ! python3 -c 'import transformer_engine.pytorch' 2>"$out/te-import.log"; then
  echo "transformer_engine.pytorch does not import:"; tail -5 "$out/te-import.log"; exit 1
fi
# The binary was linked against the wheel's LibTorch here; there the same version lives in
# the machine's venv.
torchlib="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$torchlib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export GRADFUZZ_PYTHON=python3 GRADFUZZ_ADAPTER_DIR="$PWD/adapter"
gf="${GRADFUZZ:-$PWD/build/tools/gradfuzz}"
"$gf" list faults >/dev/null || { ldd "$gf" | grep "not found"; exit 1; }
nvidia-smi -L | tee "$out/device.txt"
python3 -c 'import torch, transformer_engine as te; print("torch", torch.__version__, "TE", te.__version__)' | tee "$out/versions.txt"

has() { [[ " $stages " == *" $1 "* ]]; }
status=0
run() {  # run NAME COMMAND...: logs to $out/NAME.log, prints its last line and wall time
  local name="$1"; shift
  local t0; t0=$(date +%s)
  "$@" >"$out/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/$name.log")"
  return $rc
}

if has caps; then
  "$gf" list capabilities --backend te >"$out/te-capabilities.json" 2>"$out/caps.log" || status=1
  "$gf" list fusions --backend te >"$out/te-fusions.txt" 2>>"$out/caps.log" || status=1
  "$gf" list ops --backend te >"$out/te-ops.txt" 2>>"$out/caps.log" || status=1
fi
if has smoke; then
  run smoke "$gf" fuzz --backend te --device cuda --cases 50 --seed 7 --dtypes float32 --workers 2 \
    --corpus "$out/smoke" --report "$out/smoke.json" --quiet
fi
for dtype in fp32 bf16; do
  has "$dtype" || continue
  name=$([ "$dtype" = fp32 ] && echo float32 || echo bfloat16)
  run "te-$dtype" "$gf" fuzz --backend te --device cuda --cases "$cases" --seed "$seed" --dtypes "$name" \
    --workers "$workers" --max-shrink-calls 400 --corpus "$out/te-$dtype" --report "$out/te-$dtype.json" \
    --case-log "$out/te-$dtype.cases.jsonl" --quiet
done
if has replay || has export; then
  mkdir -p "$out/export"
  for f in "$out"/te-fp32/findings/*.json "$out"/te-fp32/crashing/*.json "$out"/te-bf16/findings/*.json \
           "$out"/te-bf16/crashing/*.json; do
    [ -f "$f" ] || continue
    tag="$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f" .json)"
    if has replay; then
      "$gf" replay "$f" --backend te >"$out/export/$tag.replay.log" 2>&1
      echo "replay $tag: exit $? $(grep -m1 FAIL "$out/export/$tag.replay.log" | cut -c1-160)"
    fi
    if has export; then
      "$gf" export --python "$f" --backend te -o "$out/export/test_$tag.py" >/dev/null 2>"$out/export/$tag.export.log" ||
        { echo "export $tag failed: $(tail -1 "$out/export/$tag.export.log")"; status=1; continue; }
      (cd "$out/export" && timeout 300 python3 -m pytest -q -p no:cacheprovider "test_$tag.py" \
        >"$tag.pytest.log" 2>&1)
      echo "pytest $tag: exit $? $(tail -1 "$out/export/$tag.pytest.log")"
    fi
  done
fi
if has throughput; then
  for w in 1 4 8; do
    run "te-throughput-w$w" "$gf" fuzz --backend te --device cuda --cases $((150 * w)) --seed 3 --dtypes float32 \
      --workers "$w" --max-shrink-calls 0 --corpus "$out/tp-$w" --report "$out/te-throughput-w$w.json" --quiet
  done
fi
exit $status
