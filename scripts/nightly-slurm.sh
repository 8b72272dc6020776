#!/usr/bin/env bash
# Nightly gradfuzz on a Slurm cluster: a job array runs the N shards of one campaign (one
# array task per GPU or host, `gradfuzz fuzz --shard i/N`, same seed), then a job that
# depends on the whole array (afterany: it runs even when a shard failed or hit its time
# limit) merges their reports, compares the merged report with the last night's, and writes
# JUnit XML and an HTML page for the CI dashboard.
#
#   scripts/nightly-slurm.sh          submit tonight's jobs (on a login node); prints the job ids
#   scripts/nightly-slurm.sh shard F  (an array task) run shard SLURM_ARRAY_TASK_ID+1 of N
#   scripts/nightly-slurm.sh merge F  (the dependent job) merge, diff, publish
# F is the night's settings file, written at submission. This script, GRADFUZZ_BIN and
# NIGHTLY_DIR must be on a file system every node sees.
#
# Settings, from the environment [default]:
#   GRADFUZZ_BIN           the gradfuzz executable [<repo>/build/tools/gradfuzz]
#   NIGHTLY_DIR            output root [<repo>/gradfuzz-nightly]
#   NIGHTLY_NAME           tonight's folder under NIGHTLY_DIR [UTC date, 2026-12-01]
#   NIGHTLY_LAST           the last night's merged report, to diff against [NIGHTLY_DIR/last.json]
#   NIGHTLY_SHARDS         array tasks, one per GPU or host [2]
#   NIGHTLY_PARTITION      Slurm partition [the cluster's default]
#   NIGHTLY_ACCOUNT        Slurm account [none]
#   NIGHTLY_GPUS_PER_TASK  GPUs per array task (--gres=gpu:G) [1 with GRADFUZZ_DEVICE=cuda, else 0]
#   NIGHTLY_CPUS_PER_TASK  CPUs per array task [4]
#   NIGHTLY_MEM            memory per array task (--mem) [the partition's default]
#   NIGHTLY_TIME           time limit per array task [01:15:00]; at the limit Slurm sends
#                          SIGTERM and the shard writes its partial report (complete: false)
#   NIGHTLY_MERGE_TIME     time limit of the merge job [00:15:00]
#   NIGHTLY_SBATCH_ARGS    more sbatch arguments for both jobs (e.g. "--exclusive": one task
#                          per host) [none]
#   NIGHTLY_WAIT           1: wait for the merge job and exit with its status (sbatch --wait) [0]
#   GRADFUZZ_SEED          campaign seed, one for all shards [the UTC date, 20261201]
#   GRADFUZZ_CASES         cases per shard [unset: a time budget]
#   GRADFUZZ_TIME_S        seconds per shard when GRADFUZZ_CASES is unset [3600]
#   GRADFUZZ_BACKEND       model, te or torch [model]
#   GRADFUZZ_DEVICE        cpu, cuda or auto [cuda]
#   GRADFUZZ_WORKERS       worker processes per shard [NIGHTLY_CPUS_PER_TASK]
#   GRADFUZZ_CORPUS        corpus shared by every shard and night [NIGHTLY_DIR/corpus]
#   GRADFUZZ_FUZZ_ARGS     more `gradfuzz fuzz` arguments ("--dtypes float32 --shapes mix") [none]
#
# Tonight's folder NIGHTLY_DIR/NIGHTLY_NAME holds: shard-<i>.json (each shard's report) and
# shard-<i>.exit (its gradfuzz exit status), logs/ (Slurm output), merged.json,
# merged.junit.xml, merged.html, diff.txt and diff.json (against NIGHTLY_LAST). After a
# good merge, merged.json is copied to NIGHTLY_DIR/last.json for tomorrow's diff.
# Exit status of the merge job: that of `gradfuzz report diff` (1: a cluster is new
# tonight, 0: none is), 2 or 3 when the merge or diff failed.
set -euo pipefail

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
repo="$(cd "$(dirname "$self")/.." && pwd)"

log() { printf '[nightly] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 2
}

