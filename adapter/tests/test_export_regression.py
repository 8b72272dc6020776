"""Every case of corpus/regression exported for the torch backend and run under pytest, as CI
runs it: each script's outcome must be its case file's verdict with the fault off. The
regression cases' faults are the model's (ops/faults), so on the torch backend every script
passes; a case the file declares invalid (`wiring_error`) must raise that kind.

Twice: with requests this adapter's client builds (its own values), and through
`build/tools/gradfuzz export` when the binary is there (the C++ side's values, tolerances
and expectations)."""

import glob
import json
import os
import subprocess

import pytest
from helpers import TOLERANCE
from test_exporter import run_pytest

from gradfuzz_adapter.__main__ import Server
from gradfuzz_adapter.client import make_request
from gradfuzz_adapter.export import EMBEDDED_MARK

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CASES = sorted(glob.glob(os.path.join(REPO, "corpus", "regression", "*.json")))
BINARY = os.path.join(REPO, "build", "tools", "gradfuzz")


def expectation(case_file):
    """The case file's verdict with its fault off: an invalid configuration raises its kind,
    anything else passes."""
    kind = case_file.get("wiring_error")
    return ("error", kind) if kind else ("pass", None)


def script_name(path):
    return "test_" + os.path.splitext(os.path.basename(path))[0] + ".py"


def test_the_regression_corpus_is_there():
    assert len(CASES) >= 15, CASES


def test_every_regression_case_exports_to_a_script_with_its_verdict(tmp_path):
    scripts, wanted = {}, {}
    for path in CASES:
        with open(path) as f:
            case_file = json.load(f)
        kind, error_kind = expectation(case_file)
        spec = dict(case_file["spec"], device="cpu")
        expect = {"kind": kind, "tolerance": TOLERANCE[spec["dtype"]]}
        if error_kind:
            expect["error_kind"] = error_kind
        header, tensors = make_request(
            spec, op="export", backend="torch", expect=expect, case_file=path
        )
        reply, _ = Server("torch").handle(header, tensors)
        assert reply["ok"], (path, reply)
        scripts[script_name(path)] = reply["script"]
        wanted[script_name(path)] = "PASSED"
    outcomes, output = run_pytest(tmp_path, scripts)
    got = {name: set(outcomes[name].values()) for name in scripts}
    assert got == {name: {wanted[name]} for name in scripts}, output


@pytest.mark.skipif(not os.access(BINARY, os.X_OK), reason="build/tools/gradfuzz is not built")
def test_every_regression_case_exported_by_gradfuzz_passes(tmp_path):
    scripts = {}
    for path in CASES:
        with open(path) as f:
            case_file = json.load(f)
        out = tmp_path / script_name(path)
        result = subprocess.run(
            [BINARY, "export", "--python", path, "--backend", "torch", "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, GRADFUZZ_ADAPTER_DIR=os.path.dirname(HERE)),
        )
        assert result.returncode == 0, (path, result.stderr)
        scripts[out.name] = out.read_text()
        if len(case_file["spec"]["ops"]) <= 3:
            # The test itself, with the oracle's own bounds, within the budget of
            # test_export_compact (the runtime under test is embedded after the mark).
            test_part = scripts[out.name].split(EMBEDDED_MARK)[0].rstrip("\n").splitlines()
            assert len(test_part) <= 150, (path, len(test_part))
    assert len(scripts) == len(CASES)
    outcomes, output = run_pytest(tmp_path, scripts)
    got = {name: set(outcomes[name].values()) for name in scripts}
    assert got == {name: {"PASSED"} for name in scripts}, output
