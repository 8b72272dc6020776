#!/usr/bin/env bash
# Nightly acceptance of issue 7 on the CPU (docs/BENCHMARKS.md, "Nightly acceptance"):
# measures each criterion, prints the figures, and exits non-zero when one is not met.
#
#   scripts/nightly-acceptance.sh [time] [rss] [mutate] [kill] [concurrent]   (default: all five)
#
# Environment:
#   GRADFUZZ   the gradfuzz binary (default build/tools/gradfuzz)
#   WORK       work directory (default: a new mktemp -d); each stage uses WORK/<stage>
#   NICE       prefix of every measured command (default "nice -n 15"; "" for none)
#   BAD_DIR    where the mutate stage keeps the files that broke a criterion (default WORK/mutate/bad)
#   TIME_S (300), TIME_WORKERS (4)            time stage
#   RSS_SMALL (20000), RSS_LARGE (200000)     rss stage
#   MUTATE_COUNT (2000), MUTATE_SEED (1), MUTATE_JOBS (2), MUTATE_TIMEOUT_S (5), MUTATE_MEM_BYTES (1 GiB)
#   KILL_TRIALS (50), KILL_SEED (7)           kill stage
#   CONCURRENT_S (60)                         concurrent stage
#
# Stages:
#   time        4 workers, --time 300, one fuzz run per injected fault (crash-segfault, crash-abort,
#               hang; `fuzz --fault` takes one): wall <= time + 10 s, each kind a finding whose case
#               file exists under crashing/ and reproduces, no case lost (counts add up, every case
#               number of the case log accounted for but the <= workers cancelled at the budget).
#               Then `selftest --faults crash-segfault,crash-abort,hang --workers 4` detects all three.
#   rss         peak RSS of `fuzz --workers 1 --cases 20000` and `--cases 200000`: supervisor and
#               worker (VmHWM polled) and /usr/bin/time's maximum; 200k <= 1.2 x 20k for each.
#   mutate      scripts/mutate_cases.py writes MUTATE_COUNT mutated case files of corpus/regression;
#               each is replayed under `timeout 5` with an address-space limit of 1 GiB above the
#               idle process's peak (libtorch with its CUDA libraries maps ~2.6 GiB before main,
#               so a bare 1 GiB limit cannot even load it): every exit 0, 1 or 2, no signal, no
#               timeout, no exit 3, no crash/timeout verdict of the worker.
#   kill        KILL_TRIALS kill -9 trials of a worker or the supervisor of
#               `fuzz --workers 2 --fault scale-bias-grad --cases 100000` after 0.5-5 s: every case
#               file of the corpus is JSON and loads; a killed worker is restarted and the run goes
#               on; after a killed supervisor the next fuzz on the corpus reruns every in-flight case
#               first and a failing one becomes a finding; nothing is left in inflight/.
#   concurrent  two campaigns on one corpus at once (--workers 1, different seeds, one with
#               --fault crash-abort) plus short campaigns started while they run: no false crash
#               (every crashing/ file reproduces with its recorded fault), every finding's file
#               present, inflight/ empty at the end.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GRADFUZZ=${GRADFUZZ:-$ROOT/build/tools/gradfuzz}
WORK=${WORK:-$(mktemp -d)}
NICE=${NICE-nice -n 15}
BAD_DIR=${BAD_DIR:-$WORK/mutate/bad}
TIME_S=${TIME_S:-300}
TIME_WORKERS=${TIME_WORKERS:-4}
RSS_SMALL=${RSS_SMALL:-20000}
RSS_LARGE=${RSS_LARGE:-200000}
MUTATE_COUNT=${MUTATE_COUNT:-2000}
MUTATE_SEED=${MUTATE_SEED:-1}
MUTATE_JOBS=${MUTATE_JOBS:-2}
MUTATE_TIMEOUT_S=${MUTATE_TIMEOUT_S:-5}
MUTATE_MEM_BYTES=${MUTATE_MEM_BYTES:-1073741824}
KILL_TRIALS=${KILL_TRIALS:-50}
KILL_SEED=${KILL_SEED:-7}
CONCURRENT_S=${CONCURRENT_S:-60}

[[ -x $GRADFUZZ ]] || { echo "nightly-acceptance: no gradfuzz binary at $GRADFUZZ (set GRADFUZZ)" >&2; exit 2; }
GRADFUZZ=$(cd "$(dirname "$GRADFUZZ")" && pwd)/$(basename "$GRADFUZZ")
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
read -r -a NICE_CMD <<<"$NICE"
G=("${NICE_CMD[@]}" "$GRADFUZZ")

FAILURES=()
fail() { FAILURES+=("$1"); echo "  FAIL: $1"; }
ok() { echo "  ok: $1"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }
le() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$1" "$2"; }

# ------------------------------------------------------------------------------------------------
# Python helpers (stdlib only), written once per run.
CHECK=$WORK/check.py
cat >"$CHECK" <<'PY'
import json, os, sys

def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)

