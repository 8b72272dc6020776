"""scripts/case_cost.py --compare: ledgers side by side on the cases they share."""

import gzip
import importlib.util
import io
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "case_cost.py"
spec = importlib.util.spec_from_file_location("case_cost", SCRIPT)
case_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(case_cost)


def case(seed, paths, evidence, recipe=None):
    seconds = {
        "paths/backend": paths,
        "judge/evidence": evidence,
        "ablation/paths/backend": 0.001,
    }
    return {
        "seed": seed,
        "recipe": recipe,
        "seconds": seconds,
        "cpu_seconds": {"judge/evidence": evidence},
    }


def write(path, cases, gz=False):
    text = "".join(json.dumps(c) + "\n" for c in cases)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def test_compare_takes_only_the_cases_every_ledger_has(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl.gz"
    fp8 = {"name": "Float8CurrentScaling", "fp8_format": "E4M3"}
    write(a, [case(1, 0.010, 0.004, fp8), case(2, 0.020, 0.0), case(3, 0.5, 0.5)])
    write(b, [case(2, 0.018, 0.0), case(1, 0.011, 0.001, fp8), case(4, 0.7, 0.7)], gz=True)
    out = io.StringIO()
    assert case_cost.compare([a, b], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("2 cases in common")
    a_row, b_row = lines[2].split(), lines[3].split()
    # a: (10 + 4 + 1) + (20 + 1) ms over 2 cases; b: (11 + 1 + 1) + (18 + 1)
    assert float(a_row[1]) == pytest.approx(18.0)
    assert float(b_row[1]) == pytest.approx(16.0)
    assert float(a_row[4]) == pytest.approx(2.0)  # evidence
    assert float(b_row[6]) == pytest.approx(1.0)  # ablation
    assert "Float8CurrentScaling 15.0" in lines[2] and "none 21.0" in lines[2]


def test_compare_without_shared_cases_says_so(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    write(a, [case(1, 0.01, 0.0)])
    write(b, [case(2, 0.01, 0.0)])
    out = io.StringIO()
    assert case_cost.compare([a, b], out) == 1
    assert "no case in common" in out.getvalue()


def test_one_ledger_with_compare_is_a_usage_error(tmp_path, capsys):
    a = tmp_path / "a.jsonl"
    write(a, [case(1, 0.01, 0.0)])
    with pytest.raises(SystemExit) as e:
        case_cost.main(["--compare", str(a)])
    assert e.value.code == 2
    assert "two ledgers or more" in capsys.readouterr().err
