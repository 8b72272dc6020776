"""Where a campaign's case time goes, from the lines GRADFUZZ_CASE_COST=FILE makes every
worker append (runner/case_cost.h; docs/BENCHMARKS.md "The te worker: where a case's time
goes"), and, when given, the adapters' GRADFUZZ_ADAPTER_TIMING=FILE lines.

    python3 scripts/case_cost.py COST.jsonl [--adapter TIMING.jsonl] [--by verdict|dtype|recipe]
    python3 scripts/case_cost.py --compare A.jsonl B.jsonl ...   (files may be .gz)

Prints, per case (mean over the cases): milliseconds per stage of run_case (exclusive of
the stages nested in it; "x/backend" is the round trip to the backend, the adapter's work
included), the counts (backend requests, path runs by kind, repeat calls, fresh-plan
Sequentials, writer runs), and with --adapter the adapters' own handling time per request.
--compare sets ledgers of the same seed and settings side by side (an A/B of --overlap or
--no-shared-runs): only the cases every ledger has (by case seed), so that each is measured on
the same cases, with their time per recipe.
"""

import argparse
import collections
import gzip
import json
import sys


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def adapter_totals(path):
    """Per adapter pid its last (cumulative) line, summed."""
    last = {}
    for entry in load(path):
        last[entry.get("pid")] = entry
    totals = collections.Counter()
    for entry in last.values():
        for key, value in entry.items():
            if isinstance(value, (int, float)) and key != "pid":
                totals[key] += value
    return totals


def summarize(cases, out):
    n = len(cases)
    if n == 0:
        print("no cases", file=out)
        return
    seconds = collections.Counter()
    cpu = collections.Counter()
    counts = collections.Counter()
    for case in cases:
        seconds.update(case.get("seconds", {}))
        cpu.update(case.get("cpu_seconds", {}))
        counts.update(case.get("counts", {}))
    total = sum(seconds.values())
    total_cpu = sum(cpu.values())
    print(
        f"{n} cases, {1000 * total / n:.2f} ms per case ({n / total:.1f} cases/s), "
        f"worker CPU {1000 * total_cpu / n:.2f} ms per case",
        file=out,
    )
    print("  stage (ms per case: wall, share, worker CPU)", file=out)
    for stage, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if s > 0:
            print(
                f"    {stage:<34} {1000 * s / n:8.3f}  {100 * s / total:5.1f}%"
                f"  {1000 * cpu.get(stage, 0) / n:8.3f}",
                file=out,
            )
    print("  counts (per case)", file=out)
    for what, c in sorted(counts.items()):
        if c:
            print(f"    {what:<34} {c / n:8.3f}", file=out)


def recipe_name(case):
    recipe = case.get("recipe")
    if isinstance(recipe, dict):
        recipe = recipe.get("name")
    return recipe or "none"


def compare(paths, out):
    """The ledgers `paths` on the cases all of them have: ms per case, its main stages, the
    worker's CPU, and ms per case per recipe."""
    ledgers = []
    for path in paths:
        by_seed = {}
        for case in load(path):
            by_seed.setdefault(case["seed"], case)
        ledgers.append(by_seed)
    common = set.intersection(*(set(ledger) for ledger in ledgers))
    if not common:
        print("no case in common (same --seed and settings?)", file=out)
        return 1
    n = len(common)
    print(f"{n} cases in common (ms per case)", file=out)
    print(
        f"  {'ledger':<40} {'total':>7} {'cases/s':>7} {'paths':>7} {'evidence':>8}"
        f" {'reference':>9} {'ablation':>8} {'CPU':>7}  per recipe",
        file=out,
    )
    for path, ledger in zip(paths, ledgers):
        stage = collections.Counter()
        cpu = 0.0
        recipes = collections.defaultdict(lambda: [0, 0.0])
        for seed in common:
            case = ledger[seed]
            for name, s in case.get("seconds", {}).items():
                group = "ablation" if name.startswith("ablation") else name.split("/")[0]
                if name == "judge/evidence":
                    group = "evidence"
                stage[group] += s
                stage["total"] += s
            cpu += sum(case.get("cpu_seconds", {}).values())
            r = recipes[recipe_name(case)]
            r[0] += 1
            r[1] += sum(case.get("seconds", {}).values())
        per_recipe = ", ".join(f"{k} {1000 * t / c:.1f}" for k, (c, t) in sorted(recipes.items()))
        print(
            f"  {str(path)[-40:]:<40} {1000 * stage['total'] / n:7.2f} {n / stage['total']:7.1f}"
            f" {1000 * stage['paths'] / n:7.2f} {1000 * stage['evidence'] / n:8.2f}"
            f" {1000 * stage['reference'] / n:9.2f} {1000 * stage['ablation'] / n:8.2f}"
            f" {1000 * cpu / n:7.2f}  {per_recipe}",
            file=out,
        )
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "cost", nargs="+", help="the GRADFUZZ_CASE_COST file (with --compare: several)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="ledgers side by side on the cases they share",
    )
    parser.add_argument("--adapter", help="the GRADFUZZ_ADAPTER_TIMING file")
    parser.add_argument(
        "--by", choices=("verdict", "dtype", "recipe"), help="also summarize per value"
    )
    args = parser.parse_args(argv)
    if args.compare:
        if len(args.cost) < 2:
            parser.error("--compare: give two ledgers or more")
        return compare(args.cost, sys.stdout)
    if len(args.cost) > 1:
        parser.error("several ledgers: compare them with --compare")
    cases = load(args.cost[0])
    summarize(cases, sys.stdout)
    if args.by:
        groups = collections.defaultdict(list)
        for case in cases:
            groups[case.get(args.by)].append(case)
        for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"\n{args.by} {key}:")
            summarize(members, sys.stdout)
    if args.adapter:
        t = adapter_totals(args.adapter)
        requests = t.get("requests", 0) or 1
        print(f"\nadapters: {t.get('requests', 0)} requests", end="")
        for key in sorted(t):
            if key.endswith("_s"):
                print(f", {key} {1000 * t[key] / requests:.3f} ms/request", end="")
        print()
        for key in sorted(t):
            if not key.endswith("_s") and key != "requests":
                print(f"  {key}: {t[key] / requests:.3f} per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
