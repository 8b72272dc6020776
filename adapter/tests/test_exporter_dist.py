"""The script of a distributed case (export/distributed.py), written for the torch backend and run
as `torchrun --nproc-per-node 2 -m pytest`: it passes with the reference's values and fails
when they are wrong."""

import os
import subprocess
import sys

import pytest
import torch

from gradfuzz_adapter import client
from gradfuzz_adapter.case import decode_case
from gradfuzz_adapter.export import export_reply

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER = os.path.dirname(HERE)

# A Megatron MLP on two ranks: a column Linear, GELU, a row Linear (all-reduced).
SPEC = {
    "ops": [
        {"name": "Linear", "attrs": {"out": 4, "tensor_parallel_mode": 1}},
        {"name": "GELU"},
        {"name": "Linear", "attrs": {"out": 3, "tensor_parallel_mode": 2}},
    ],
    "fusions": [],
    "input_requires_grad": True,
    "input_shape": [2, 6],
    "dtype": "float64",
    "device": "cpu",
    "seed": 5,
    "world_size": 2,
}

# What the harness sends for it (harness::sharding_json).
SHARDING = {
    "world_size": 2,
    "input": "replicated",
    "input_grad": "replicated",
    "outputs": ["replicated"],
    "output_grads": ["replicated"],
    "extra_inputs": [],
    "extra_input_grads": [],
    "ops": [
        {
            "input_layout": "replicated",
            "global_input_shape": [2, 6],
            "params": ["rows"],
            "param_grads": ["rows"],
        },
        {"input_layout": "features", "global_input_shape": [2, 4], "params": [], "param_grads": []},
        {
            "input_layout": "features",
            "global_input_shape": [2, 4],
            "params": ["features"],
            "param_grads": ["features"],
        },
    ],
}


def _reference(case):
    """The unsharded float64 math of SPEC, by name (the oracle's names)."""
    x = case.input.clone().requires_grad_(True)
    w1 = case.ops[0].params[0].clone().requires_grad_(True)
    w2 = case.ops[2].params[0].clone().requires_grad_(True)
    y = torch.nn.functional.gelu(x @ w1.T, approximate="tanh") @ w2.T
    dx, dw1, dw2 = torch.autograd.grad(y, [x, w1, w2], case.cotangents[0])
    return {
        "output": y.detach(),
        "grad_input": dx,
        "grad_param[0].Linear[0]": dw1,
        "grad_param[2].Linear[0]": dw2,
    }


def _export(tmp_path, wrong=False):
    header, tensors = client.make_request(dict(SPEC), op="export")
    case = decode_case(header, tensors)
    expected = _reference(case)
    if wrong:
        expected["grad_input"] = expected["grad_input"] * 2
    refs = {}
    tensors = list(tensors)
    for name, t in expected.items():
        refs[name] = len(tensors)
        tensors.append(t)
    script = tmp_path / "test_dist_case.py"
    request = {
        "backend": "torch",
        "case_file": "dist.json",
        "data_file": str(script) + ".values.pt",
        "expect": {
            "kind": "pass",
            "tolerance": {"atol": 1e-7, "rtol": 1e-7},
            "tensors": {n: {"atol": 1e-7, "rtol": 1e-7, "allowance": None} for n in expected},
            "expected": refs,
            "sharding": SHARDING,
        },
    }
    reply = export_reply(case, request, "torch", tensors)
    script.write_text(reply["script"])
    return script, reply


def _torchrun(script):
    env = dict(os.environ, PYTHONPATH="")  # standalone: nothing of the adapter importable
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(script),
        ],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_script_runs_each_rank_on_its_slice_and_passes_against_the_reference(tmp_path):
    script, reply = _export(tmp_path)
    text = script.read_text()
    assert "gradfuzz_adapter" not in text.replace("gradfuzz_adapter/", "")
    assert "torchrun --nproc-per-node 2" in text
    assert os.path.exists(reply["data_file"])
    run = _torchrun(script)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_the_script_fails_where_the_ranks_disagree_with_the_reference(tmp_path):
    script, _ = _export(tmp_path, wrong=True)
    run = _torchrun(script)
    assert run.returncode != 0
    assert "grad_input:" in run.stdout + run.stderr


def test_a_distributed_export_needs_a_data_file():
    header, tensors = client.make_request(dict(SPEC), op="export")
    case = decode_case(header, tensors)
    with pytest.raises(ValueError, match="-o FILE"):
        export_reply(case, {"backend": "torch", "expect": {"sharding": SHARDING}}, "torch", tensors)
