"""Exported scripts judge each path against the reference of its own FP8 quantization points,
as replay does (issue 15 item 4, docs/BACKENDS.md "Per-path quantization points").

A case whose fused path fires BackwardLinearScale under a recipe (Linear -> ConstantScale):
TE's fused op quantizes the Linear's unscaled gradient and applies the scale as the backward
GEMMs' alpha, so replay judges the fused path against a reference with those quantization
points; the torch backend emulates the fused op (torch_backend/runtime.py: FUSIONS) and plants
`torch-backward-linear-scale-alpha-dropped`. Each case is replayed on the torch backend with
and without that fault, exported for the torch backend through `build/tools/gradfuzz export`,
and its script run under pytest with and without the same fault planted in the runtime the
script embeds: the script fails exactly when replay does. The te script of the same case
tests each path against its own expectation too (TE is not here: its text is checked)."""

import json
import os
import subprocess

import pytest
from test_exporter import run_pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ADAPTER = os.path.dirname(HERE)
BINARY = os.path.join(REPO, "build", "tools", "gradfuzz")
FAULT = "torch-backward-linear-scale-alpha-dropped"

# Runs the scripts as a user runs them, with torch_backend/faults.py's fault `name` planted in
# the runtime each script embeds (its target without its module gradfuzz_adapter.torch_backend.
# <module>: the script's own function), as the adapter plants it in its module for replay.
PRELUDE = """
import sys
import pytest
FAULT = {fault!r}
class Plant:
    def pytest_collection_modifyitems(self, session, config, items):
        if FAULT is None:
            return
        sys.path.insert(0, {adapter!r})
        from gradfuzz_adapter.torch_backend.faults import FAULTS
        fault = FAULTS[FAULT]
        *owners, attr = fault.target.split(".")[3:]
        for module in {{item.module for item in items}}:
            owner = module
            for name in owners:
                owner = getattr(owner, name)
            setattr(owner, attr, fault.replace(vars(owner)[attr]))
sys.exit(pytest.main(sys.argv[1:], plugins=[Plant()]))
"""


def linear_scale(recipe, dtype="float32", repeat_calls=(), seed=3732127765699276685):
    """Linear -> ConstantScale(1.5) under `recipe`, BackwardLinearScale enabled (the H200
    campaign's te-bls cases, tests/backends/data, on the CPU)."""
    return {
        "schema_version": 1,
        "backend": "torch",
        "spec": {
            "device": "cpu",
            "dtype": dtype,
            "fusions": ["BackwardLinearScale"],
            "input_requires_grad": True,
            "input_shape": [16, 48],
            "ops": [
                {"name": "Linear", "attrs": {"out": 48.0}},
                {"name": "ConstantScale", "attrs": {"scale": 1.5}},
            ],
            "recipe": recipe,
            "seed": seed,
            "repeat_calls": list(repeat_calls),
        },
        "verdict": {"kind": "pass", "fault": None},
        "provenance": {"campaign_seed": 5, "tool_version": "0.1.0", "fault": None},
    }


DELAYED = {
    "name": "DelayedScaling",
    "fp8_format": "HYBRID",
    "options": {"amax_compute_algo": "max", "amax_history_len": "2", "margin": "0"},
}
BLOCK = {
    "name": "Float8BlockScaling",
    "fp8_format": "HYBRID",
    "options": {"backward_override": "none", "block_scaling_dims": "1,1,1", "use_f32_scales": "0"},
}
CASES = {
    "delayed_repeat": linear_scale(DELAYED, repeat_calls=[{}]),
    "delayed_bf16": linear_scale(DELAYED, dtype="bfloat16", seed=2),
    "block": linear_scale(BLOCK, seed=3),
}


def gradfuzz(*args):
    env = dict(os.environ, GRADFUZZ_ADAPTER_DIR=ADAPTER)
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=300, env=env)


def replay_fails(case_file, fault=None):
    result = gradfuzz(
        "replay", str(case_file), "--backend", "torch", "--workers", "0",
        *(["--fault", fault] if fault else []),
    )  # fmt: skip
    assert result.returncode in (0, 1), (case_file, result.stdout, result.stderr)
    return result.returncode == 1


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{name: (case file, torch script, te script)}."""
    if not os.access(BINARY, os.X_OK):
        pytest.skip("build/tools/gradfuzz is not built")
    folder = tmp_path_factory.mktemp("quantization_points")
    out = {}
    for name, case in CASES.items():
        case_file = folder / f"{name}.json"
        case_file.write_text(json.dumps(case))
        scripts = []
        for backend in ("torch", "te"):
            script = folder / f"{backend}_{name}.py"
            result = gradfuzz(
                "export", "--python", str(case_file), "--backend", backend, "-o", str(script)
            )
            assert result.returncode == 0, (name, backend, result.stderr)
            scripts.append(script.read_text())
        out[name] = (case_file, *scripts)
    return out


@pytest.mark.parametrize("fault", [None, FAULT], ids=["clean", "alpha-dropped"])
def test_torch_scripts_fail_exactly_when_replay_fails(exported, tmp_path, fault):
    scripts, replay = {}, {}
    for name, (case_file, torch_script, _) in exported.items():
        scripts[f"test_{name}.py"] = torch_script
        replay[f"test_{name}.py"] = replay_fails(case_file, fault)
    # Replay itself: the clean emulation passes against the fused path's own reference, the
    # dropped alpha fails (TorchBackend.BackwardLinearScaleIsJudgedAtItsOwnQuantizationPoint).
    assert set(replay.values()) == {fault is not None}, replay
    prelude = PRELUDE.format(fault=fault, adapter=ADAPTER)
    outcomes, output = run_pytest(tmp_path, scripts, prelude)
    failed = {name: "FAILED" in outcomes[name].values() for name in scripts}
    assert all(outcomes[name] for name in scripts), output[-4000:]
    assert failed == replay, output[-4000:]
    if fault:
        # The fused path's test fails, the unfused one (no fused op) passes, as in replay.
        for name in scripts:
            assert outcomes[name] == {"test_case[fused]": "FAILED", "test_case[unfused]": "PASSED"}


def test_each_path_has_its_own_expectation_in_both_scripts(exported):
    for name, (_, torch_script, te_script) in exported.items():
        for script in (torch_script, te_script):
            assert "FUSED_BOUNDS = {" in script, name
            assert "FUSED_EXPECTED = [" in script, name
            assert "'fused': (FUSED_EXPECTED, FUSED_BOUNDS)" in script, name
            assert "'unfused': (EXPECTED, BOUNDS)" in script, name
            assert "op 0: backward GEMMs alpha 1.5; op 1: gradient passed through" in script
            assert "    expected, bounds = EXPECTATIONS[path]" in script, name
            assert '@pytest.mark.parametrize("path, fusions", [' in script, name
        # The torch script builds each path's Sequential with its fusions.
        assert "model = Sequential(op0, op1, fusions=fusions)" in torch_script, name
        assert "only_fusions(monkeypatch, fusions)" in te_script, name
