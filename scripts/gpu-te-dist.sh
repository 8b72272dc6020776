#!/usr/bin/env bash
# Issue 16 on a lent nvidia-h200-x2 (two H200s of one host, NCCL): tensor- and
# sequence-parallel te.ops cases of 2 ranks, one GPU each (docs/BACKENDS.md "Distributed
# cases", docs/TE.md "Tensor parallelism"). Installs TransformerEngine 2.20.2 as
# scripts/gpu-te.sh does (scripts/gpu-lib.sh: the pieces carried in earlier calls, then
# .te/rest and build/tools/gradfuzz in this one), then runs bounded stages. Everything goes
# under $OUT/work, packed into $OUT/<tag>.tar.gz beside a summary $OUT/<tag>.txt.
#   STAGES    space-separated, in this order (default: caps tp32 tp16 export selftest tput):
#             caps      TE's capabilities (max_world_size must be 2: one rank per GPU)
#             tp32 tp16 CASES (default 2000) two-rank cases in float32 / bfloat16, tiny shapes,
#                       with the known file (issue 16's acceptance), stopped at TP32_S / TP16_S
#             export    every finding replayed and exported; each script run as
#                       `torchrun --nproc-per-node 2 -m pytest -q` (its values beside it)
#             selftest  the te faults of the ranks' communication (te/faults.py), 2000 cases
#             tput      cases/s of two-rank campaigns against 1, 2 workers
#   WORKERS   worker processes (default 2: each worker's two ranks take both GPUs, NCCL)
#   TP32_S TP16_S  the most seconds each campaign may take (default 200 each)
#   SELFTEST_S     limit of the selftest stage (default 240); CASE_TIMEOUT per case (60: a
#                  rank started anew imports TE in 6-9 s)
#   EXPORT_MAX     case files exported (default 30)
#   TAG       name of the tarball and summary (default: the first stage)
#   BUDGET_S  seconds this call may take in all (default 540); each stage is bounded too
#   DRY_RUN=1 checks the script on a CPU machine: the torch backend's gloo ranks stand in for
#             te on two GPUs, no TE install (the stages' logic, packing and summaries).
set -uo pipefail
out="${OUT:-/tmp/gradfuzz-te-dist}"
stages="${STAGES:-caps tp32 tp16 export selftest tput}"
tag="${TAG:-${stages%% *}}"
budget="${BUDGET_S:-540}"
workers="${WORKERS:-2}"
case_timeout="${CASE_TIMEOUT:-60}"
backend=te
device=cuda
devices=(--devices 0,1)
if [ "${DRY_RUN:-0}" = 1 ]; then backend=torch device=cpu devices=(); fi
source "$(dirname "${BASH_SOURCE[0]}")/gpu-lib.sh"
gpu_te_setup
# KINDS.md: NVLink multicast stays off on these machines.
export NCCL_NVLS_ENABLE=0
gpu_gradfuzz
nvidia-smi -L >"$work/device.txt" 2>&1
"$python" -c 'import torch; print("torch", torch.__version__, "GPUs", torch.cuda.device_count())' >"$work/versions.txt" 2>&1
say "$(cat "$work/device.txt" | paste -sd' ') / $(tail -1 "$work/versions.txt")"
known="$PWD/known/te-2.20.2.json"
known_args=()
[ "$backend" = te ] && [ -f "$known" ] && known_args=(--known "$known")

has() { [[ " $stages " == *" $1 "* ]]; }
stage() {  # stage NAME SECONDS COMMAND...: bounded, logged to $work/NAME.log
  local name="$1" limit="$2"; shift 2
  local remaining; remaining=$(left)
  if [ "$remaining" -lt 20 ]; then say "$name: skipped (budget)"; return 0; fi
  [ "$limit" -gt "$remaining" ] && limit=$((remaining - 10))
  local t; t=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  say "$name: exit $rc in $(( $(date +%s) - t )) s (limit $limit): $(tail -1 "$work/$name.log" | cut -c1-200)"
  return 0
}
report_line() {
  [ -f "$1" ] || { echo "no report"; return; }
  "$python" - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = r["summary"]
print(f"cases {s['cases_run']} failed {s['failed']} known_failed {s.get('known_failed')} unsupported {s['unsupported']} "
      f"new {s.get('new_findings')} known {s.get('known_findings')} {s['cases_per_s']:.1f} cases/s")
cov = r.get("coverage", {})
ops = {k: v for k, v in cov.get("ops", {}).items() if k in ("AllGather", "ReduceScatter", "AllReduce", "Linear")}
print(f"    ops {ops}; fusions fired {cov.get('fusions', {})}")
for f in r.get("findings", [])[:12]:
    print(f"    {f['signature']}  {f['case_file']}")
PY
}
campaign_cases() {  # campaign_cases NAME CASES LIMIT ARGS...
  local name="$1" cases="$2" limit="$3"; shift 3
  stage "$name" "$limit" "$gf" fuzz --backend "$backend" --device "$device" --world-size 2 "${devices[@]}" \
    --workers "$workers" --case-timeout "$case_timeout" --corpus "$work/$name" --report "$work/$name.json" \
    --case-log "$work/$name.cases.jsonl" --quiet --cases "$cases" "${known_args[@]}" "$@"
  say "  $name: $(report_line "$work/$name.json")"
}

