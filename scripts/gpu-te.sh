#!/usr/bin/env bash
# Runs on the lent H200 (device tool): installs TransformerEngine 2.20.2 from the parts that
# ../shared/te/fetch.sh laid out, then runs bounded acceptance stages of issues 12-15 with the
# te, model and torch backends. Everything goes under $OUT/work, packed at the end into
# $OUT/<tag>.tar.gz (the device returns at most 8 files) beside a summary $OUT/<tag>.txt.
#
# Before it: six calls carrying .te/q0 .. .te/q5 (scripts/gpu-lib.sh says how to make them),
# each `mkdir -p /tmp/teparts && cp .te/qN/qN /tmp/teparts/`; then this call carries .te/rest
# and a gradfuzz binary built on the CPU machines (GRADFUZZ=path; the GPU machine has the same
# LibTorch 2.11 + CUDA 13; e.g. copied into an ignored .gpu/ folder and carried).
#   STAGES    space-separated, run in this order (default: all of call A):
#             caps probe te32 te16 export   call A: TE's capabilities and FP8 probe (issue 14),
#                                           the TE campaigns with the known file (issues 12,
#                                           13), every finding replayed, exported and run under
#                                           pytest (issue 15)
#             recipes selftest-fp8 export   call B: one campaign per recipe TE has here (both
#                                           dtypes, mixed shapes, the tight FP8 rule), the
#                                           planted FP8 faults, the recipe findings exported
#             tput delayed quick            call C: throughput (issue 15), DelayedScaling
#                                           repeat calls, the README's TE quick start
#             selftest                      the plain planted TE faults (no recipe)
#             usage                         issue 30: the te-usage-* faults (USAGE_SELFTEST=0:
#                                           not; USAGE_FAULTS: these), USAGE_REPLAY's case
#                                           files replayed, USAGE_PYTEST's tests, plain-TE
#                                           delayed-scaling state probe (probe_te_state.py), a
#                                           fresh campaign (USAGE_SEED; USAGE_CAMPAIGN=0: no
#                                           probe, no campaign) with its coverage.usage,
#                                           cases/s on and off per USAGE_TPUT_SHAPES (tiny)
#                                           and USAGE_TPUT_WORKERS (1 12),
#                                           cases/s usage on and off; USAGE_SHRINK caps
#                                           each selftest shrink's runs (60), USAGE_PROBE=0
#                                           skips the probe
#             fp8cost                       issue 26: one te worker's cases/s per recipe
#                                           (FP8COST_RECIPES) with the FP8 checks on and off
#             open                          adapter/tests/probe_te_open.py (plain-TE checks
#                                           of findings not yet explained), when present
#             upstream defects quick        issue 25: three fresh campaigns on unseen seeds
#                                           (float32, bfloat16, --recipe any) with the known
#                                           file, every new cluster's folder (report upstream)
#                                           and its test run on TE; the known defects' cases
#                                           (docs/te-defects/*/case.json) replayed, confirmed
#                                           and written up likewise; the README's quick start
#   FILES     case files (globs, space-separated) the export stage replays and exports
#             before the campaigns' findings, e.g. "tests/backends/data/te-bls-*.json"
#   EXPORT_FROM  campaigns whose findings the export stage takes (default: te32 te16 and
#             every recipe-* campaign of this call); a campaign of an earlier call of the
#             lease is taken from /tmp/gradfuzz-state/campaigns (each campaign's case files
#             and report are kept there), so export can be a call of its own
#   RECIPES   the recipe campaigns to run (default: every recipe TE has here)
#   CASES     cases of the te32, te16 and each recipe campaign (default 2000)
#   TE32_S TE16_S RECIPE_S  the most seconds each of them may take (100, 100, 75)
#   SELFTEST_S SELFTEST_FP8_S  limits of the plain and of each of the two FP8 selftest
#             stages (150, 90)
#   EXPORT_MAX EXPORT_JOBS  case files exported (80) and exports run at a time (8)
#   TPUT_WORKERS            worker counts of the te throughput table (default "1 4 8 12 16")
#   TPUT_S                  seconds of each throughput campaign (default 20)
#   TPUT_MODES              one-worker cost ledgers: "shared" (default), "separate" (each
#                           check its own run), "none", "reference", "evidence" (--overlap);
#                           a mode named again runs again; TPUT_LEDGER_SHAPES their --shapes
#                           (default tiny)
#   TPUT_MPS_WORKERS        te worker counts run under --mps (default "12")
#   TPUT_MORE               0: only the te worker table and the one-worker ledgers (no mix,
#                           MPS or model campaigns, no profile); default 1
#   U_SEEDS   the upstream stage's seeds (float32, bfloat16, recipe any; default "181 182 183")
#   U_S       the most seconds each upstream campaign may take (default 150)
#   TAG       name of the tarball and summary (default: the first stage)
#   BUDGET_S  seconds this call may take in all (default 540): stages that would start after
#             it are skipped and say so; each stage is bounded by `timeout` as well.
#   ab        issue 27 item 4: te workers before and after a change, alternating on this
#             machine: tiny float32 campaigns with AB_WORKERS (1 4 8 12) workers and one
#             worker on the default mix (AB_S seconds each, default 20; AB_MIX=0: not),
#             then one worker's cost ledger per side (AB_LEDGERS=0: not) and the
#             adapter's profile on the sides
#             AB_PROFILE names (default "after"; "" for none). The
#             "before" side is AB_BEFORE, a folder holding a gradfuzz binary and the
#             adapter/ it ran with; "after" is this tree with GRADFUZZ.
#   DRY_RUN=1 checks this script on a CPU machine: the torch backend on the CPU stands in for
#             te on CUDA, no TE install (the stages' logic, the packing and the summaries).
set -uo pipefail
out="${OUT:-/tmp/gradfuzz-te}"
stages="${STAGES:-caps probe te32 te16 export}"
tag="${TAG:-${stages%% *}}"
budget="${BUDGET_S:-540}"
seed="${SEED:-11}"
workers="${WORKERS:-12}"
backend=te
device=cuda
if [ "${DRY_RUN:-0}" = 1 ]; then backend=torch device=cpu; fi
source "$(dirname "${BASH_SOURCE[0]}")/gpu-lib.sh"
gpu_te_setup
gpu_gradfuzz
nvidia-smi -L >"$work/device.txt" 2>&1
python3 -c 'import torch, transformer_engine as te; print("torch", torch.__version__, "TE", te.__version__)' \
  >"$work/versions.txt" 2>&1