def case_files(corpus):
    """Case files a loader reads (*.json, hidden names skipped) and hidden temporaries."""
    cases, hidden = [], []
    for d, dirs, files in os.walk(corpus):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for n in files:
            (hidden if n.startswith(".") else cases if n.endswith(".json") else hidden).append(os.path.join(d, n))
    return sorted(cases), sorted(hidden)

def cmd_report(args):
    """report REPORT [KIND [CORPUS]]: counts add up; KIND, when given, is a finding whose file
    exists (under CORPUS/crashing for crash and timeout). Prints a summary line."""
    r = load(args[0])
    if "summary" not in r:
        print("PROBLEM=report %s has no summary (keys: %s)" % (args[0], ",".join(r) or "none"))
        return
    s = r["summary"]
    problems = []
    if s["cases_run"] != s["passed"] + s["failed"] + s["unsupported"]:
        problems.append("cases_run %d != passed %d + failed %d + unsupported %d" %
                        (s["cases_run"], s["passed"], s["failed"], s["unsupported"]))
    counted = sum(f.get("count", 1) for f in r["findings"])
    if counted != s["failed"]:
        problems.append("finding counts sum to %d, failed is %d" % (counted, s["failed"]))
    if s.get("findings", len(r["findings"])) != len(r["findings"]):
        problems.append("summary.findings %s != %d findings listed" % (s.get("findings"), len(r["findings"])))
    for f in r["findings"]:
        for path in [f["case_file"]] + f.get("examples", []):
            if not os.path.isfile(path):
                problems.append("missing case file " + path)
    kinds = sorted({f["kind"] for f in r["findings"]})
    if len(args) > 1:
        kind = args[1]
        hits = [f for f in r["findings"] if f["kind"] == kind]
        if not hits:
            problems.append("no %s finding (kinds: %s)" % (kind, ",".join(kinds) or "none"))
        if len(args) > 2 and kind in ("crash", "timeout"):
            crashing = os.path.realpath(os.path.join(args[2], "crashing"))
            for f in hits:
                if os.path.dirname(os.path.realpath(f["case_file"])) != crashing:
                    problems.append("%s case file %s not under %s" % (kind, f["case_file"], crashing))
        print("FIRST_FILE=" + (hits[0]["case_file"] if hits else ""))
    print("SUMMARY=cases_run %d, passed %d, failed %d, unsupported %d, findings %d (%s), wall %.1f s, complete %s" %
          (s["cases_run"], s["passed"], s["failed"], s["unsupported"], len(r["findings"]), ",".join(kinds) or "-",
           s["wall_s"], s.get("complete")))
    for p in problems:
        print("PROBLEM=" + p)

def cmd_caselog(args):
    """caselog LOG CASES_RUN MAX_CANCELLED: case numbers unique, as many as cases_run, and every
    number up to the highest present but at most MAX_CANCELLED (the cases in flight at the budget)."""
    log, cases_run, max_cancelled = args[0], int(args[1]), int(args[2])
    numbers = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                numbers.append(json.loads(line)["number"])
    fresh = [n for n in numbers if n > 0]
    problems = []
    if len(numbers) != cases_run:
        problems.append("case log has %d cases, report cases_run %d" % (len(numbers), cases_run))
    if len(set(fresh)) != len(fresh):
        problems.append("case numbers repeated")
    top = max(fresh) if fresh else 0
    missing = sorted(set(range(1, top + 1)) - set(fresh))
    if len(missing) > max_cancelled:
        problems.append("%d case numbers below %d never reported (%s...)" % (len(missing), top, missing[:10]))
    print("CASELOG=%d cases logged, highest number %d, %d missing below it (cancelled at the budget: %s)" %
          (len(numbers), top, len(missing), missing))
    for p in problems:
        print("PROBLEM=" + p)

def cmd_json(args):
    """json CORPUS: every case file parses; prints the hidden temporaries left over."""
    cases, hidden = case_files(args[0])
    bad = []
    for p in cases:
        try:
            load(p)
        except Exception as e:  # noqa: BLE001 - any failure is a finding here
            bad.append("%s: %s" % (p, e))
    print("CORPUS=%s: %d case files, all JSON: %s; %d hidden write temporaries" %
          (args[0], len(cases), "no" if bad else "yes", len(hidden)))
    for p in bad:
        print("PROBLEM=not JSON: " + p)

def cmd_list(args):
    """list CORPUS: the case files, one a line."""
    for p in case_files(args[0])[0]:
        print(p)

def canon(spec):
    return json.dumps(spec, sort_keys=True)

