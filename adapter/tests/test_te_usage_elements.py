"""The te backend's recipe-change and quantized-parameter usage elements (issue 30): the
recipe-off call, a new amax_history_len, the held quantized weights' copies and the
planted faults that reach them. On TE 2.20.2's Python over the stubbed extension
(te_stub.py), on the CPU: no kernel runs, so quantized tensors are built by hand and
written through a quantizer whose "kernel" is plain torch."""

import types

import pytest
import torch
from helpers import judge, run, spec, stubbed_te_backend

from gradfuzz_adapter import faults, recipes
from gradfuzz_adapter.te.backend import transposed_copies
from gradfuzz_adapter.te.faults import FAULTS

DELAYED = {
    "name": "DelayedScaling",
    "fp8_format": "HYBRID",
    "options": {"margin": "1", "amax_history_len": "4", "amax_compute_algo": "max"},
}
RESIDUAL = [
    {"name": "MakeExtraOutput", "output_bindings": [{"channel": "r", "output_to_caller": False}]},
    {"name": "ConstantScale", "attrs": {"scale": 0.75}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
]


@pytest.fixture(scope="module")
def backend():
    return stubbed_te_backend()


@pytest.fixture
def fp8_supported(backend, monkeypatch):
    """TE's cached support answers set to "supported" (quantization.py: check_fp8_support)."""
    from transformer_engine.pytorch import quantization

    monkeypatch.setattr(quantization, "_FP8_SUPPORT", (True, ""))
    monkeypatch.setattr(quantization, "_FP8_BLOCK_SCALING_SUPPORT", (True, ""))
    monkeypatch.setattr(backend.builder, "recipe_availability", {})
    return quantization


def _path(builder, recipe):
    """Enters a path of `recipe` (a spec recipe dict) on `builder`; returns its scope."""
    builder.recipe = recipes.parse_recipe(recipe)
    return builder.fusion_scope([])


# ----------------------------------------------------------------------------------------
# set_amax_history_len, recipe_off_scope


def test_a_new_history_length_is_a_new_recipe_of_the_same_class(backend, fp8_supported):
    import dataclasses

    builder = backend.builder
    with _path(builder, DELAYED):
        old = builder.path.te_recipe
        builder.set_amax_history_len(None, None, 7)
        new = builder.path.te_recipe
        assert type(new) is type(old) and new is not old
        assert old.amax_history_len == 4 and new.amax_history_len == 7
        for field in dataclasses.fields(old):
            if field.name != "amax_history_len":
                assert getattr(new, field.name) == getattr(old, field.name), field.name
    current = dict(DELAYED, name="Float8CurrentScaling", fp8_format="HYBRID", options={})
    with _path(builder, current), pytest.raises(ValueError, match="DelayedScaling"):
        builder.set_amax_history_len(None, None, 7)


def test_a_recipe_off_call_runs_outside_the_autocast_in_the_paths_state(backend, fp8_supported):
    manager = fp8_supported.FP8GlobalStateManager
    outer = manager.quantization_state
    seen = []

    def seq(x, *extras):
        seen.append((manager.is_fp8_enabled(), manager.quantization_state))
        return x

    builder = backend.builder
    with _path(builder, DELAYED):
        state = builder.path.fp8_state
        x = torch.ones(2, 2)
        assert builder.forward(seq, x, []) == [x]
        with builder.recipe_off_scope():
            builder.forward(seq, x, [])
            with builder.recipe_off_scope():
                builder.forward(seq, x, [])
            builder.forward(seq, x, [])
        builder.forward(seq, x, [])
    assert [enabled for enabled, _ in seen] == [True, False, False, False, True]
    assert all(s is state for _, s in seen)
    assert manager.quantization_state is outer and not manager.is_fp8_enabled()


def test_a_recipe_off_repeat_call_gives_the_first_calls_values(backend, fp8_supported):
    case_spec = spec(
        RESIDUAL,
        dtype="float32",
        recipe=DELAYED,
        repeat_calls=[{"recipe_off": True}, {"amax_history_len": 2}, {}],
    )
    case, results = run(backend, case_spec, paths=[{"name": "unfused", "fusions": []}])
    assert judge(case, results[0], all_channels=False) == []
    first = results[0]
    assert [r["status"] for r in first["repeats"]] == ["ok"] * 3, first["repeats"]
    for repeat in first["repeats"]:
        assert torch.equal(repeat["outputs"][0], first["outputs"][0])


# ----------------------------------------------------------------------------------------
# Quantized weights by hand


class _Codes:
    """A quantizer whose kernel is plain torch: codes = round(value), both copies written
    (what tex.quantize does for a Float8Tensor holding a transpose)."""

    rowwise_usage = columnwise_usage = True
    internal = False

    def copy(self):
        return self

    def update_quantized(self, src, dst, noop_flag=None):
        codes = src.round().clamp(0, 255).to(torch.uint8)
        dst._data.copy_(codes)
        if dst._transpose is not None:
            dst._transpose.copy_(codes.t())
            dst._transpose_invalid = False
        return dst


def _float8(values, transpose=True):
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor

    codes = values.round().to(torch.uint8)
    return Float8Tensor(
        shape=tuple(values.shape),
        dtype=torch.float32,
        data=codes.clone(),
        fp8_scale_inv=torch.ones(1),
        fp8_dtype=DType.kFloat8E4M3,
        device=torch.device("cpu"),
        data_transpose=codes.t().contiguous() if transpose else None,
        quantizer=_Codes(),
    )


def _blockwise(out_features, in_features, two_d=True):
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import (
        Float8BlockQuantizer,
        Float8BlockwiseQTensor,
    )

    quantizer = Float8BlockQuantizer(
        DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=2 if two_d else 1
    )
    rows = torch.randint(0, 255, (out_features, in_features), dtype=torch.uint8)
    row_scales = torch.rand(quantizer.get_scale_shape(rows.shape, columnwise=False))
    col_scales = torch.full(quantizer.get_scale_shape(rows.shape, columnwise=True), -1.0)
    bo, bi = -(-out_features // 128), -(-in_features // 128)
    col_scales[:bi, :bo] = row_scales[:bo, :bi].t()  # the padding differs: -1 against rand
    return Float8BlockwiseQTensor(
        shape=(out_features, in_features),
        dtype=torch.float32,
        rowwise_data=rows,
        rowwise_scale_inv=row_scales,
        columnwise_data=rows.t().contiguous(),
        columnwise_scale_inv=col_scales,
        fp8_dtype=DType.kFloat8E4M3,
        quantizer=quantizer,
        is_2D_scaled=two_d,
        device=torch.device("cpu"),
    )


def _pairs_equal(copies):
    return [torch.equal(r, c) for r, c in zip(copies[0::2], copies[1::2])]


def test_transposed_copies_of_a_per_tensor_weight(backend):
    w = _float8(torch.arange(6.0).reshape(2, 3))
    copies = transposed_copies(w)
    assert len(copies) == 2 and _pairs_equal(copies) == [True]
    w._transpose_invalid = True
    assert transposed_copies(w) is None
    assert transposed_copies(_float8(torch.ones(2, 3), transpose=False)) is None
    assert transposed_copies(torch.ones(2, 3)) is None


def test_transposed_copies_of_a_2d_block_scaled_weight_leave_the_padding_out(backend):
    w = _blockwise(200, 130)
    copies = transposed_copies(w)
    assert len(copies) == 4 and _pairs_equal(copies) == [True, True]
    assert copies[2].shape == (2, 2)  # ceil(200/128) x ceil(130/128), not the padded 4
    w._columnwise_data[0, 0] ^= 1
    assert _pairs_equal(transposed_copies(w)) == [False, True]
    assert transposed_copies(_blockwise(200, 130, two_d=False)) is None


def test_held_weights_are_the_quantized_linear_weights(backend):
    import types

    from gradfuzz_adapter.driver import HeldWeight

    quantized = types.SimpleNamespace(weight=_float8(torch.ones(2, 3)))
    plain = types.SimpleNamespace(weight=torch.ones(2, 3))
    ops_ = [
        types.SimpleNamespace(index=0, name="Linear"),
        types.SimpleNamespace(index=1, name="Linear"),
        types.SimpleNamespace(index=2, name="Bias"),
    ]
    case = types.SimpleNamespace(catalog_ops=ops_)
    held = backend.builder.held_weights([quantized, plain, quantized], case)
    assert len(held) == 1 and isinstance(held[0], HeldWeight)
    assert held[0].op == 0 and held[0].tensor is quantized.weight
    assert _pairs_equal(held[0].copies) == [True]


# ----------------------------------------------------------------------------------------
# The faults


def test_the_usage_faults_are_listed(backend):
    caps = {f["name"]: f for f in backend.hello()["capabilities"]["faults"]}
    for name in (
        "te-usage-quantized-weight-stale-transpose-after-step",
        "te-usage-history-len-change-zeroes-history",
        "te-usage-recipe-off-call-computes-with-fp8-weight",
    ):
        assert name in caps and caps[name]["description"]
        faults.resolve(FAULTS[name].target)  # the target exists in TE 2.20.2


def _write(w, value):
    with torch.no_grad():
        w.copy_(torch.full(tuple(w.shape), float(value)))


def test_a_quantized_weight_written_in_place_updates_both_copies(backend):
    w = torch.nn.Parameter(_float8(torch.ones(2, 3)), requires_grad=True)
    for value in (3, 5):
        _write(w, value)
        assert (w._data == value).all() and (w._transpose == value).all()


def test_the_stale_transpose_fault_spares_the_first_write_only(backend):
    w = torch.nn.Parameter(_float8(torch.ones(2, 3)), requires_grad=True)
    with faults.planted(FAULTS, "te-usage-quantized-weight-stale-transpose-after-step"):
        _write(w, 3)  # the case's values, at creation
        assert (w._data == 3).all() and (w._transpose == 3).all()
        _write(w, 5)  # an optimizer step
        assert (w._data == 5).all() and (w._transpose == 3).all()
        assert not w._transpose_invalid
        assert _pairs_equal(transposed_copies(w)) == [False]


def _delayed_op(monkeypatch, length):
    """A basic op with two forward quantizers and one backward one whose DelayedScaling
    states live on the CPU (quantization.py allocates them on CUDA by default)."""
    from transformer_engine.common.recipe import DelayedScaling
    from transformer_engine.pytorch import quantization
    from transformer_engine.pytorch.ops.op import BasicOperation

    original = quantization.RecipeState.create

    def on_cpu(recipe, **kwargs):
        return original(recipe, **dict(kwargs, device=torch.device("cpu")))

    monkeypatch.setattr(quantization.RecipeState, "create", staticmethod(on_cpu))

    class Op(BasicOperation):
        def num_quantizers(self, mode):
            return 2 if mode == "forward" else 1

        def op_forward(self, *args, **kwargs):
            raise NotImplementedError

        op_backward = op_forward

    op = Op()
    op.reset_recipe_state(recipe=DelayedScaling(amax_history_len=length))
    return op, DelayedScaling


def test_a_new_history_length_keeps_the_history_and_the_fault_zeroes_it(backend, monkeypatch):
    for planted, kept in ((None, True), ("te-usage-history-len-change-zeroes-history", False)):
        op, DelayedScaling = _delayed_op(monkeypatch, 4)
        state = op._fp8_metas["forward"]["scaling_fwd"]
        with torch.no_grad():
            state.amax_history.copy_(torch.arange(1.0, 9.0).reshape(4, 2))
        with faults.planted(FAULTS, planted):
            op.reset_recipe_state(recipe=DelayedScaling(amax_history_len=4))  # same length
            assert state.amax_history.sum() == 36
            op.reset_recipe_state(recipe=DelayedScaling(amax_history_len=2))
        history = op._fp8_metas["forward"]["scaling_fwd"].amax_history
        assert history.shape == (2, 2)
        expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]]) if kept else torch.zeros(2, 2)
        assert torch.equal(history, expected), planted