say "$(cat "$work/device.txt") / $(tail -1 "$work/versions.txt")"
known="$PWD/known/te-2.20.2.json"

has() { [[ " $stages " == *" $1 "* ]]; }
# stage NAME SECONDS COMMAND...: runs with a time limit (cut to what the budget has left),
# logs to $work/NAME.log, records exit status and wall time.
stage() {
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
report_line() {  # report_line FILE: the summary of a report
  [ -f "$1" ] || { echo "no report"; return; }
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = r["summary"]
print(f"cases {s['cases_run']} failed {s['failed']} known_failed {s.get('known_failed')} unsupported {s['unsupported']} "
      f"new {s.get('new_findings')} known {s.get('known_findings')} causes {s.get('known_causes')} "
      f"{s['cases_per_s']:.1f} cases/s regimes {s.get('regimes')}")
known = ", ".join(f"{k['id']} {k['cases']}/{k['signatures']}" for k in r.get("known", []))
if known:
    print(f"    known (cases/signatures): {known}")
usage = r.get("coverage", {}).get("usage")
if usage:
    print(f"    usage (cases): {usage}")
    print(f"    usage per recipe: {r['coverage'].get('usage_by_recipe')}")
states = r.get("coverage", {}).get("fp8_states_checked")
if states:
    print(f"    delayed-scaling states judged: {states}")
tensors = r.get("coverage", {}).get("fp8_tensors_checked")
if tensors:
    print(f"    quantized tensors checked: {tensors}")
compared = r.get("coverage", {}).get("fused_ops", {}).get("compared", {})
fired = r.get("coverage", {}).get("fusions", {})
if compared or fired:
    print(f"    fusions fired {fired}; fused ops compared {compared}")
PY
}
campaign() {  # campaign NAME SECONDS ARGS...: a fuzz campaign of SECONDS (--time: it writes its report) into $work/NAME
  local name="$1" seconds="$2"; shift 2
  local remaining; remaining=$(left)
  [ "$seconds" -gt $((remaining - 35)) ] && seconds=$((remaining - 35))
  if [ "$seconds" -lt 10 ]; then say "$name: skipped (budget)"; return 0; fi
  stage "$name" $((seconds + 30)) "$gf" fuzz --backend "$backend" --device "$device" --workers "$workers" \
    --corpus "$work/$name" --report "$work/$name.json" --case-log "$work/$name.cases.jsonl" --quiet --time "$seconds" "$@"
  say "  $name: $(report_line "$work/$name.json")"
}

campaign_cases() {  # campaign_cases NAME CASES LIMIT ARGS...: a fuzz campaign of CASES cases, stopped at LIMIT s
  local name="$1" cases="$2" limit="$3"; shift 3
  stage "$name" "$limit" "$gf" fuzz --backend "$backend" --device "$device" --workers "$workers" \
    --corpus "$work/$name" --report "$work/$name.json" --case-log "$work/$name.cases.jsonl" --quiet --cases "$cases" "$@"
  say "  $name: $(report_line "$work/$name.json")"
  keep_campaign "$name"
}

# What TE runs here; kept for the later calls of the lease ($OUT is emptied before each call).
state=/tmp/gradfuzz-state
mkdir -p "$state/campaigns"
keep_campaign() {  # keep_campaign NAME: its case files and report, for an export in a later call
  [ -d "$work/$1" ] || return 0
  rm -rf "${state:?}/campaigns/$1" && mkdir -p "$state/campaigns/$1"
  (cd "$work/$1" && find . -name '*.json' -not -path '*/examples/*' -not -path '*/inflight/*' \
    -exec cp --parents -t "$state/campaigns/$1" {} +) 2>/dev/null
  cp "$work/$1.json" "$state/campaigns/$1.json" 2>/dev/null
  return 0
}
if has caps || [ ! -s "$state/te-capabilities.json" ]; then
  timeout 90 "$gf" list capabilities --backend "$backend" >"$state/te-capabilities.json" 2>"$work/caps.err" ||
    say "caps failed: $(tail -3 "$work/caps.err")"
fi
cp "$state/te-capabilities.json" "$work/te-capabilities.json" 2>/dev/null
python3 - "$work/te-capabilities.json" <<'PY' | tee -a "$summary"
import json, sys
try:
    c = json.load(open(sys.argv[1]))
except Exception as e:  # noqa: BLE001
    sys.exit(f"no capabilities: {e}")
print("fp8_reference_exact", c.get("fp8_reference_exact"), "fp8_gemm_accumulation", c.get("fp8_gemm_accumulation"),
      "recipes", [r["name"] for r in c.get("recipes", []) if r.get("available")])
PY
# Issue 14: TE's quantizers and FP8 GEMMs against the reference's rules (prints ok/DIFF lines).
[ "${DRY_RUN:-0}" = 1 ] || { has probe && stage probe-fp8 60 env OUT="$work" python3 adapter/tests/probe_te_fp8.py; }
if has open && [ -f adapter/tests/probe_te_open.py ] && [ "${DRY_RUN:-0}" != 1 ]; then
  stage probe-open 90 python3 adapter/tests/probe_te_open.py --out "$work/probe_te_open.json"
fi
# Issue 13 and 12: the known causes as known clusters, what is new explained; bfloat16 judged
# in its own dtype. Tiny shapes, seeds other than 21 and 11 of the issue's measurements.
# CASES cases each (default 2000, the issues' size), stopped at TE32_S / TE16_S seconds.
has te32 && campaign_cases te32 "${CASES:-2000}" "${TE32_S:-100}" --seed "${TE32_SEED:-51}" --dtypes float32 \
  --shapes tiny --known "$known" --max-shrink-calls 60
has te16 && campaign_cases te16 "${CASES:-2000}" "${TE16_S:-100}" --seed "${TE16_SEED:-52}" --dtypes bfloat16 \
  --shapes tiny --known "$known" --max-shrink-calls 60
if has recipes; then
  # Issue 14: each recipe TE has here, one campaign of CASES cases under it (every case), in
  # float32 and bfloat16 on mixed shapes (tiny, edge and large by time), the tight FP8 rule
  # where the capabilities say fp8_reference_exact, stopped at RECIPE_S seconds.
  recipes=$(python3 -c "import json; print(' '.join(r['name'] for r in json.load(open('$work/te-capabilities.json'))['recipes'] if r['available']))" 2>/dev/null)
  say "recipes available: ${recipes:-none}${RECIPES:+; this call runs: $RECIPES}"
  for r in $recipes; do
    [ -z "${RECIPES:-}" ] || [[ " $RECIPES " == *" $r "* ]] || continue
    campaign_cases "recipe-$r" "${CASES:-2000}" "${RECIPE_S:-75}" --seed 41 --dtypes float32,bfloat16 --shapes mix \
      --recipe "$r" --known "$known" --max-shrink-calls 30
  done
fi
# Issue 13 item 5 and issue 14 item 5: every planted TE fault found as a new finding with the
# known file loaded, and passing without it.
faults=$("$gf" list faults --backend "$backend" 2>/dev/null | cut -f1)
selftest() {  # selftest NAME SECONDS FAULTS ARGS...
  local name="$1" limit="$2" list="$3"; shift 3
  [ -n "$list" ] || { say "$name: no faults"; return 0; }
  stage "$name" "$limit" "$gf" selftest --backend "$backend" --device "$device" --faults "$list" --known "$known" \
    --workers "$workers" --shapes tiny --corpus "$work/$name" --report "$work/$name.json" "$@"
  say "  $name: $(python3 -c "
import json, sys
try:
    r = json.load(open('$work/$name.json'))
except Exception as e:
    sys.exit(f'no report ({e})')
for f in r.get('selftest', []):
    print(f['name'], 'ok' if f.get('ok') else 'FAILED', 'detected in', f.get('cases_to_detect'), 'cases, shrunk to',
          f.get('shrunk_ops'), 'ops, replay', f.get('replay_with_fault_exit'), '/', f.get('replay_without_fault_exit'), end='; ')
" 2>&1)"
}
if has selftest-fp8; then
  # The FP8 faults (BackwardActivationBias fuses only under a recipe: its fault goes with
  # them) in bfloat16 under the recipes, in two stages; DelayedScaling's scale update under
  # that recipe alone (it shows from the second call).
  fp8=$(echo "$faults" | grep -E 'fp8|activation-bias')
  selftest selftest-fp8-a "${SELFTEST_FP8_S:-90}" "$(echo "$fp8" | head -n 2 | paste -sd, -)" --cases 2000 \
    --dtypes bfloat16 --recipe any
  selftest selftest-fp8-b "${SELFTEST_FP8_S:-90}" "$(echo "$fp8" | tail -n +3 | paste -sd, -)" --cases 2000 \
    --dtypes bfloat16 --recipe any
  selftest selftest-delayed 60 "$(echo "$faults" | grep -E 'delayed' | paste -sd, -)" --cases 2000 \
    --dtypes bfloat16 --recipe DelayedScaling
fi
if has export; then
  # Issue 15: every finding (new clusters and known ones) replayed and exported; the scripts
  # run under one pytest (TE imports once); outcomes compared in the summary.
  mkdir -p "$work/export"
  # Every cluster of each campaign of EXPORT_FROM (new, crashing, then one case per known
  # cluster), in that order: at most EXPORT_MAX.
  copied=0
  for f in ${FILES:-}; do
    [ -f "$f" ] || continue
    cp "$f" "$work/export/files_$(basename "$f")"
    copied=$((copied + 1))
  done
  from="${EXPORT_FROM:-te32 te16 $(cd "$work" && ls -d recipe-* 2>/dev/null | grep -v '\.' | paste -sd' ' -)}"
  for dir in $from; do
    root="$work/$dir"
    if [ ! -d "$root" ] && [ -d "$state/campaigns/$dir" ]; then
      root="$state/campaigns/$dir"
      cp "$state/campaigns/$dir.json" "$work/$dir.json" 2>/dev/null
      say "export: $dir from an earlier call ($(report_line "$work/$dir.json" | head -1))"
    fi
    for sub in findings crashing findings/known; do
      for f in "$root/$sub"/*.json; do
        [ -f "$f" ] && [ "$copied" -lt "${EXPORT_MAX:-80}" ] || continue
        cp "$f" "$work/export/${dir}_${sub//\//-}_$(basename "$f")"
        copied=$((copied + 1))
      done
    done
  done
  say "export: $copied case files"
  stage replay 90 "$gf" replay "$work/export" --backend "$backend" --workers "$workers" --report "$work/replay.json"
  # One export per case file, EXPORT_JOBS at a time (each starts the adapter and imports TE).
  export gf backend work
  t=$(date +%s)
  # About 1.7 s of 8 exporters per script on the H200 (30 in 50 s, 2026-12-02c): 120 s or
  # more for many, whatever the budget leaves room for beside pytest.
  export_s=$(( copied * 3 + 30 > 120 ? copied * 3 + 30 : 120 ))
  [ "$export_s" -gt $(( $(left) - 100 )) ] && export_s=$(( $(left) - 100 ))
  ls "$work"/export/*.json 2>/dev/null | timeout "$export_s" xargs -P "${EXPORT_JOBS:-8}" -I{} \
    bash -c 'id=$(basename "{}" .json); timeout 90 "$gf" export --python "{}" --backend "$backend" \
      -o "$work/export/test_$id.py" >/dev/null 2>"$work/export/$id.export.log" ||
      echo "export $id failed: $(tail -1 "$work/export/$id.export.log")"' | tee -a "$summary"
  say "export: $(ls "$work"/export/test_*.py 2>/dev/null | wc -l) scripts in $(( $(date +%s) - t )) s"
  stage pytest 150 bash -c "cd '$work/export' && python3 -m pytest -q -p no:cacheprovider -rA test_*.py"
  python3 - "$work" <<'PY' | tee -a "$summary"
import json, os, re, sys
work = sys.argv[1]
replay = {}
try:
    for f in json.load(open(os.path.join(work, "replay.json")))["findings"]:
        replay[os.path.basename(f["case_file"])[:-5]] = True
except Exception as e:  # noqa: BLE001
    print("no replay report:", e)
log = open(os.path.join(work, "pytest.log")).read() if os.path.exists(os.path.join(work, "pytest.log")) else ""
outcome = {}
for m in re.finditer(r"^(PASSED|FAILED|ERROR) (test_([^.]+)\.py)", log, re.M):
    outcome.setdefault(m.group(3), set()).add(m.group(1))
agree = disagree = 0
for name in sorted(n[:-5] for n in os.listdir(os.path.join(work, "export")) if n.endswith(".json")):
    fails_replay = name in replay
    got = outcome.get(name)
    if got is None:
        print(f"  {name}: replay {'fails' if fails_replay else 'passes'}, no script outcome")
        continue
    fails_script = bool(got & {"FAILED", "ERROR"})
    ok = fails_script == fails_replay
    agree += ok
    disagree += not ok
    if not ok:
        print(f"  {name}: replay {'fails' if fails_replay else 'passes'}, script {'fails' if fails_script else 'passes'}")
print(f"export: {agree} scripts agree with replay, {disagree} disagree")
PY
fi
if has usage; then
  # Issue 30: the usage script's planted TE faults (te-usage-*), a fresh campaign on an unseen
  # seed with the known file (its coverage.usage counts, no new false positive), and one te
  # worker's (and 12 workers') cases/s with the usage script on and off.
  if [ "${USAGE_SELFTEST:-1}" = 1 ]; then
    # USAGE_FAULTS: space-separated groups of comma-separated faults, each group a selftest
    # of its own (its own report, USAGE_SELFTEST_S seconds), so that one slow group loses
    # no other's result.
    g=0
    for group in ${USAGE_FAULTS:-$(echo "$faults" | grep -E 'usage|backward-update' | paste -sd, -)}; do
      g=$((g + 1))
      selftest "selftest-usage-$g" "${USAGE_SELFTEST_S:-200}" "$group" --cases 2000 --dtypes float32,bfloat16 --recipe any \
        --max-shrink-calls "${USAGE_SHRINK:-60}"
    done
  fi
  if [ -n "${USAGE_REPLAY:-}" ]; then
    # Case files of an earlier lease's usage findings (globs), replayed with this binary.
    # shellcheck disable=SC2086
    stage usage-replay 120 "$gf" replay --backend "$backend" --known "$known" --report "$work/usage-replay.json" $USAGE_REPLAY
    say "  usage-replay: $(report_line "$work/usage-replay.json")"
  fi
  if [ -n "${USAGE_PYTEST:-}" ] && [ "${DRY_RUN:-0}" != 1 ]; then
    # Upstream tests (paths, space-separated) run under pytest on TE: each should fail.
    # shellcheck disable=SC2086
    stage usage-pytest 120 python3 -m pytest -q -p no:cacheprovider $USAGE_PYTEST
    say "$(grep -E 'passed|failed|Error|assert' "$work/usage-pytest.log" | tail -8 | cut -c1-400)"
  fi
  if [ "${USAGE_CAMPAIGN:-1}" = 1 ]; then
    if [ "${USAGE_PROBE:-1}" = 1 ] && [ -f adapter/tests/probe_te_state.py ] && [ "${DRY_RUN:-0}" != 1 ]; then
      stage probe-state 90 python3 adapter/tests/probe_te_state.py --out "$work/probe_te_state.json"
      say "$(grep '^\[' "$work/probe-state.log" | cut -c1-600)"
    fi
    campaign_cases usage-campaign "${CASES:-2000}" "${USAGE_S:-150}" --seed "${USAGE_SEED:-307}" \
      --dtypes float32,bfloat16 --shapes tiny --recipe any --known "$known"
  fi
  for shapes in ${USAGE_TPUT_SHAPES:-tiny}; do
    for w in ${USAGE_TPUT_WORKERS-1 12}; do
      for u in on off; do
        n="tput-usage-$u-w$w-$shapes"
        stage "$n" $((${TPUT_S:-20} + 25)) "$gf" fuzz --backend "$backend" --device "$device" \
          --time "${TPUT_S:-20}" --seed 7 --dtypes float32 --shapes "$shapes" --workers "$w" --max-shrink-calls 0 \
          --usage "$u" --known "$known" --corpus "$work/$n" --report "$work/$n.json" --quiet
        say "  $n: $(report_line "$work/$n.json")"
      done
    done
  done
fi
if has fp8cost; then
  # Issue 26: what the FP8 checks cost (the quantized-tensor checks and the delayed-scaling
  # state check): one te worker's cases/s per recipe with them on and off
  # (GRADFUZZ_FP8_CHECKS), tiny float32, the same seed.
  for r in ${FP8COST_RECIPES:-DelayedScaling Float8CurrentScaling Float8BlockScaling}; do
    for c in on off; do
      n="fp8cost-$r-$c"
      stage "$n" $((${TPUT_S:-20} + 25)) env GRADFUZZ_FP8_CHECKS="$c" "$gf" fuzz --backend "$backend" \
        --device "$device" --time "${TPUT_S:-20}" --seed 7 --dtypes float32 --shapes tiny --workers 1 \
        --max-shrink-calls 0 --recipe "$r" --known "$known" --corpus "$work/$n" --report "$work/$n.json" --quiet
      say "  $n: $(report_line "$work/$n.json")"
    done
  done
fi
if has selftest; then
  # The high-precision faults without recipes.
  selftest selftest "${SELFTEST_S:-150}" "$(echo "$faults" | grep -v -E 'fp8|delayed|activation-bias' | paste -sd, -)" \
    --cases 2000 --dtypes float32,bfloat16 --recipe none
fi
# upstream_tests DIR...: every test_*.py under the folders, run under one pytest (TE imports
# once); per test its lines, outcome and the first line of its failure.
upstream_tests() {
  local name="$1"; shift
  local files; files=$(find "$@" -name 'test_*.py' 2>/dev/null | sort)
  [ -n "$files" ] || { say "$name: no upstream test"; return 0; }
  # shellcheck disable=SC2086
  stage "$name" 150 python3 -m pytest -q -p no:cacheprovider -rA $files
  python3 - "$work/$name.log" $files <<'PY' | tee -a "$summary"
import re, sys
log = open(sys.argv[1]).read()
for path in sys.argv[2:]:
    name = path.rsplit("/", 1)[-1]
    lines = sum(1 for _ in open(path))
    outcome = "FAILED" if re.search(rf"^FAILED \S*{re.escape(name)}", log, re.M) else (
        "passed" if re.search(rf"^PASSED \S*{re.escape(name)}", log, re.M) else "no outcome")
    why = ""
    m = re.search(rf"^FAILED \S*{re.escape(name)}::\S+ - (.*)$", log, re.M)
    if m:
        why = m.group(1)[:160]
    print(f"  {path.split('/work/', 1)[-1]}: {lines} lines, {outcome} {why}")
PY
}
if has upstream; then
  # Issue 25: fresh campaigns on unseen seeds with the shipped known file: what is new is
  # confirmed by its alternative runs, and each new cluster becomes a folder to file.
  read -r s32 s16 sany <<<"${U_SEEDS:-181 182 183}"
  campaign_cases u32 "${CASES:-2000}" "${U_S:-150}" --seed "$s32" --dtypes float32 --shapes tiny --known "$known" \
    --max-shrink-calls 60
  campaign_cases u16 "${CASES:-2000}" "${U_S:-150}" --seed "$s16" --dtypes bfloat16 --shapes tiny --known "$known" \
    --max-shrink-calls 60
  campaign_cases uany "${CASES:-2000}" "${U_S:-150}" --seed "$sany" --dtypes float32,bfloat16 --shapes tiny \
    --recipe any --known "$known" --max-shrink-calls 60
  for c in u32 u16 uany; do
    [ -f "$work/$c.json" ] && stage "upstream-$c" 150 "$gf" report upstream "$work/$c.json" -o "$work/upstream-$c" \
      --backend "$backend"
  done
  upstream_tests upstream-pytest "$work"/upstream-*
fi
if has defects && [ "${DRY_RUN:-0}" != 1 ]; then
  # The known defects' small cases, replayed without the known file (so each is a finding of
  # its own), confirmed, written up and their tests run on TE: docs/TE.md's table.
  stage defects-replay 150 "$gf" replay docs/te-defects/*/case.json --backend "$backend" --workers "$workers" \
    --confirm --report "$work/defects.json"
  stage defects-upstream 150 "$gf" report upstream "$work/defects.json" -o "$work/te-defects" --backend "$backend"
  upstream_tests defects-pytest "$work/te-defects"
fi
has delayed && campaign delayed "${DELAYED_S:-30}" --seed 43 --dtypes bfloat16 --shapes tiny --recipe DelayedScaling \
  --known "$known" --max-shrink-calls 30
if has quick; then
  # Issue 15: the README's TE quick start as a TE maintainer types it (the build exists here).
  # QUICK_S: the campaign's --time; the stage gives its new clusters' shrinking and
  # confirmation two more minutes.
  stage quick "$((${QUICK_S:-60} + 120))" env GRADFUZZ_NO_SETUP=1 GRADFUZZ_BUILD="$(dirname "$(dirname "$gf")")" \
    bash scripts/fuzz.sh --backend te --time "${QUICK_S:-60}" --corpus "$work/quick" --report "$work/quick.json" --quiet
  [ -f "$work/quick.json" ] && stage upstream-quick 150 "$gf" report upstream "$work/quick.json" \
    -o "$work/upstream-quick" --backend "$backend" && upstream_tests upstream-quick-pytest "$work/upstream-quick"
  say "  quick: $(report_line "$work/quick.json")"
fi
if has ab; then
  # The same campaigns, before and after, one after the other so that the machine's drift over
  # the lease falls on both sides alike.
  ab() {  # ab SIDE NAME WORKERS SHAPES ARGS...
    local side="$1" name="ab-$2-$1" w="$3" shapes="$4"; shift 4
    local bin="$gf" adapter="$PWD/adapter"
    if [ "$side" = before ]; then bin="${AB_BEFORE:?AB_BEFORE: the folder of the before side}/gradfuzz" adapter="$AB_BEFORE/adapter"; fi
    stage "$name" $((${AB_S:-20} + 40)) env GRADFUZZ_ADAPTER_DIR="$adapter" "$bin" fuzz --backend "$backend" \
      --device "$device" --time "${AB_S:-20}" --seed 7 --dtypes float32 --shapes "$shapes" --workers "$w" \
      --max-shrink-calls 0 --known "$known" --corpus "$work/$name" --report "$work/$name.json" --quiet "$@"
    say "  $name: $(report_line "$work/$name.json")"
  }
  for w in ${AB_WORKERS:-1 4 8 12}; do
    for side in before after; do ab "$side" "w$w" "$w" tiny; done
  done
  [ "${AB_MIX:-1}" = 1 ] && for side in before after; do ab "$side" mix-w1 1 mix; done
  [ "${AB_LEDGERS:-1}" = 1 ] && for side in before after; do
    GRADFUZZ_CASE_COST="$work/cost-$side.jsonl" GRADFUZZ_ADAPTER_TIMING="$work/timing-$side.jsonl" \
      ab "$side" ledger-w1 1 tiny
    python3 scripts/case_cost.py "$work/cost-$side.jsonl" --adapter "$work/timing-$side.jsonl" \
      --by recipe >"$work/cost-$side.txt" 2>&1
    say "    $side: $(head -1 "$work/cost-$side.txt")"
  done
  for side in ${AB_PROFILE-after}; do
    GRADFUZZ_ADAPTER_PROFILE="$work/profile-$side" ab "$side" profile-w1 1 tiny
  done
fi
if has tput; then
  # Issue 15 item 5: the te worker table on tiny float32 cases without shrinking, the default
  # (mixed-shape) te campaign against it (the 70% target), one worker with and without
  # shared runs (--no-shared-runs) with each case's cost ledger (GRADFUZZ_CASE_COST) and
  # the adapter's timing, then CUDA MPS (--mps) for te and model workers on the one GPU.
  { nproc; lscpu | grep -E 'Model name|Thread|Core|Socket'; command -v nvidia-cuda-mps-control; } >"$work/cpus.txt" 2>&1
  tput() {  # tput NAME BACKEND WORKERS SHAPES ARGS...: a 20 s campaign without shrinking
    local name="$1" b="$2" w="$3" shapes="$4"; shift 4
    stage "$name" $((${TPUT_S:-20} + 25)) "$gf" fuzz --backend "$b" --device "$device" --time "${TPUT_S:-20}" --seed 7 --dtypes float32 --shapes "$shapes" \
      --workers "$w" --max-shrink-calls 0 --corpus "$work/$name" --report "$work/$name.json" --quiet "$@"
    say "  $name: $(report_line "$work/$name.json")"
  }
  mps=0
  [ "$device" = cuda ] && command -v nvidia-cuda-mps-control >/dev/null && mps=1
  for w in ${TPUT_WORKERS:-1 4 8 12 16}; do tput "tput-te-w$w" "$backend" "$w" tiny --known "$known"; done
  [ "${TPUT_MORE:-1}" = 1 ] || mps=0
  [ "${TPUT_MORE:-1}" = 1 ] && tput tput-te-mix "$backend" 12 mix --known "$known"
  if [ "$mps" = 1 ]; then
    tput tput-te-mix-mps "$backend" 12 mix --known "$known" --mps
    for w in ${TPUT_MPS_WORKERS:-12}; do tput "tput-te-w$w-mps" "$backend" "$w" tiny --known "$known" --mps; done
  fi
  if [ "${TPUT_MORE:-1}" = 1 ]; then
    tput tput-model-w8 model 8 tiny
    tput tput-model-mix model 8 mix
    [ "$mps" = 1 ] && tput tput-model-w8-mps model 8 tiny --mps
  fi
  # A mode named again runs again (name-2, name-3...): alternating modes take the machine's
  # drift over a lease out of an A/B comparison.
  declare -A runs=()
  for mode in ${TPUT_MODES:-shared}; do
    extra=()
    case "$mode" in
      separate) extra=(--no-shared-runs) ;;
      none | reference | evidence) extra=(--overlap "$mode") ;;
    esac
    runs[$mode]=$(( ${runs[$mode]:-0} + 1 ))
    name="$mode"; [ "${runs[$mode]}" -gt 1 ] && name="$mode-${runs[$mode]}"
    GRADFUZZ_CASE_COST="$work/cost-te-w1-$name.jsonl" GRADFUZZ_ADAPTER_TIMING="$work/timing-te-w1-$name.jsonl" \
      tput "tput-te-w1-$name" "$backend" 1 "${TPUT_LEDGER_SHAPES:-tiny}" --known "$known" "${extra[@]}"
    python3 scripts/case_cost.py "$work/cost-te-w1-$name.jsonl" --adapter "$work/timing-te-w1-$name.jsonl" \
      --by recipe >"$work/cost-te-w1-$name.txt" 2>&1
    say "    $(head -3 "$work/cost-te-w1-$name.txt" | paste -sd' ' -)"
  done
  # Where one te worker's adapter spends its time, function by function (read with pstats).
  [ "${TPUT_MORE:-1}" = 1 ] &&
    GRADFUZZ_ADAPTER_PROFILE="$work/profile-te-w1" tput tput-te-w1-profile "$backend" 1 tiny --known "$known"
fi
exit 0
