"""Issue 30's last usage elements on the torch backend, through the driver: several
Sequentials in one autocast, a call with the recipe off, DelayedScaling's history length
changed between calls, quantized weights (and the caller reading them), each with the planted
fault that only it reaches."""

import pytest
import torch
from helpers import run_one_path, spec

from gradfuzz_adapter.client import make_request
from gradfuzz_adapter.torch_backend.backend import TorchBackend

DELAYED = {
    "name": "DelayedScaling",
    "fp8_format": "HYBRID",
    "options": {"margin": "0", "amax_history_len": "4", "amax_compute_algo": "max"},
}
CURRENT = {"name": "Float8CurrentScaling", "fp8_format": "E4M3", "options": {}}
LINEARS = [
    {"name": "Linear", "attrs": {"out": 16}},
    {"name": "Boundary"},
    {"name": "GELU"},
    {"name": "Linear", "attrs": {"out": 16}},
]


@pytest.fixture(scope="module")
def backend():
    return TorchBackend()


def _request(case_spec):
    """The run request of `case_spec`, its optimizer steps' values made as the harness makes
    them (each parameter rolled by one element and halved)."""
    header, tensors = make_request(case_spec, paths=[{"name": "fused", "fusions": []}])
    steps = []
    for call in case_spec.get("repeat_calls") or []:
        if not call.get("update"):
            steps.append(None)
            continue
        per_op = []
        for refs in header["values"]["params"]:
            fresh = []
            for r in refs:
                tensors.append(torch.roll(tensors[r], 1) * 0.5)
                fresh.append(len(tensors) - 1)
            per_op.append(fresh)
        steps.append(per_op)
    if any(s is not None for s in steps):
        header["values"]["step_params"] = steps
    return header, tensors


def _run(backend, case_spec, fault=None):
    header, tensors = _request(case_spec)
    return run_one_path(backend, header, tensors, fault)


def _violations(result):
    calls = [result, *result.get("repeats", [])]
    return [v["what"] for c in calls for v in (c.get("fp8_state") or {}).get("violations", [])]


def test_several_sequentials_give_what_the_one_sequential_gives(backend):
    case = spec(LINEARS, shape=(16, 16), recipe=DELAYED, repeat_calls=[{}, {"update": True}])
    one = _run(backend, case)
    several = _run(backend, dict(case, several_sequentials=True))
    assert one["status"] == several["status"] == "ok", several
    for a, b in zip([one, *one["repeats"]], [several, *several["repeats"]]):
        torch.testing.assert_close(a["outputs"][0], b["outputs"][0], rtol=0, atol=0)
        torch.testing.assert_close(a["grad_input"], b["grad_input"], rtol=0, atol=0)
    assert several["plans"] == one["plans"]
    assert _violations(several) == []
    # The forward update at each Sequential's exit: the first Linear's quantizers roll twice.
    faulty = _run(
        backend,
        dict(case, several_sequentials=True),
        "torch-usage-several-sequentials-update-per-sequential",
    )
    assert "rule" in _violations(faulty) or "update" in _violations(faulty), faulty
    # One Sequential: the fault has nothing to act on.
    assert (
        _violations(_run(backend, case, "torch-usage-several-sequentials-update-per-sequential"))
        == []
    )


def test_a_call_with_the_recipe_off_runs_in_high_precision_and_keeps_the_state(backend):
    ops = [{"name": "Linear", "attrs": {"out": 16}}]
    case = spec(ops, shape=(16, 16), recipe=DELAYED, repeat_calls=[{"recipe_off": True}, {}])
    result = _run(backend, case)
    assert result["status"] == "ok", result
    assert _violations(result) == []
    off = result["repeats"][0]
    plain = _run(backend, spec(ops, shape=(16, 16)))
    torch.testing.assert_close(off["outputs"][0], plain["outputs"][0], rtol=0, atol=0)
    torch.testing.assert_close(off["grad_input"], plain["grad_input"], rtol=0, atol=0)
    # Quantized, the first call differs from the high-precision one.
    assert not torch.equal(result["outputs"][0], plain["outputs"][0])
    faulty = _run(backend, case, "torch-usage-recipe-off-call-records-amax")
    assert "recipe_off" in _violations(faulty), faulty
    assert (
        _violations(
            _run(
                backend,
                dict(case, repeat_calls=[{}, {}]),
                "torch-usage-recipe-off-call-records-amax",
            )
        )
        == []
    )


