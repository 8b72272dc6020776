"""Issue 26 item 2 on the torch backend: every quantized tensor the FP8 emulation makes is
checked exactly as it is made (invariants.py: check_emulated) and the checks reach the
call's fp8_state; each planted representation fault is seen by its check alone."""

import pytest
import torch
from helpers import run_one_path, spec

from gradfuzz_adapter.__main__ import main as adapter_main
from gradfuzz_adapter.client import make_request
from gradfuzz_adapter.errors import InvalidArgumentError
from gradfuzz_adapter.invariants import check_emulated
from gradfuzz_adapter.torch_backend import fp8
from gradfuzz_adapter.torch_backend.backend import TorchBackend

DELAYED = {
    "name": "DelayedScaling",
    "fp8_format": "HYBRID",
    "options": {"margin": "0", "amax_history_len": "4", "amax_compute_algo": "max"},
}
CURRENT = {"name": "Float8CurrentScaling", "fp8_format": "HYBRID", "options": {}}
BLOCK_1D = {"name": "Float8BlockScaling", "fp8_format": "E4M3", "options": {}}
# fp32 block scales: each block's grid its own, so a copy quantized twice shows.
BLOCK_1D_F32 = {
    "name": "Float8BlockScaling",
    "fp8_format": "E4M3",
    "options": {"use_f32_scales": "1"},
}
LINEAR = [{"name": "Linear", "attrs": {"out": 16}}]


@pytest.fixture(scope="module")
def backend():
    return TorchBackend()


def _run(backend, case_spec, fault=None):
    header, tensors = make_request(case_spec, paths=[{"name": "fused", "fusions": []}])
    return run_one_path(backend, header, tensors, fault)


def _states(result):
    return [c.get("fp8_state") for c in (result, *result.get("repeats", []))]


def _violations(result):
    return [v for s in _states(result) for v in (s or {}).get("violations", [])]


def _case(recipe, shape=(16, 16), dtype="bfloat16", **extra):
    return spec(LINEAR, shape=shape, dtype=dtype, recipe=recipe, **extra)


@pytest.mark.parametrize("recipe", [DELAYED, CURRENT, BLOCK_1D, BLOCK_1D_F32])
def test_clean_runs_check_every_tensor_and_find_nothing(backend, recipe):
    result = _run(backend, _case(recipe, repeat_calls=[{}]))
    assert result["status"] == "ok", result
    assert _violations(result) == []
    # Each call: the input and the weight in forward, the gradient in backward.
    assert [s["tensors_checked"] for s in _states(result)] == [3, 3]


def test_no_recipe_adds_nothing_to_the_verdict(backend):
    result = _run(backend, spec(LINEAR, shape=(4, 16)))
    assert result["status"] == "ok", result
    assert result.get("fp8_state") is None


@pytest.mark.parametrize(
    "fault, recipe, what",
    [
        ("torch-fp8-columnwise-copy-off-by-one-code", DELAYED, {"columnwise"}),
        ("torch-fp8-columnwise-copy-off-by-one-code", CURRENT, {"columnwise"}),
        ("torch-fp8-codes-rounded-toward-zero", CURRENT, {"codes"}),
        # 1D blocks: the column-wise copy is a cast of its own, rounded toward zero too.
        ("torch-fp8-codes-rounded-toward-zero", BLOCK_1D, {"codes", "columnwise"}),
        ("torch-fp8-block-columnwise-from-rowwise", BLOCK_1D_F32, {"columnwise"}),
    ],
)
def test_each_fault_is_seen_by_its_check(backend, fault, recipe, what):
    # Columns of 128 rows, so that the 128x1 blocks' scales differ from the 1x128 ones'.
    result = _run(backend, _case(recipe, shape=(256, 128), dtype="float32"), fault=fault)
    assert result["status"] == "ok", result
    found = _violations(result)
    assert found, result
    assert {v["what"] for v in found} == what, found
    assert {v["quantizer"].split("[")[0] for v in found} == {"quantized_tensor"}
    assert {v["op"] for v in found} == {0}


@pytest.mark.parametrize("recipe", [DELAYED, CURRENT])
def test_a_fused_gradient_cast_is_checked_as_the_tensor_it_hands_on(backend, recipe):
    # GELU's backward casts its gradient with GroupedLinear's grad-output quantizer (TE: the
    # fused dact + cast): the fault leaves every quantizer's own cast right and puts one
    # code of that cast's column-wise copy a step off, which only the check of that tensor
    # sees. Without the fault the same case has nothing to say.
    ops = [{"name": "GroupedLinear", "attrs": {"groups": 1, "out": 16}}, {"name": "GELU"}]
    case_spec = spec(ops, shape=(32, 16), dtype="float32", recipe=recipe)
    clean = _run(backend, case_spec)
    assert clean["status"] == "ok", clean
    assert _violations(clean) == []
    result = _run(backend, case_spec, fault="torch-fused-gradient-cast-columnwise-off-by-one-code")
    assert result["status"] == "ok", result
    found = _violations(result)
    assert {v["what"] for v in found} == {"columnwise"}, found
    assert _states(result)[0]["tensors_checked"] == _states(clean)[0]["tensors_checked"]


def test_the_references_are_exact_on_hand_made_tensors():
    torch.manual_seed(0)
    x = torch.randn(130, 260, dtype=torch.bfloat16) * 3
    for quantizer in (
        fp8.CurrentQuantizer("E4M3"),
        fp8.CurrentQuantizer("E5M2", pow2=True),
        fp8.BlockQuantizer("E4M3", 1),
        fp8.BlockQuantizer("E4M3", 2),
        fp8.BlockQuantizer("E5M2", 1, pow2=False),
    ):
        assert check_emulated(quantizer, x, quantizer(x)) == [], quantizer
    delayed = fp8.DelayedQuantizer("E4M3", history_len=2, margin=0, algo="max")
    delayed.scale = torch.tensor(37.3, dtype=torch.float32)
    assert check_emulated(delayed, x, delayed(x)) == []
    # One value of the row-wise copy one FP8 step off: the codes check names it.
    q = fp8.CurrentQuantizer("E4M3")(x)
    q.data = q.data.clone()
    q.data[3, 5] = q.data[3, 5] * (1 + 2.0**-3)
    q.data_t = q.data.t().contiguous()
    found = check_emulated(fp8.CurrentQuantizer("E4M3"), x, q)
    assert [w for w, _ in found] == ["codes"], found
    assert "element 785 " in found[0][1]  # [3, 5] of [130, 260]


def test_the_checks_switched_off_check_nothing_and_a_wrong_switch_is_refused(backend, monkeypatch):
    # GRADFUZZ_FP8_CHECKS=off (the benchmarks of the checks' cost): no tensor checked, no
    # delayed-scaling state judged, the values judged as ever.
    monkeypatch.setenv("GRADFUZZ_FP8_CHECKS", "off")
    result = _run(backend, _case(DELAYED, repeat_calls=[{}]))
    assert result["status"] == "ok", result
    assert all(not (s or {}).get("tensors_checked") for s in _states(result)), result
    assert all(not (s or {}).get("states") for s in _states(result)), result
    monkeypatch.setenv("GRADFUZZ_FP8_CHECKS", "no")
    with pytest.raises(InvalidArgumentError, match="GRADFUZZ_FP8_CHECKS must be on or off"):
        _run(backend, _case(DELAYED))
    # The adapter refuses to start with it, before any case.
    with pytest.raises(SystemExit) as stopped:
        adapter_main(["--backend", "torch"])
    assert stopped.value.code == 2