# --- submit ------------------------------------------------------------------------------
submit() {
  local bin="${GRADFUZZ_BIN:-$repo/build/tools/gradfuzz}"
  local root="${NIGHTLY_DIR:-$repo/gradfuzz-nightly}"
  local name="${NIGHTLY_NAME:-$(date -u +%Y-%m-%d)}"
  local shards="${NIGHTLY_SHARDS:-2}"
  local device="${GRADFUZZ_DEVICE:-cuda}"
  local gpus_default=0
  [ "$device" = cuda ] && gpus_default=1
  local gpus="${NIGHTLY_GPUS_PER_TASK:-$gpus_default}"
  local cpus="${NIGHTLY_CPUS_PER_TASK:-4}"

  [[ "$shards" =~ ^[1-9][0-9]*$ ]] || die "NIGHTLY_SHARDS: expected a positive count, got '$shards'"
  [[ "$gpus" =~ ^[0-9]+$ ]] || die "NIGHTLY_GPUS_PER_TASK: expected a count, got '$gpus'"
  [[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "NIGHTLY_CPUS_PER_TASK: expected a positive count, got '$cpus'"
  [ -x "$bin" ] || die "GRADFUZZ_BIN: '$bin' is not an executable (build gradfuzz, or point GRADFUZZ_BIN at it)"
  command -v sbatch >/dev/null || die "sbatch not found: run this on a Slurm login node"
  bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
  mkdir -p "$root"
  root="$(cd "$root" && pwd)"
  local run_dir="$root/$name"
  mkdir -p "$run_dir/logs"
  # A rerun of a night starts clean: stale shard reports would be merged into it.
  rm -f "$run_dir"/shard-*.json "$run_dir"/shard-*.exit "$run_dir"/merged.* "$run_dir"/diff.*

  # Everything the jobs need, resolved now, in one file they source: values may hold
  # spaces and commas, which sbatch --export cannot carry.
  local settings="$run_dir/nightly.env"
  {
    printf 'bin=%q\n' "$bin"
    printf 'root=%q\n' "$root"
    printf 'run_dir=%q\n' "$run_dir"
    printf 'last=%q\n' "${NIGHTLY_LAST:-$root/last.json}"
    printf 'shards=%q\n' "$shards"
    printf 'gpus=%q\n' "$gpus"
    printf 'seed=%q\n' "${GRADFUZZ_SEED:-$(date -u +%Y%m%d)}"
    printf 'cases=%q\n' "${GRADFUZZ_CASES:-}"
    printf 'time_s=%q\n' "${GRADFUZZ_TIME_S:-3600}"
    printf 'backend=%q\n' "${GRADFUZZ_BACKEND:-model}"
    printf 'device=%q\n' "$device"
    printf 'workers=%q\n' "${GRADFUZZ_WORKERS:-$cpus}"
    printf 'corpus=%q\n' "${GRADFUZZ_CORPUS:-$root/corpus}"
    printf 'fuzz_args=%q\n' "${GRADFUZZ_FUZZ_ARGS:-}"
  } >"$settings"

  local common=()
  [ -n "${NIGHTLY_PARTITION:-}" ] && common+=(--partition="$NIGHTLY_PARTITION")
  [ -n "${NIGHTLY_ACCOUNT:-}" ] && common+=(--account="$NIGHTLY_ACCOUNT")
  local extra=()
  # Word splitting is the point: NIGHTLY_SBATCH_ARGS is a list of sbatch arguments.
  # shellcheck disable=SC2206
  [ -n "${NIGHTLY_SBATCH_ARGS:-}" ] && extra=(${NIGHTLY_SBATCH_ARGS})
  local task=(--nodes=1 --ntasks=1 --cpus-per-task="$cpus" --time="${NIGHTLY_TIME:-01:15:00}")
  [ "$gpus" -gt 0 ] && task+=(--gres="gpu:$gpus")
  [ -n "${NIGHTLY_MEM:-}" ] && task+=(--mem="$NIGHTLY_MEM")

  local array_id
  array_id="$(sbatch --parsable --job-name=gradfuzz-nightly --array="0-$((shards - 1))" \
    --output="$run_dir/logs/shard-%a.log" "${common[@]}" "${task[@]}" "${extra[@]}" \
    --wrap="exec bash $(printf %q "$self") shard $(printf %q "$settings")")"
  array_id="${array_id%%;*}"  # "id;cluster" on federated clusters
  log "array job $array_id: $shards shard(s) -> $run_dir"
  echo "array_job=$array_id"

  local wait=()
  [ "${NIGHTLY_WAIT:-0}" = 1 ] && wait=(--wait)
  local merge_id status=0
  # With --wait, sbatch prints the id, waits for the job and exits with its status.
  sbatch --parsable --job-name=gradfuzz-nightly-merge --dependency="afterany:$array_id" \
    --output="$run_dir/logs/merge.log" --nodes=1 --ntasks=1 --cpus-per-task=1 \
    --time="${NIGHTLY_MERGE_TIME:-00:15:00}" "${common[@]}" "${extra[@]}" "${wait[@]}" \
    --wrap="exec bash $(printf %q "$self") merge $(printf %q "$settings")" >"$run_dir/logs/merge.id" || status=$?
  merge_id="$(head -n1 "$run_dir/logs/merge.id")"
  merge_id="${merge_id%%;*}"
  [ -n "$merge_id" ] || die "submitting the merge job failed (sbatch exit $status)"
  log "merge job $merge_id (after array job $array_id)"
  echo "merge_job=$merge_id"
  if [ "${NIGHTLY_WAIT:-0}" = 1 ]; then
    log "merge job ended with status $status; see $run_dir/logs/merge.log"
    exit "$status"
  fi
}

# --- one array task: one shard ------------------------------------------------------------
# shellcheck disable=SC2154
run_shard() {
  local settings="$1"
  # shellcheck disable=SC1090
  source "$settings"
  [ -n "${SLURM_ARRAY_TASK_ID:-}" ] || die "shard: run as a Slurm array task (SLURM_ARRAY_TASK_ID is unset)"
  if [ -n "${SLURM_ARRAY_TASK_COUNT:-}" ] && [ "$SLURM_ARRAY_TASK_COUNT" != "$shards" ]; then
    die "shard: the array has $SLURM_ARRAY_TASK_COUNT tasks, the settings say $shards shards"
  fi
  local i=$((SLURM_ARRAY_TASK_ID + 1))
  local args=(fuzz --shard "$i/$shards" --seed "$seed" --backend "$backend" --device "$device"
    --workers "$workers" --corpus "$corpus" --report "$run_dir/shard-$i.json" --quiet)
  if [ -n "$cases" ]; then args+=(--cases "$cases"); else args+=(--time "$time_s"); fi
  if [ "$gpus" -gt 1 ]; then
    # Workers go round-robin over the task's GPUs (Slurm renumbers them from 0).
    args+=(--devices "$(seq -s, 0 $((gpus - 1)))")
  fi
  # shellcheck disable=SC2206
  [ -n "$fuzz_args" ] && args+=(${fuzz_args})
  log "shard $i/$shards on $(hostname): $bin ${args[*]}"
  # gradfuzz turns SIGTERM (Slurm's time limit) into a clean partial report; the shell
  # passes it on and waits for that report to be written.
  local pid status=0
  "$bin" "${args[@]}" &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
  wait "$pid" || status=$?
  if kill -0 "$pid" 2>/dev/null; then
    status=0
    wait "$pid" || status=$?
  fi
  echo "$status" >"$run_dir/shard-$i.exit"
  log "shard $i/$shards: gradfuzz exit $status"
  # 1 is "findings": the merge job's business, not a failed task.
  [ "$status" -le 1 ] && exit 0
  exit "$status"
}

# --- the dependent job: merge, diff, publish ----------------------------------------------
# The settings file sets bin, root, run_dir, last, shards and the campaign's values.
# shellcheck disable=SC2154
run_merge() {
  local settings="$1"
  # shellcheck disable=SC1090
  source "$settings"
  local inputs=() missing=()
  for ((i = 1; i <= shards; i++)); do
    if [ -s "$run_dir/shard-$i.json" ]; then inputs+=("$run_dir/shard-$i.json"); else missing+=("$i"); fi
    if [ -f "$run_dir/shard-$i.exit" ] && [ "$(cat "$run_dir/shard-$i.exit")" -gt 1 ]; then
      log "shard $i/$shards: gradfuzz exited $(cat "$run_dir/shard-$i.exit"); see $run_dir/logs/shard-$((i - 1)).log"
    fi
  done
  [ ${#missing[@]} -eq 0 ] || log "no report from shard(s) ${missing[*]} of $shards: the merged report is incomplete"
  [ ${#inputs[@]} -gt 0 ] || die "no shard wrote a report; see $run_dir/logs/"
  local status=0
  "$bin" report merge "$run_dir/merged.json" "${inputs[@]}" \
    --junit "$run_dir/merged.junit.xml" --html "$run_dir/merged.html" || status=$?
  [ "$status" -le 1 ] || {
    log "report merge failed (exit $status)"
    exit "$status"
  }
  status=0
  if [ -f "$last" ]; then
    "$bin" report diff "$last" "$run_dir/merged.json" --json "$run_dir/diff.json" >"$run_dir/diff.txt" || status=$?
    cat "$run_dir/diff.txt"
    [ "$status" -le 1 ] || {
      log "report diff failed (exit $status)"
      exit "$status"
    }
  else
    echo "no last night's report at $last: nothing to compare" | tee "$run_dir/diff.txt"
  fi
  # Tomorrow compares with tonight: replace last.json whole (copy, then rename).
  cp "$run_dir/merged.json" "$root/last.json.tmp-$$"
  mv -f "$root/last.json.tmp-$$" "$root/last.json"
  log "published $run_dir/merged.json as $root/last.json"
  exit "$status"
}

case "${1:-submit}" in
  submit) submit ;;
  shard) run_shard "${2:?shard: the settings file}" ;;
  merge) run_merge "${2:?merge: the settings file}" ;;
  -h | --help) sed -n '2,/^set -euo/p' "$self" | sed '$d' | sed 's/^# \{0,1\}//' ;;
  *) die "unknown mode '$1' (submit, shard or merge; --help)" ;;
esac
