#!/usr/bin/env bash
# Issue 8's acceptance on the CPU: that the oracle lets no wrong gradient pass (every fault
# detected, in every dtype, for every seed) and raises no false alarm (long soaks of the
# repaired runtime). Prints the figures; exits 1 when a criterion is not met.
#
#   scripts/oracle-acceptance.sh selftest   # --faults all, 2000 cases, bf16/fp16 and fp32
#   scripts/oracle-acceptance.sh seeds      # seeds 1-20 of 2000-case selftests (float64,float32)
#   scripts/oracle-acceptance.sh soak       # 1,000,000 float32/float64 + 200,000 bf16/fp16 cases
#
# Environment: GRADFUZZ (the binary, default build/tools/gradfuzz), WORK (scratch folder,
# default a new temporary one), WORKERS (default 2), SOAK_CASES / SOAK_LOW_CASES (override
# the soak sizes), SEEDS (default "1 2 ... 20"), PARTS (soak parts, default 10).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gradfuzz="${GRADFUZZ:-$root/build/tools/gradfuzz}"
work="${WORK:-$(mktemp -d -t gradfuzz-oracle-XXXXXX)}"
workers="${WORKERS:-2}"
mkdir -p "$work"
[ -x "$gradfuzz" ] || { echo "no gradfuzz binary at $gradfuzz (build first, or set GRADFUZZ)" >&2; exit 2; }
status=0

# summary REPORT: "detected/total, max shrunk ops, undetected names" of a selftest report.
summary() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
entries = r.get("selftest", [])
missed = [e["name"] for e in entries if not e.get("detected")]
ops = [e.get("shrunk_ops") or 0 for e in entries if e.get("detected")]
big = [e["name"] for e in entries if e.get("detected") and (e.get("shrunk_ops") or 0) > 4]
print(f"{len(entries) - len(missed)}/{len(entries)} detected, shrunk to at most {max(ops, default=0)} ops"
      + (f"; missed: {','.join(missed)}" if missed else "") + (f"; over 4 ops: {','.join(big)}" if big else ""))
sys.exit(1 if missed or big else 0)
PY
}

stage_selftest() {
  for dtypes in bfloat16,float16 float32; do
    local out="$work/selftest-$dtypes"
    rm -rf "$out"; mkdir -p "$out"
    local t0=$SECONDS
    "$gradfuzz" selftest --faults all --dtypes "$dtypes" --cases 2000 --workers "$workers" \
      --corpus "$out/corpus" --report "$out/report.json" > "$out/log" 2>&1 || true
    printf 'selftest %-16s ' "$dtypes"
    summary "$out/report.json" || status=1
    echo "  ($((SECONDS - t0)) s, log $out/log)"
  done
}

stage_seeds() {
  local seeds="${SEEDS:-$(seq -s ' ' 1 20)}"
  local table="$work/seeds.tsv"
  : > "$table"
  for seed in $seeds; do
    local out="$work/seed-$seed"
    rm -rf "$out"; mkdir -p "$out"
    "$gradfuzz" selftest --faults all --seed "$seed" --cases 2000 --workers "$workers" \
      --corpus "$out/corpus" --report "$out/report.json" > "$out/log" 2>&1 || true
    python3 - "$out/report.json" "$seed" >> "$table" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for e in r.get("selftest", []):
    print(f"{sys.argv[2]}\t{e['name']}\t{int(bool(e.get('detected')))}\t{e.get('cases_to_detect') or ''}\t{e.get('shrunk_ops') or ''}")
PY
  done
  python3 - "$table" <<'PY' || status=1
import collections, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = collections.defaultdict(list)
for seed, name, hit, cases, ops in rows:
    by[name].append((int(hit), int(cases) if cases else None, int(ops) if ops else None))
bad = False
print(f"{'fault':24} detected  cases to detect (median, max)  shrunk ops (max)")
for name, v in by.items():
    hits = sum(h for h, _, _ in v)
    cases = sorted(c for h, c, _ in v if h)
    ops = [o for h, _, o in v if h and o is not None]
    med = cases[len(cases) // 2] if cases else "-"
    print(f"{name:24} {hits:2}/{len(v):<6} {str(med):>8} {str(max(cases, default='-')):>8}            {max(ops, default='-')}")
    bad = bad or hits < len(v)
sys.exit(1 if bad else 0)
PY
}

# soak DTYPES CASES: a campaign of the repaired runtime in PARTS parts (seeds 1000+i).
soak() {
  local dtypes="$1" cases="$2" parts="${PARTS:-10}"
  local per=$(( (cases + parts - 1) / parts )) total=0 findings=0 failed=0 t0=$SECONDS
  for part in $(seq 1 "$parts"); do
    local out="$work/soak-$dtypes-$part"
    rm -rf "$out"; mkdir -p "$out"
    "$gradfuzz" fuzz --cases "$per" --seed $((1000 + part)) --dtypes "$dtypes" --workers "$workers" \
      --max-shrink-calls 200 --corpus "$out/corpus" --report "$out/report.json" > "$out/log" 2>&1 || true
    read -r n f x < <(python3 -c "
import json; s = json.load(open('$out/report.json'))['summary']
print(s['cases_run'], s['findings'], s['failed'])")
    total=$((total + n)); findings=$((findings + f)); failed=$((failed + x))
    if [ "$f" != 0 ]; then grep -A2 '^finding' "$out/log" | head -20; fi
  done
  local secs=$((SECONDS - t0))
  echo "soak $dtypes: $total cases, $failed failed, $findings findings, ${secs} s ($((total / (secs > 0 ? secs : 1))) cases/s)"
  [ "$findings" = 0 ] || status=1
}

stage_soak() {
  soak float32,float64 "${SOAK_CASES:-1000000}"
  soak bfloat16,float16 "${SOAK_LOW_CASES:-200000}"
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(selftest seeds soak)
for s in "${stages[@]}"; do
  case "$s" in
    selftest|seeds|soak) "stage_$s" ;;
    *) echo "unknown stage '$s' (selftest, seeds, soak)" >&2; exit 2 ;;
  esac
done
echo "work folder: $work"
exit "$status"
