#!/usr/bin/env bash
# End-to-end test of scripts/nightly-slurm.sh on a one-node Slurm cluster that this test
# starts and stops itself (slurmctld and slurmd as root on this host, MUNGE auth, a
# slurm.conf in a temporary directory, ports of its own so a real cluster is left alone).
# Three nights of a 2-shard CPU campaign (--backend model --device cpu):
#   night 1 with a fault: shards merged, findings in it, nothing to diff against, published;
#   night 2 without it: every cluster of night 1 is fixed, none is new (merge job exit 0);
#   night 3 with the fault again: its clusters are new against night 2 (merge job exit 1).
# Needs root and Debian's slurm-wlm and munge (scripts/ci-deps.sh installs them); a missing
# piece fails the test, it never skips. GRADFUZZ_EXECUTABLE: the gradfuzz binary (ctest sets it).
set -uo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${GRADFUZZ_EXECUTABLE:-$src/build/tools/gradfuzz}"
# A fault the default campaign finds within a few cases per shard (no shrinking limits hit).
fault="${GRADFUZZ_SLURM_TEST_FAULT:-internal-requires-grad}"
cases_per_shard="${GRADFUZZ_SLURM_TEST_CASES:-30}"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { printf '[slurm-test %s] %s\n' "$(date +%T)" "$*"; }

[ "$(id -u)" -eq 0 ] || fail "needs root: slurmctld and slurmd run as root here (CI runs as root)"
for tool in slurmctld slurmd sbatch squeue sinfo scontrol scancel munge unmunge python3; do
  command -v "$tool" >/dev/null || fail "'$tool' not found: install Debian's slurm-wlm and munge (scripts/ci-deps.sh)"
done
[ -x "$bin" ] || fail "no gradfuzz at $bin (set GRADFUZZ_EXECUTABLE)"
bash "$src/scripts/ci-deps.sh" munge || fail "munged is not running and could not be started"