def test_the_fp8_weight_fault_reaches_only_a_call_with_the_recipe_off(backend):
    ops = [{"name": "Linear", "attrs": {"out": 16}}]
    case = spec(ops, shape=(16, 16), recipe=CURRENT, repeat_calls=[{"recipe_off": True}])
    right = _run(backend, case)
    faulty = _run(backend, case, "torch-usage-recipe-off-call-uses-fp8-weight")
    # The quantized first call is the same; the call with the recipe off reads the FP8 weight.
    torch.testing.assert_close(faulty["outputs"][0], right["outputs"][0], rtol=0, atol=0)
    off, off_faulty = right["repeats"][0], faulty["repeats"][0]
    assert not torch.equal(off_faulty["outputs"][0], off["outputs"][0])
    assert not torch.equal(off_faulty["grad_input"], off["grad_input"])
    # The weight's gradient does not read the weight.
    torch.testing.assert_close(
        off_faulty["grad_params"][0][0], off["grad_params"][0][0], rtol=0, atol=0
    )
    # A plain repeat call is as without the fault.
    plain = dict(case, repeat_calls=[{}])
    a = _run(backend, plain)["repeats"][0]
    b = _run(backend, plain, "torch-usage-recipe-off-call-uses-fp8-weight")["repeats"][0]
    torch.testing.assert_close(a["outputs"][0], b["outputs"][0], rtol=0, atol=0)


@pytest.mark.parametrize("length", [2, 7])
def test_a_history_length_change_keeps_the_first_slots(backend, length):
    ops = [{"name": "Linear", "attrs": {"out": 16}}]
    case = spec(
        ops,
        shape=(16, 16),
        recipe=DELAYED,
        repeat_calls=[{}, {}, {}, {"amax_history_len": length}, {}],
    )
    # Each update rolls the recorded amax to the history's end, slot 0 emptied: after four
    # calls the first slots hold amaxes, which a shorter history keeps.
    assert _violations(_run(backend, case)) == []
    faulty = _run(backend, case, "torch-usage-history-len-change-zeroes-history")
    assert _violations(faulty), faulty


def test_quantized_weights_follow_every_write_and_the_caller_reads_them(backend):
    ops = [{"name": "Linear", "attrs": {"out": 16}}, {"name": "GELU"}]
    case = spec(
        ops,
        shape=(16, 16),
        recipe=CURRENT,
        repeat_calls=[{"update": True}],
        quantized_params=True,
        held_quantized_tensor=True,
    )
    result = _run(backend, case)
    assert result["status"] == "ok", result
    assert _violations(result) == []
    assert result["fp8_state"]["checked"] == 1
    # The weights quantized once at creation: the same values as a weight quantized at
    # every forward (current scaling takes its scale from the weight either way).
    plain = _run(backend, dict(case, quantized_params=False, held_quantized_tensor=False))
    for a, b in zip([result, *result["repeats"]], [plain, *plain["repeats"]]):
        torch.testing.assert_close(a["outputs"][0], b["outputs"][0], rtol=0, atol=0)
        torch.testing.assert_close(a["grad_input"], b["grad_input"], rtol=0, atol=0)
    # A transpose left stale by the step: the dgrad after it reads the old weight, and the
    # caller sees the column-wise copy differ.
    stale = _run(backend, case, "torch-usage-quantized-weight-stale-transpose-after-step")
    assert not torch.equal(stale["repeats"][0]["grad_input"], result["repeats"][0]["grad_input"])
    assert torch.equal(stale["grad_input"], result["grad_input"])
    assert "columnwise" in _violations(stale)
    detached = _run(backend, case, "torch-usage-held-weight-dequantize-detached")
    assert "autograd" in _violations(detached)
    unheld = dict(case, held_quantized_tensor=False)
    assert _violations(_run(backend, unheld, "torch-usage-held-weight-dequantize-detached")) == []