def cmd_leftovers(args):
    """leftovers SNAPSHOT_DIR CASELOG REPORT WORKERS: every snapshot in-flight case is rerun
    (number 0) among the first cases of the follow-up run; a failing one is in a finding."""
    snap_dir, log, report, workers = args[0], args[1], args[2], int(args[3])
    snaps = []
    for n in sorted(os.listdir(snap_dir)):
        try:
            snaps.append(canon(load(os.path.join(snap_dir, n))["spec"]))
        except Exception as e:  # noqa: BLE001
            print("PROBLEM=in-flight file %s of the killed run unreadable: %s" % (n, e))
    lines = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                lines.append(json.loads(line))
    rerun = [(i, l) for i, l in enumerate(lines) if l["number"] == 0]
    rerun_specs = [canon(l["spec"]) for _, l in rerun]
    problems = []
    for s in snaps:
        if s not in rerun_specs:
            problems.append("in-flight case of the killed run not rerun")
    positions = [i for i, _ in rerun]
    failing = [l for _, l in rerun if l["verdict"] not in ("pass", "unsupported")]
    r = load(report)
    if failing:
        if not r["findings"] or r["summary"]["failed"] < len(failing):
            problems.append("%d failing leftovers but %d findings, %d failed" %
                            (len(failing), len(r["findings"]), r["summary"]["failed"]))
        for f in r["findings"]:
            if not os.path.isfile(f["case_file"]):
                problems.append("finding file missing: " + f["case_file"])
    print("LEFTOVERS=%d in flight at the kill, %d rerun, %d failed again (%s), follow-up findings %d, "
          "positions in the case log %s" % (len(snaps), len(rerun), len(failing),
                                            ",".join(sorted({l["verdict"] for l in failing})) or "-",
                                            len(r["findings"]), positions))
    for p in problems:
        print("PROBLEM=" + p)

def cmd_crashing(args):
    """crashing CORPUS: per crashing/ file its recorded verdict fault (or '-'), tab-separated."""
    d = os.path.join(args[0], "crashing")
    if not os.path.isdir(d):
        return
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        if n.startswith(".") or not n.endswith(".json"):
            continue
        try:
            v = load(p).get("verdict", {})
            print("%s\t%s\t%s\t%s" % (p, v.get("kind"), v.get("fault") or "-", load(p)["provenance"]["campaign_seed"]))
        except Exception as e:  # noqa: BLE001
            print("%s\tunreadable\t-\t-\t%s" % (p, e))

def cmd_mutate_summary(args):
    """mutate-summary RESULTS MANIFEST: the violations, with the mutation of each file."""
    manifest = {}
    with open(args[1], encoding="utf-8") as f:
        next(f)
        for line in f:
            parts = line.rstrip("\n").split("\t")
            manifest[parts[0]] = parts
    rows = []
    with open(args[0], encoding="utf-8") as f:
        for line in f:
            name, rc, wall, rss, flags = line.rstrip("\n").split("\t")
            rows.append((name, int(rc), float(wall) if wall != "-" else None, int(rss) if rss != "-" else None, flags))
    from collections import Counter
    codes = Counter(r[1] for r in rows)
    walls = sorted(r[2] for r in rows if r[2] is not None)
    rss = [r[3] for r in rows if r[3] is not None]
    print("MUTATE_FILES=%d" % len(rows))
    print("MUTATE_EXITS=" + ", ".join("%d: %d" % (k, v) for k, v in sorted(codes.items())))
    if walls:
        print("MUTATE_WALL=median %.2f s, p99 %.2f s, max %.2f s" %
              (walls[len(walls) // 2], walls[min(len(walls) - 1, int(len(walls) * 0.99))], walls[-1]))
    if rss:
        print("MUTATE_MAXRSS=%.0f MiB (largest process of one replay)" % (max(rss) / 1024))
    for name, rc, wall, r, flags in rows:
        bad = []
        if rc not in (0, 1, 2):
            bad.append("exit %d%s" % (rc, " (timeout)" if rc == 124 else " (signal %d)" % (rc - 128) if rc > 128 else ""))
        if flags:
            bad.append(flags)
        if bad:
            m = manifest.get(name, [name, "?", "?", "?"])
            print("VIOLATION=%s\t%s\tfrom %s\t%s" % (name, "; ".join(bad), m[1], m[2]))

if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1].replace("-", "_")](sys.argv[2:])
PY
py() { python3 "$CHECK" "$@"; }
# Prints a helper's lines; its PROBLEM= lines become failures prefixed with $1.
report_problems() {
  local prefix=$1 line
  shift
  while IFS= read -r line; do
    case $line in
      PROBLEM=*) fail "$prefix: ${line#PROBLEM=}" ;;
      *) [[ -n ${QUIET:-} ]] || echo "  $line" ;;
    esac
  done < <("$@")
}

# Peak RSS (VmHWM, KiB) of every process of the tree under $1, polled until $1 exits; writes
# "pid role max_hwm_kib" lines to $2 (role: the gradfuzz subcommand).
poll_hwm() {
  local root=$1 out=$2
  declare -A peak role
  local pids p hwm
  while kill -0 "$root" 2>/dev/null; do
    pids=$root
    local frontier=$root
    while [[ -n $frontier ]]; do
      local next=""
      for p in $frontier; do next+=" $(pgrep -P "$p" | tr '\n' ' ' || true)"; done
      frontier=$(echo $next)
      pids+=" $frontier"
    done
    for p in $pids; do
      hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
      [[ -n $hwm ]] || continue
      if [[ -z ${peak[$p]:-} || $hwm -gt ${peak[$p]} ]]; then peak[$p]=$hwm; fi
      if [[ -z ${role[$p]:-} ]]; then
        role[$p]=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^(fuzz|worker|replay|selftest)$/) {print $i; exit}}' || true)
      fi
    done
    sleep 0.5
  done
  : >"$out"
  for p in "${!peak[@]}"; do echo "$p ${role[$p]:-other} ${peak[$p]}" >>"$out"; done
}
max_role() { awk -v r="$2" '$2 == r && $3 > m {m = $3} END {print m + 0}' "$1"; }

