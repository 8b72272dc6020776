"""Exported te scripts fail exactly where replay fails (issue 15 item 4), on TE's own Python:
a te campaign through `build/tools/gradfuzz` with TE 2.20.2's fuser, Sequential and
plain-torch ops over the stubbed extension (te_stub_python.sh), generated with the ops that
need no kernel and no recipe. It finds TE's defects there (review findings 2 and 3, the
in-place writes into caller tensors, their mismatches) and passes the rest; each case is
exported with the oracle's own bounds and its script run on the same stub: a script fails
exactly when the campaign judged its case a failure."""

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import te_stub
from test_exporter import run_pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BINARY = os.path.join(REPO, "build", "tools", "gradfuzz")
STUB_PYTHON = os.path.join(HERE, "te_stub_python.sh")
# What runs on TE's Python without a kernel (te_stub.py), and the fusion of these.
STUB_OPS = (
    "AddExtraInput",
    "Bias",
    "Combine",
    "ConstantScale",
    "Dispatch",
    "DualExtraOutput",
    "Identity",
    "MakeExtraOutput",
    "Reshape",
    "RowStat",
)
CASES = 30
# Runs the scripts as a user runs them, TE imported from the stub, on the CPU.
PRELUDE = f"""
import sys
sys.path.insert(0, {HERE!r})
import te_stub
te_stub.install()
import pytest
for path in sys.argv[1:]:
    if path.endswith(".py"):
        source = open(path).read().replace('torch.device("cuda")', 'torch.device("cpu")')
        open(path, "w").write(source)
sys.exit(pytest.main(sys.argv[1:]))
"""


def gradfuzz(*args, timeout=300):
    env = dict(os.environ, GRADFUZZ_ADAPTER_DIR=os.path.dirname(HERE))
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout, env=env)


def export(case_file, script):
    """`gradfuzz export` of one case file; an invalid case generated on purpose is declared
    as the loader asks (its message names the kind)."""
    result = gradfuzz("export", "--python", str(case_file), "--backend", "te", "-o", str(script))
    declared = re.search(r'must declare "wiring_error": "([a-z-]+)"', result.stderr)
    if result.returncode != 0 and declared:
        case = json.loads(case_file.read_text())
        case_file.write_text(json.dumps(dict(case, wiring_error=declared.group(1))))
        result = gradfuzz(
            "export", "--python", str(case_file), "--backend", "te", "-o", str(script)
        )
    assert result.returncode == 0, (case_file.name, result.stderr)


@pytest.mark.skipif(not os.access(BINARY, os.X_OK), reason="build/tools/gradfuzz is not built")
def test_te_scripts_fail_exactly_where_the_campaign_found_a_failure(tmp_path):
    reason = te_stub.available()
    if reason:
        pytest.skip(reason)
    listed = gradfuzz(
        "list", "capabilities", "--json", "--backend", "te", "--python-exe", STUB_PYTHON
    )
    assert listed.returncode == 0, listed.stderr
    capabilities = json.loads(listed.stdout)
    capabilities["ops"] = {k: v for k, v in capabilities["ops"].items() if k in STUB_OPS}
    capabilities["fusions"] = [
        f for f in capabilities["fusions"] if f["name"].startswith("FusedResidual")
    ]
    capabilities["recipes"] = []
    # Exported scripts do not write the usage script's steps (export refuses such a case).
    capabilities.pop("usage", None)
    (tmp_path / "caps.json").write_text(json.dumps(capabilities))
    log = tmp_path / "cases.jsonl"
    campaign = gradfuzz(
        *("fuzz", "--backend", "te", "--python-exe", STUB_PYTHON, "--device", "cpu"),
        *("--generate-as", str(tmp_path / "caps.json"), "--recipe", "none"),
        *("--cases", str(CASES), "--seed", "5", "--workers", "1", "--max-shrink-calls", "0"),
        *("--corpus", str(tmp_path / "corpus"), "--report", str(tmp_path / "report.json")),
        *("--case-log", str(log), "--quiet"),
    )
    assert campaign.returncode in (0, 1), campaign.stderr
    verdicts, jobs = {}, []
    for number, line in enumerate(log.read_text().splitlines()):
        entry = json.loads(line)
        name = f"c{number:03d}"
        verdicts[f"test_{name}.py"] = entry["verdict"]
        case = {
            "schema_version": 1,
            "backend": "te",
            "spec": entry["spec"],
            "verdict": {"kind": entry["verdict"], "fault": None},
            "provenance": {"campaign_seed": 5, "tool_version": "0.1.0", "fault": None},
        }
        (tmp_path / f"{name}.json").write_text(json.dumps(case))
        jobs.append((tmp_path / f"{name}.json", tmp_path / "scripts" / f"test_{name}.py"))
    # Both kinds of outcome are there, so agreeing is not trivially one-sided.
    assert len(jobs) == CASES and 5 <= sum(v == "pass" for v in verdicts.values()) <= CASES - 5
    (tmp_path / "scripts").mkdir()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: export(*job), jobs))
    scripts = {script.name: script.read_text() for _, script in jobs}
    outcomes, output = run_pytest(tmp_path / "scripts", scripts, PRELUDE)
    disagree = {
        name: (verdicts[name], sorted(set(outcomes[name].values())))
        for name in scripts
        if (set(outcomes[name].values()) != {"PASSED"}) != (verdicts[name] != "pass")
        or not outcomes[name]
    }
    assert not disagree, (disagree, output[-4000:])