tmp="$(mktemp -d /tmp/gradfuzz-slurm-test-XXXXXX)"
pids=()
cleanup() {
  local status=$?
  if [ -n "${SLURM_CONF:-}" ]; then scancel --quiet --full --user=root 2>/dev/null || true; fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    for log in "$tmp"/slurmctld.log "$tmp"/slurmd.log "$tmp"/nightly/*/logs/*.log; do
      [ -f "$log" ] && { echo "---- $log (tail)"; tail -n 40 "$log"; }
    done
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT

# --- a one-node cluster ------------------------------------------------------------------
node="$(hostname -s)"
cpus="$(nproc)"
# Ports of this cluster only: a system Slurm (6817/6818) or a parallel run is left alone.
port=$((20000 + (RANDOM % 4000) * 2))
mkdir -p "$tmp/state" "$tmp/spool"
cat >"$tmp/slurm.conf" <<CONF
ClusterName=gradfuzz-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=gradfuzz Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$tmp/slurm.conf"

step "starting slurmctld and slurmd (ports $port, $((port + 1)))"
slurmctld -D -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >"$tmp/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 120); do
  state="$(sinfo -h -N -n "$node" -o %T 2>/dev/null | head -n1)"
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || fail "the test cluster's node is '${state:-not reported}', not idle, after 60 s"
step "node $node idle"

# --- the nights ----------------------------------------------------------------------------
nightly() {
  local name="$1" fuzz_args="$2"
  step "night $name: 2 shards x $cases_per_shard cases${fuzz_args:+ ($fuzz_args)}"
  NIGHTLY_DIR="$tmp/nightly" NIGHTLY_NAME="$name" NIGHTLY_SHARDS=2 NIGHTLY_CPUS_PER_TASK=1 \
    NIGHTLY_GPUS_PER_TASK=0 NIGHTLY_TIME=00:10:00 NIGHTLY_MERGE_TIME=00:05:00 NIGHTLY_WAIT=1 \
    GRADFUZZ_BIN="$bin" GRADFUZZ_DEVICE=cpu GRADFUZZ_BACKEND=model GRADFUZZ_WORKERS=1 GRADFUZZ_SEED=7 \
    GRADFUZZ_CASES="$cases_per_shard" GRADFUZZ_FUZZ_ARGS="$fuzz_args" \
    timeout 400 bash "$src/scripts/nightly-slurm.sh" >"$tmp/$name.submit.out" 2>&1
  local status=$?
  cat "$tmp/$name.submit.out"
  return "$status"
}

# json FILE EXPR: evaluates a Python expression over the JSON document `d` of FILE.
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

nightly night1 "--fault $fault"
status=$?
[ "$status" -eq 0 ] || fail "night 1: merge job exit $status, expected 0 (nothing to compare with)"
n1="$tmp/nightly/night1"
for f in shard-1.json shard-2.json merged.json merged.junit.xml merged.html diff.txt; do
  [ -s "$n1/$f" ] || fail "night 1: $f missing"
done
[ "$(json "$n1/shard-1.json" 'd["campaign"]["shard"]')" = 1/2 ] || fail "night 1: shard 1 did not run as 1/2"
[ "$(json "$n1/shard-2.json" 'd["campaign"]["shard"]')" = 2/2 ] || fail "night 1: shard 2 did not run as 2/2"
[ "$(json "$n1/merged.json" 'len(d["merge"]["inputs"])')" = 2 ] || fail "night 1: merged report does not list 2 inputs"
expected_cases=$((2 * cases_per_shard))
[ "$(json "$n1/merged.json" 'd["summary"]["cases_run"]')" = "$expected_cases" ] ||
  fail "night 1: merged cases_run is not $expected_cases"
[ "$(json "$n1/merged.json" 'd["summary"]["cases_run"] == sum(json.load(open(sys.argv[1].replace("merged", "shard-%d" % i)))["summary"]["cases_run"] for i in (1, 2))')" = True ] ||
  fail "night 1: merged cases_run is not the sum of the shards'"
[ "$(json "$n1/merged.json" 'd["summary"]["complete"]')" = True ] || fail "night 1: merged report incomplete"
clusters="$(json "$n1/merged.json" 'len(d["findings"])')"
[ "$clusters" -ge 1 ] || fail "night 1: --fault $fault gave no finding in $expected_cases cases"
grep -q '<testsuite name="gradfuzz.fuzz"' "$n1/merged.junit.xml" || fail "night 1: no JUnit test suite"
grep -q 'id="summary-cases_run"' "$n1/merged.html" || fail "night 1: HTML page without summary"
grep -q "no last night's report" "$n1/diff.txt" || fail "night 1: diff.txt does not say there was nothing to compare"
cmp -s "$n1/merged.json" "$tmp/nightly/last.json" || fail "night 1: merged.json not published as last.json"
step "night 1: $clusters cluster(s) in $expected_cases cases"

nightly night2 ""
status=$?
[ "$status" -eq 0 ] || fail "night 2: merge job exit $status, expected 0 (no new cluster)"
n2="$tmp/nightly/night2"
[ "$(json "$n2/merged.json" 'len(d["findings"])')" = 0 ] || fail "night 2: findings without the fault"
[ "$(json "$n2/diff.json" 'len(d["fixed"])')" = "$clusters" ] || fail "night 2: not every cluster of night 1 is fixed"
[ "$(json "$n2/diff.json" 'len(d["new_clusters"]) + len(d["still_failing"])')" = 0 ] || fail "night 2: new or still failing clusters"
grep -q "0 new, $clusters fixed, 0 still failing" "$n2/diff.txt" || fail "night 2: diff.txt does not list the fixed clusters"
grep -q "0 new, $clusters fixed" "$n2/../night2/logs/merge.log" || fail "night 2: the merge job's log lacks the diff"
step "night 2: $clusters cluster(s) fixed"

nightly night3 "--fault $fault"
status=$?
[ "$status" -eq 1 ] || fail "night 3: merge job exit $status, expected 1 (clusters new against night 2)"
n3="$tmp/nightly/night3"
[ "$(json "$n3/diff.json" 'len(d["new_clusters"])')" = "$clusters" ] || fail "night 3: the fault's clusters are not new"
grep -q "+ " "$n3/diff.txt" || fail "night 3: diff.txt lists no new cluster"
step "night 3: $clusters new cluster(s), merge job exit 1"
step "PASS"