def test_the_recipe_off_fault_computes_with_an_fp8_weight_after_quantized_calls(
    backend, monkeypatch
):
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    seen = []

    def original(self, ctx, input_, *args):  # BasicLinear.op_forward: the weight it reads
        seen.append(self.weight.detach().clone())
        return input_

    fault = FAULTS["te-usage-recipe-off-call-computes-with-fp8-weight"]
    op_forward = fault.replace(original)
    w = torch.tensor([[0.3, -1.7, 2.9], [0.011, 5.0, -0.2]])
    op = types.SimpleNamespace(weight=torch.nn.Parameter(w.clone()))
    enabled = [False]
    monkeypatch.setattr(
        FP8GlobalStateManager, "is_fp8_enabled", classmethod(lambda cls: enabled[0])
    )
    for on in (False, True, False):  # never quantized, quantized, FP8 off after it
        enabled[0] = on
        op_forward(op, None, torch.ones(3), None, None)
    assert torch.equal(seen[0], w) and torch.equal(seen[1], w)
    e4m3 = (w * (448 / 5.0)).to(torch.float8_e4m3fn).float() / (448 / 5.0)
    assert torch.equal(seen[2], e4m3) and not torch.equal(seen[2], w)
    assert torch.equal(op.weight.data, w)  # the parameter keeps its values


# ----------------------------------------------------------------------------------------
# several_sequentials: the te hooks read a chain as one Sequential


def test_a_chain_of_sequentials_gives_one_sequentials_values_and_plans(backend):
    ops = RESIDUAL + [{"name": "Boundary"}, {"name": "ConstantScale", "attrs": {"scale": 2.0}}]
    paths = [{"name": "unfused", "fusions": []}]
    one_case, (one,) = run(backend, spec(ops, dtype="float32"), paths=paths)
    case, (chain,) = run(backend, spec(ops, dtype="float32", several_sequentials=True), paths)
    assert judge(case, chain, all_channels=False) == []
    assert torch.equal(chain["outputs"][0], one["outputs"][0])
    assert chain["plans"] == one["plans"] and len(chain["plans"]) == 2