if has caps; then
  timeout 120 "$gf" list capabilities --backend "$backend" >"$work/capabilities.json" 2>"$work/caps.err" ||
    say "caps failed: $(tail -3 "$work/caps.err")"
  say "caps: max_world_size $("$python" -c "import json; print(json.load(open('$work/capabilities.json')).get('max_world_size', 1))" 2>/dev/null)"
fi
# Issue 16's acceptance: 2000 two-rank cases per dtype, every finding shrunk (few calls: each
# candidate is a case of two ranks).
has tp32 && campaign_cases tp32 "${CASES:-2000}" "${TP32_S:-200}" --seed 61 --dtypes float32 --shapes tiny \
  --max-shrink-calls 40
has tp16 && campaign_cases tp16 "${CASES:-2000}" "${TP16_S:-200}" --seed 62 --dtypes bfloat16 --shapes tiny \
  --max-shrink-calls 40
if has export; then
  mkdir -p "$work/export"
  copied=0
  for dir in tp32 tp16; do
    for sub in findings crashing findings/known; do
      for f in "$work/$dir/$sub"/*.json; do
        [ -f "$f" ] && [ "$copied" -lt "${EXPORT_MAX:-30}" ] || continue
        cp "$f" "$work/export/${dir}_${sub//\//-}_$(basename "$f")"
        copied=$((copied + 1))
      done
    done
  done
  say "export: $copied case files"
  if [ "$copied" -gt 0 ]; then
    stage replay 150 "$gf" replay "$work/export" --backend "$backend" --workers "$workers" "${devices[@]}" \
      --case-timeout "$case_timeout" --report "$work/replay.json"
    for f in "$work"/export/*.json; do
      id=$(basename "$f" .json)
      [ "$(left)" -gt 40 ] || { say "export: stopped (budget)"; break; }
      timeout 90 "$gf" export --python "$f" --backend "$backend" -o "$work/export/test_$id.py" \
        >"$work/export/$id.export.log" 2>&1 || { say "export $id failed: $(tail -1 "$work/export/$id.export.log")"; continue; }
      # One process per rank, as TE's distributed tests run.
      (cd "$work/export" && timeout 120 "$python" -m torch.distributed.run --nproc-per-node 2 -m pytest -q \
        -p no:cacheprovider "test_$id.py" >"$id.pytest.log" 2>&1)
      rc=$?
      fails_replay=$("$python" -c "import json; print(any('$id' in f['case_file'] for f in json.load(open('$work/replay.json'))['findings']))" 2>/dev/null)
      say "  $id: script exit $rc, replay fails: $fails_replay"
    done
  fi
fi
if has selftest; then
  faults=$("$gf" list faults --backend "$backend" 2>/dev/null | cut -f1 |
    grep -E 'reduce-scatter-wrong-shard|column-parallel-dgrad|all-reduce-backward' | paste -sd, -)
  stage selftest "${SELFTEST_S:-240}" "$gf" selftest --backend "$backend" --device "$device" --faults "$faults" \
    "${devices[@]}" --workers "$workers" --case-timeout "$case_timeout" --shapes tiny --dtypes float32,bfloat16 \
    --corpus "$work/selftest" --report "$work/selftest.json" "${known_args[@]}"
fi
if has tput; then
  for w in 1 2; do
    stage "tput-w$w" 60 "$gf" fuzz --backend "$backend" --device "$device" --world-size 2 "${devices[@]}" \
      --workers "$w" --time 40 --seed 63 --dtypes float32 --shapes tiny --max-shrink-calls 0 "${known_args[@]}" \
      --case-timeout "$case_timeout" --corpus "$work/tput-w$w" --report "$work/tput-w$w.json" --quiet
    say "  tput-w$w: $(report_line "$work/tput-w$w.json")"
  done
fi
exit 0