# ------------------------------------------------------------------------------------------------
stage_time() {
  echo "== time: $TIME_WORKERS workers, --time $TIME_S, one run per injected fault"
  local dir=$WORK/time fault kind start wall rc out first
  rm -rf "$dir"
  mkdir -p "$dir"
  for fault in crash-segfault crash-abort hang; do
    kind=crash
    [[ $fault == hang ]] && kind=timeout
    local d=$dir/$fault
    mkdir -p "$d"
    start=$(now)
    rc=0
    "${G[@]}" fuzz --workers "$TIME_WORKERS" --time "$TIME_S" --fault "$fault" --seed 1 --corpus "$d/corpus" \
      --report "$d/report.json" --case-log "$d/cases.jsonl" --quiet 2>"$d/stderr" || rc=$?
    wall=$(since "$start")
    echo "  $fault: exit $rc, wall $wall s (budget $TIME_S s)"
    le "$wall" "$((TIME_S + 10))" && ok "$fault: ended within $((TIME_S + 10)) s" ||
      fail "time/$fault: wall $wall s > $((TIME_S + 10)) s"
    [[ $rc == 1 ]] || fail "time/$fault: exit $rc (expected 1: findings)"
    [[ -s $d/report.json ]] || { fail "time/$fault: no report"; continue; }
    out=$(py report "$d/report.json" "$kind" "$d/corpus")
    report_problems "time/$fault" printf '%s\n' "$out"
    first=$(sed -n 's/^FIRST_FILE=//p' <<<"$out")
    if [[ -n $first && -f $first ]]; then
      rc=0
      "${G[@]}" replay "$first" --fault "$fault" --case-timeout 5 >"$d/replay.out" 2>&1 || rc=$?
      if [[ $rc == 1 ]] && grep -q "FAIL $kind " "$d/replay.out"; then
        ok "$fault: $first reproduces as $kind"
      else
        fail "time/$fault: $first does not reproduce as $kind (exit $rc: $(tail -1 "$d/replay.out"))"
      fi
    fi
    local cases_run
    cases_run=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['summary']['cases_run'])" "$d/report.json")
    report_problems "time/$fault" py caselog "$d/cases.jsonl" "$cases_run" "$TIME_WORKERS"
  done
  echo "  selftest --faults crash-segfault,crash-abort,hang --workers $TIME_WORKERS"
  start=$(now)
  rc=0
  "${G[@]}" selftest --faults crash-segfault,crash-abort,hang --workers "$TIME_WORKERS" --corpus "$dir/selftest" \
    --report "$dir/selftest.json" >"$dir/selftest.out" 2>&1 || rc=$?
  wall=$(since "$start")
  python3 - "$dir/selftest.json" <<'PY' | sed 's/^/  /'
import json, sys
r = json.load(open(sys.argv[1]))
for e in r.get("selftest", []):
    print("selftest %s: detected %s after %s cases, file %s" % (e.get("name"), e.get("detected"), e.get("cases_to_detect"), e.get("case_file")))
PY
  [[ $rc == 0 ]] && ok "selftest detected all three (wall $wall s)" || fail "time/selftest: exit $rc (wall $wall s)"
}

# ------------------------------------------------------------------------------------------------
stage_rss() {
  echo "== rss: fuzz --workers 1, --cases $RSS_SMALL and --cases $RSS_LARGE"
  local dir=$WORK/rss n pid rc start wall
  rm -rf "$dir"
  mkdir -p "$dir"
  declare -A sup wrk tot
  for n in "$RSS_SMALL" "$RSS_LARGE"; do
    start=$(now)
    "${NICE_CMD[@]}" /usr/bin/time -v -o "$dir/time-$n.txt" "$GRADFUZZ" fuzz --workers 1 --cases "$n" --seed 1 \
      --corpus "$dir/corpus-$n" --report "$dir/report-$n.json" --quiet 2>"$dir/stderr-$n" &
    pid=$!
    poll_hwm "$pid" "$dir/hwm-$n.txt"
    rc=0
    wait "$pid" || rc=$?
    wall=$(since "$start")
    [[ $rc == 0 || $rc == 1 ]] || fail "rss/$n: exit $rc"
    sup[$n]=$(max_role "$dir/hwm-$n.txt" fuzz)
    wrk[$n]=$(max_role "$dir/hwm-$n.txt" worker)
    tot[$n]=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$dir/time-$n.txt")
    echo "  --cases $n: wall $wall s, supervisor $((sup[$n] / 1024)) MiB, worker $((wrk[$n] / 1024)) MiB," \
      "/usr/bin/time max $((tot[$n] / 1024)) MiB, workers seen $(awk '$2 == "worker"' "$dir/hwm-$n.txt" | wc -l)"
    report_problems "rss/$n" py report "$dir/report-$n.json"
  done
  local what
  for what in supervisor worker time; do
    local a b
    case $what in
      supervisor) a=${sup[$RSS_SMALL]}; b=${sup[$RSS_LARGE]} ;;
      worker) a=${wrk[$RSS_SMALL]}; b=${wrk[$RSS_LARGE]} ;;
      time) a=${tot[$RSS_SMALL]}; b=${tot[$RSS_LARGE]} ;;
    esac
    local ratio
    ratio=$(python3 -c "import sys; print('%.3f' % (int(sys.argv[2]) / max(1, int(sys.argv[1]))))" "$a" "$b")
    if le "$ratio" 1.2 && [[ $a -gt 0 ]]; then
      ok "$what peak RSS $RSS_LARGE / $RSS_SMALL = $ratio (<= 1.2)"
    else
      fail "rss/$what: peak RSS $RSS_LARGE / $RSS_SMALL = $ratio ($b / $a KiB)"
    fi
  done
}

# ------------------------------------------------------------------------------------------------
replay_one() {
  # $1: a case file. Writes "name rc wall maxrss_kib flags" to $RES/name.
  local f=$1 name rc wall rss flags=""
  name=$(basename "$f")
  rc=0
  /usr/bin/time -o "$RES/$name.time" -f "%e %M" timeout -k 1 "$MUTATE_TIMEOUT_S" \
    prlimit --as="$AS_LIMIT" "$GRADFUZZ" replay "$f" >"$RES/$name.out" 2>&1 || rc=$?
  read -r wall rss < <(grep -E '^[0-9.]+ [0-9]+$' "$RES/$name.time" || echo "- -")
  # A worker killed by a signal or hung on a case file is gradfuzz's own failure too.
  if grep -qE '^FAIL (crash|timeout) ' "$RES/$name.out"; then flags=$(grep -oE '^FAIL (crash|timeout)' "$RES/$name.out" | head -1 | tr ' ' '-'); fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "${wall:--}" "${rss:--}" "$flags" >"$RES/$name.res"
}

stage_mutate() {
  echo "== mutate: $MUTATE_COUNT mutated case files, timeout ${MUTATE_TIMEOUT_S}s, $MUTATE_MEM_BYTES bytes above the idle peak"
  local dir=$WORK/mutate pid
  rm -rf "$dir"
  mkdir -p "$dir/res"
  "${NICE_CMD[@]}" python3 "$ROOT/scripts/mutate_cases.py" --src "$ROOT/corpus/regression" --out "$dir/cases" \
    --count "$MUTATE_COUNT" --seed "$MUTATE_SEED"
  # Address space of an idle gradfuzz (libtorch and its CUDA libraries mapped): the peak of a
  # short campaign's supervisor and worker, polled.
  "${G[@]}" fuzz --workers 1 --cases 1000000 --corpus "$dir/idle" --quiet 2>/dev/null &
  pid=$!
  local base=0 rss=0 i p v h
  for i in $(seq 1 16); do
    sleep 0.25
    for p in $pid $(pgrep -P "$pid" || true); do
      v=$(awk '/^VmPeak:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      h=$(awk '/^VmHWM:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      [[ ${v:-0} -gt $base ]] && base=$v
      [[ ${h:-0} -gt $rss ]] && rss=$h
    done
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  AS_LIMIT=$((base * 1024 + MUTATE_MEM_BYTES))
  echo "  idle process: VmPeak $((base / 1024)) MiB, VmHWM $((rss / 1024)) MiB -> prlimit --as=$AS_LIMIT ($((AS_LIMIT >> 20)) MiB)"
  RES=$dir/res
  export RES AS_LIMIT GRADFUZZ MUTATE_TIMEOUT_S
  export -f replay_one
  local files=("$dir"/cases/m*.json) start first=20
  start=$(now)
  printf '%s\n' "${files[@]:0:$first}" | "${NICE_CMD[@]}" xargs -P "$MUTATE_JOBS" -n 1 bash -c 'replay_one "$1"' _
  local took
  took=$(since "$start")
  echo "  first $first files: $took s -> expected $(python3 -c "import sys; print('%.0f' % (float(sys.argv[1]) / int(sys.argv[2]) * int(sys.argv[3])))" "$took" "$first" "${#files[@]}") s for ${#files[@]}"
  printf '%s\n' "${files[@]:$first}" | "${NICE_CMD[@]}" xargs -P "$MUTATE_JOBS" -n 1 bash -c 'replay_one "$1"' _
  echo "  all ${#files[@]} files: $(since "$start") s"
  cat "$dir"/res/*.res | sort >"$dir/results.tsv"
  local out line name
  out=$(py mutate-summary "$dir/results.tsv" "$dir/cases/manifest.tsv")
  grep -v '^VIOLATION=' <<<"$out" | sed 's/^/  /'
  # Exit-2 messages that do not name the file (the issue asks for the file and the JSON path).
  echo "  exit-2 messages not naming the file: $(awk -F'\t' '$2 == 2 {print $1}' "$dir/results.tsv" |
    while read -r name; do grep -q "$name" "$dir/res/$name.out" || echo "$name"; done | wc -l)"
  local nbad=0
  while IFS= read -r line; do
    [[ $line == VIOLATION=* ]] || continue
    nbad=$((nbad + 1))
    line=${line#VIOLATION=}
    name=${line%%$'\t'*}
    mkdir -p "$BAD_DIR"
    cp "$dir/cases/$name" "$BAD_DIR/"
    cp "$dir/res/$name.out" "$BAD_DIR/$name.out"
    printf '%s\n' "$line" >>"$BAD_DIR/violations.tsv"
    fail "mutate: $line | $(tail -c 300 "$dir/res/$name.out" | tr '\n' ' ')"
  done <<<"$out"
  [[ $nbad == 0 ]] && ok "all ${#files[@]} files: exit 0/1/2 within ${MUTATE_TIMEOUT_S}s, no signal, no exit 3" ||
    echo "  $nbad violating files kept in $BAD_DIR"
}

# ------------------------------------------------------------------------------------------------
# Every case file of corpus $2 is JSON and loads (one replay; exit 0/1, per file on 2/3).
check_corpus() {
  local prefix=$1 corpus=$2 files rc f
  [[ -d $corpus ]] || return 0
  QUIET=1 report_problems "$prefix" py json "$corpus"
  mapfile -t files < <(py list "$corpus")
  [[ ${#files[@]} -gt 0 ]] || return 0
  rc=0
  "${G[@]}" replay "${files[@]}" --case-timeout 10 >"$corpus.replay" 2>&1 || rc=$?
  if [[ $rc != 0 && $rc != 1 ]]; then
    for f in "${files[@]}"; do
      rc=0
      "${G[@]}" replay "$f" --case-timeout 10 >"$corpus.replay1" 2>&1 || rc=$?
      [[ $rc == 0 || $rc == 1 ]] || fail "$prefix: replay $f exits $rc: $(tail -1 "$corpus.replay1")"
    done
  fi
}

descendants() { pgrep -P "$1" 2>/dev/null | tr '\n' ' ' || true; }
# A live process (a zombie waiting for its reaper is not).
alive() { [[ -e /proc/$1 && $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || echo Z) != Z ]]; }

# After a run on corpus $2 ended abruptly (trial $1): snapshot its in-flight files, check the
# corpus, run the next fuzz on it and check that every in-flight case was rerun (and, when it
# failed again, became a finding) and that nothing is left in inflight/.
followup() {
  local t=$1 d=$2 rc out nf
  mkdir -p "$d/snapshot"
  cp "$d/corpus/inflight/"*.json "$d/snapshot/" 2>/dev/null || true
  n_leftovers=$((n_leftovers + $(find "$d/snapshot" -type f | wc -l)))
  n_tmp=$((n_tmp + $(find "$d/corpus" -name '.*' -type f 2>/dev/null | wc -l || true)))
  check_corpus "kill/t$t" "$d/corpus"
  rc=0
  "${G[@]}" fuzz --workers 2 --fault scale-bias-grad --cases 20 --seed $((t + 1000)) --corpus "$d/corpus" \
    --report "$d/report2.json" --case-log "$d/cases2.jsonl" --quiet 2>"$d/stderr2" || rc=$?
  [[ $rc == 0 || $rc == 1 ]] || fail "kill/t$t: follow-up fuzz exit $rc ($(tail -1 "$d/stderr2"))"
  out=$(py leftovers "$d/snapshot" "$d/cases2.jsonl" "$d/report2.json" 2 || echo "PROBLEM=follow-up run unreadable")
  echo "$out" >"$d/leftovers.txt"
  QUIET=1 report_problems "kill/t$t" printf '%s\n' "$out"
  nf=$(sed -n 's/^LEFTOVERS=.* rerun, \([0-9]*\) failed again.*/\1/p' <<<"$out")
  n_left_failed=$((n_left_failed + ${nf:-0}))
  if grep -q 'unreadable' "$d/stderr2"; then fail "kill/t$t: $(grep unreadable "$d/stderr2")"; fi
  if [[ -n $(ls -A "$d/corpus/inflight" 2>/dev/null) ]]; then
    fail "kill/t$t: in-flight files left after the follow-up run: $(ls "$d/corpus/inflight" | tr '\n' ' ')"
  fi
  QUIET=1 report_problems "kill/t$t" py report "$d/report2.json"
  check_corpus "kill/t$t" "$d/corpus"
}

stage_kill() {
  echo "== kill: $KILL_TRIALS trials of kill -9 (worker or supervisor) during fuzz --workers 2 --fault scale-bias-grad"
  local dir=$WORK/kill t p
  rm -rf "$dir"
  mkdir -p "$dir"
  RANDOM=$KILL_SEED
  local n_worker=0 n_super=0 n_restart=0 n_crash_found=0 n_startup=0 before
  n_leftovers=0 n_left_failed=0 n_tmp=0
  for ((t = 1; t <= KILL_TRIALS; t++)); do
    local d=$dir/t$t target delay pid victim workers rc note=""
    mkdir -p "$d"
    # $RANDOM read here, not in a $(...) subshell (bash reseeds it there): KILL_SEED fixes the trials.
    local r1=$RANDOM r2=$RANDOM
    delay=$(python3 -c "import sys; print('%.2f' % (0.5 + (int(sys.argv[1]) % 4501) / 1000))" "$r1")
    target=supervisor
    [[ $((r2 % 2)) == 0 ]] && target=worker
    before=${#FAILURES[@]}
    "${G[@]}" fuzz --workers 2 --fault scale-bias-grad --cases 100000 --seed "$t" --corpus "$d/corpus" \
      --report "$d/report.json" --quiet 2>"$d/stderr" &
    pid=$!
    sleep "$delay"
    if ! kill -0 "$pid" 2>/dev/null; then
      fail "kill/t$t: the campaign ended before the kill ($(tail -1 "$d/stderr"))"
      continue
    fi
    if [[ $target == worker ]]; then
      n_worker=$((n_worker + 1))
      victim=""
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        for p in $(descendants "$pid"); do
          if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q ' worker '; then victim=$p; break; fi
        done
        [[ -n $victim ]] && break
        sleep 0.1
      done
      if [[ -z $victim ]]; then
        fail "kill/t$t: no worker process found"
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" || true
        continue
      fi
      kill -9 "$victim" 2>/dev/null || true
      sleep 3
      workers=$(for p in $(descendants "$pid"); do tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q ' worker ' && echo "$p"; done | tr '\n' ' ' || true)
      local running=no
      if kill -0 "$pid" 2>/dev/null && [[ -n $workers ]] && ! grep -qw "$victim" <<<"$workers"; then
        running=yes
        n_restart=$((n_restart + 1))
      fi
      kill -TERM "$pid" 2>/dev/null || true
      rc=0
      timeout 60 tail --pid="$pid" -f /dev/null || { fail "kill/t$t: no exit 60 s after SIGTERM"; kill -9 "$pid"; }
      wait "$pid" || rc=$?
      if [[ $running == no && $rc == 2 ]] && grep -q 'before it was ready' "$d/stderr" &&
        ! python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get('summary') else 1)" "$d/report.json" 2>/dev/null; then
        # Killed while the campaign's first workers started: the run refuses to start (exit 2,
        # the backend in doubt) before any case ran; there is nothing to lose.
        n_startup=$((n_startup + 1))
        note="(killed while the first workers started: exit 2 before any case, $(tail -1 "$d/stderr" | cut -c1-90))"
        [[ ! -d $d/corpus/inflight || -z $(ls -A "$d/corpus/inflight") ]] || fail "kill/t$t: in-flight files left by the refused start"
      else
        [[ $running == yes ]] || fail "kill/t$t: after killing worker $victim the campaign has workers [$workers] (supervisor alive: $(kill -0 "$pid" 2>/dev/null && echo yes || echo no))"
        [[ $rc == 0 || $rc == 1 ]] || fail "kill/t$t: exit $rc after SIGTERM ($(tail -1 "$d/stderr"))"
        report_problems "kill/t$t" py report "$d/report.json" >"$d/report.check"
        grep 'FAIL' "$d/report.check" || true
        if grep -q 'crash' <<<"$(sed -n 's/.*findings [0-9]* (\([^)]*\)).*/\1/p' "$d/report.check")"; then
          n_crash_found=$((n_crash_found + 1))
        fi
        if [[ -n $(ls -A "$d/corpus/inflight" 2>/dev/null) ]]; then
          fail "kill/t$t: in-flight files left after SIGTERM: $(ls "$d/corpus/inflight" | tr '\n' ' ')"
          followup "$t" "$d"  # are they at least rerun by the next campaign?
        else
          check_corpus "kill/t$t" "$d/corpus"
        fi
      fi
    else
      n_super=$((n_super + 1))
      workers=$(descendants "$pid")
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      # Workers die with it (PR_SET_PDEATHSIG; one still loading libtorch exits when it finds
      # its pipe closed).
      local waited
      for p in $workers; do
        waited=0
        while alive "$p" && [[ $waited -lt 50 ]]; do sleep 0.1; waited=$((waited + 1)); done
        if alive "$p"; then fail "kill/t$t: worker $p alive 5 s after its supervisor was killed"; fi
      done
      if [[ -f $d/report.json ]]; then
        python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$d/report.json" 2>/dev/null ||
          fail "kill/t$t: the report of the killed run is not JSON"
      fi
      followup "$t" "$d"
    fi
    if [[ -z $note && -f $d/leftovers.txt ]]; then
      note=$(sed -n 's/^LEFTOVERS=/(/p' "$d/leftovers.txt" | sed 's/, positions.*/)/')
    fi
    echo "  trial $t: kill -9 $target after $delay s: $([[ ${#FAILURES[@]} == "$before" ]] && echo ok || echo FAILED) $note"
  done
  echo "  worker kills $n_worker (worker restarted and the run went on: $n_restart; killed case recorded as a crash finding: $n_crash_found;" \
    "killed while the first workers started, run refused with exit 2 before any case: $n_startup)"
  echo "  supervisor kills $n_super (in-flight files left: $n_leftovers, all rerun by the next fuzz; failed again and became findings: $n_left_failed; hidden write temporaries left: $n_tmp)"
}

# ------------------------------------------------------------------------------------------------
stage_concurrent() {
  echo "== concurrent: two campaigns on one corpus for ${CONCURRENT_S}s (seed 11 no fault, seed 22 --fault crash-abort) + short campaigns started meanwhile"
  local dir=$WORK/concurrent c pa pb rc i
  rm -rf "$dir"
  mkdir -p "$dir"
  c=$dir/corpus
  "${G[@]}" fuzz --workers 1 --time "$CONCURRENT_S" --seed 11 --corpus "$c" --report "$dir/a.json" --quiet 2>"$dir/a.err" &
  pa=$!
  "${G[@]}" fuzz --workers 1 --time "$CONCURRENT_S" --seed 22 --fault crash-abort --corpus "$c" --report "$dir/b.json" \
    --quiet 2>"$dir/b.err" &
  pb=$!
  # Further starts while both live: each scans inflight/ for leftovers at its start.
  local short_runs=$((CONCURRENT_S / 12))
  for ((i = 1; i <= short_runs; i++)); do
    sleep 5
    rc=0
    "${G[@]}" fuzz --workers 1 --cases 30 --seed $((100 + i)) --corpus "$c" --report "$dir/s$i.json" --quiet \
      2>"$dir/s$i.err" || rc=$?
    [[ $rc == 0 || $rc == 1 ]] || fail "concurrent/short$i: exit $rc"
    if grep -q 'in flight when an earlier run ended abruptly' "$dir/s$i.err"; then
      fail "concurrent/short$i took a live campaign's in-flight file: $(cat "$dir/s$i.err")"
    fi
  done
  rc=0
  wait "$pa" || rc=$?
  [[ $rc == 0 || $rc == 1 ]] || fail "concurrent/a: exit $rc"
  rc=0
  wait "$pb" || rc=$?
  [[ $rc == 1 ]] || fail "concurrent/b: exit $rc (expected 1: crash findings)"
  for r in a b $(seq -f 's%g' 1 "$short_runs"); do
    echo "  campaign $r:"
    if [[ $r == b ]]; then
      report_problems "concurrent/$r" py report "$dir/$r.json" crash "$c"
    else
      report_problems "concurrent/$r" py report "$dir/$r.json"
    fi
  done
  if grep -h 'in flight when an earlier run ended abruptly' "$dir/a.err" "$dir/b.err"; then
    fail "concurrent: a campaign took the other's live in-flight file"
  fi
  local crash_a
  crash_a=$(python3 -c "import json,sys; print(sum(f['kind'] == 'crash' for f in json.load(open(sys.argv[1]))['findings']))" "$dir/a.json")
  [[ $crash_a == 0 ]] || fail "concurrent/a: $crash_a crash findings in the campaign without a fault"
  # False crashes: a crashing/ file that does not reproduce with the fault it records.
  local file kind fault seed nfiles=0 nfalse=0
  while IFS=$'\t' read -r file kind fault seed; do
    nfiles=$((nfiles + 1))
    rc=0
    if [[ $fault == - ]]; then
      "${G[@]}" replay "$file" --case-timeout 10 >"$dir/replay.out" 2>&1 || rc=$?
    else
      "${G[@]}" replay "$file" --fault "$fault" --case-timeout 10 >"$dir/replay.out" 2>&1 || rc=$?
    fi
    if [[ $rc != 1 ]] || ! grep -q "^FAIL $kind " "$dir/replay.out"; then
      nfalse=$((nfalse + 1))
      fail "concurrent: false crash $file (verdict $kind, fault $fault, campaign seed $seed): replay exit $rc: $(tail -1 "$dir/replay.out")"
    fi
  done < <(py crashing "$c")
  echo "  crashing/ files: $nfiles, false crashes: $nfalse"
  if [[ -n $(ls -A "$c/inflight" 2>/dev/null) ]]; then fail "concurrent: in-flight files left: $(ls "$c/inflight")"; fi
  check_corpus "concurrent" "$c"
}

# ------------------------------------------------------------------------------------------------
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(time rss mutate kill concurrent)
echo "nightly-acceptance: $GRADFUZZ ($("$GRADFUZZ" --help >/dev/null 2>&1 && echo ok)), work $WORK, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for s in "${STAGES[@]}"; do
  case $s in
    time | rss | mutate | kill | concurrent)
      stage_start=$(now)
      "stage_$s"
      echo "  ($s: $(since "$stage_start") s)"
      ;;
    *) echo "nightly-acceptance: unknown stage '$s' (time, rss, mutate, kill, concurrent)" >&2; exit 2 ;;
  esac
done
echo
if [[ ${#FAILURES[@]} -gt 0 ]]; then
  echo "nightly-acceptance: ${#FAILURES[@]} criteria not met:"
  printf '  %s\n' "${FAILURES[@]}"
  exit 1
fi
echo "nightly-acceptance: all criteria met (${STAGES[*]})"
