"""FP8 recipes: the recipe table and parser, the emulation's quantize-dequantize against
hand-computed values (docs/BACKENDS.md "Recipes"), DelayedScaling's history across the
calls of one Sequential, and the torch backend running recipe cases end to end."""

import pytest
import torch
from helpers import run, spec

from gradfuzz_adapter import catalog, recipes
from gradfuzz_adapter.torch_backend import fp8
from gradfuzz_adapter.torch_backend.backend import TorchBackend
from gradfuzz_adapter.torch_backend.runtime import BasicOp, Boundary, Sequential

E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def e4m3(values):
    return torch.tensor(values, dtype=torch.float32)


# ----------------------------------------------------------------------------------------
# The cast and the scale


def test_the_cast_saturates_at_each_formats_maximum_and_rounds_to_nearest_even():
    one = torch.ones(())
    got = fp8.cast_to_fp8(e4m3([448.0, 500.0, -1e9, 464.0, 2.0**-10]), one, "E4M3")
    # 464 is halfway between 448 and the (absent) 480: saturates; 2^-10 is half the smallest
    # E4M3 subnormal 2^-9: ties to even, 0.
    assert got.float().tolist() == [448.0, 448.0, -448.0, 448.0, 0.0]
    got = fp8.cast_to_fp8(e4m3([57344.0, 60000.0, 1e9]), one, "E5M2")
    assert got.float().tolist() == [57344.0, 57344.0, 57344.0]
    assert torch.isnan(fp8.cast_to_fp8(e4m3([float("nan")]), one, "E4M3").float()).all()
    assert fp8.FORMATS["E4M3"][1] == E4M3_MAX and fp8.FORMATS["E5M2"][1] == E5M2_MAX


def test_current_scaling_of_amax_3_5_lands_on_the_scaled_e4m3_grid():
    x = e4m3([3.5, -3.5, 1.0, 0.3, 0.01, 0.0])
    # scale = 448 / 3.5 = 128: 0.3 * 128 = 38.4 -> 40 (E4M3 spacing 4 in [32, 64)),
    # 0.01 * 128 = 1.28 -> 1.25 (spacing 1/8 in [1, 2)).
    got = fp8.current_scaling_qdq(x, "E4M3")
    assert got.tolist() == [3.5, -3.5, 1.0, 40 / 128, 1.25 / 128, 0.0]
    # E5M2: scale 57344 / 3.5 = 16384: 0.3 -> 4915.2 -> 5120 (spacing 1024 in [4096, 8192)).
    got = fp8.current_scaling_qdq(x, "E5M2")
    assert got[3].item() == 5120 / 16384
    # Every value is an FP8 number times 1/scale.
    assert torch.equal((got * 16384).to(torch.float8_e5m2).double(), got * 16384)


def test_the_scale_follows_tes_compute_scale_from_amax():
    scale = fp8.compute_scale
    assert scale(torch.tensor(3.5), E4M3_MAX).item() == 128.0
    # 448 / 3 = 149.33: the power of two at or below it.
    assert scale(torch.tensor(3.0), E4M3_MAX, pow2=True).item() == 128.0
    assert scale(torch.tensor(3.0), E4M3_MAX).item() == pytest.approx(149.3333, rel=1e-6)
    for bad in (0.0, float("inf"), float("nan")):
        assert scale(torch.tensor(bad), E4M3_MAX).item() == 1.0
    # An amax so small the quotient overflows fp32: the input dtype's largest value.
    assert scale(torch.tensor(1e-45), E4M3_MAX).item() == torch.finfo(torch.float32).max
    # epsilon floors the amax.
    assert scale(torch.tensor(0.5), E4M3_MAX, epsilon=4.0).item() == 112.0


def test_block_scaling_gives_each_128_block_its_own_scale_and_copies_differ():
    x = torch.zeros(2, 256)
    x[0, :128] = 0.3
    x[0, 0] = 3.5  # block (0, 0): amax 3.5, scale 128
    x[0, 128:] = 0.3  # block (0, 1): amax 0.3, scale 448/0.3
    x[1] = 0.3
    got = fp8.block_scaling_qdq(x, "E4M3", 1, pow2=False)
    assert got[0, 1].item() == 40 / 128  # on the grid of its block's amax 3.5
    assert got[0, 200].item() == pytest.approx(0.3, abs=1e-7)  # its block's max: exact-ish
    # The column-wise copy (blocks along the rows) puts 0.3 of row 1 in a block whose amax
    # is 3.5 for column 0 only.
    col = fp8.block_scaling_qdq(x, "E4M3", 1, along_rows=True, pow2=False)
    assert col[1, 0].item() == 40 / 128 and col[1, 1].item() == pytest.approx(0.3, abs=1e-7)
    # 2D: one 128x128 tile; the whole [2, 128] left half shares amax 3.5.
    tile = fp8.block_scaling_qdq(x, "E4M3", 2, pow2=False)
    assert tile[1, 0].item() == 40 / 128 and tile[1, 200].item() == pytest.approx(0.3, abs=1e-7)


# ----------------------------------------------------------------------------------------
# Delayed scaling


def test_delayed_scaling_scale_after_one_and_two_calls():
    q = fp8.DelayedQuantizer("E4M3", history_len=2, margin=0, algo="max")
    # Call 1 quantizes with the initial scale 1: 0.3 -> 0.3125 (spacing 2^-5 near 0.3).
    assert q(e4m3([3.5, 0.3])).data.tolist() == [3.5, 0.3125]
    q.update()
    assert q.scale.item() == 128.0 and q.history.tolist() == [0.0, 3.5]
    # Call 2 (amax 2) uses 128; the window still holds 3.5.
    assert q(e4m3([2.0, 0.3])).data.tolist() == [2.0, 40 / 128]
    q.update()
    assert q.scale.item() == 128.0 and q.history.tolist() == [0.0, 2.0]
    q(e4m3([2.0]))
    q.update()
    assert q.scale.item() == 224.0  # 3.5 left the window of two


def test_delayed_scaling_margin_most_recent_and_an_amax_that_accumulates():
    q = fp8.DelayedQuantizer("E5M2", history_len=4, margin=1, algo="most_recent")
    q(e4m3([4.0]))
    q(e4m3([8.0]))  # no update in between (a no_grad call): slot 0 keeps the maximum
    q.update()
    assert q.scale.item() == E5M2_MAX / 8 / 2
    q(e4m3([1.0]))
    q.update()
    assert q.scale.item() == E5M2_MAX / 1 / 2  # most_recent ignores the older 8
    q.update()  # nothing recorded: amax 0 keeps the scale
    assert q.scale.item() == E5M2_MAX / 2


def test_delayed_scaling_history_lives_in_the_ops_across_calls_of_one_sequential():
    recipe = recipes.parse_recipe(
        {"name": "DelayedScaling", "fp8_format": "HYBRID", "options": {"amax_history_len": "2"}}
    )
    op = BasicOp("Linear", {"out": 4}, [3, 4])
    with torch.no_grad():
        op.params[0].copy_(torch.eye(4) * 0.5)
    op.params[0].requires_grad_(True)
    op.quantization = fp8.OpQuantization("Linear", {"out": 4}, recipe)
    seq = Sequential(op)
    linear = op.quantization.linear[0]
    scales = []
    for amax in (3.5, 7.0):
        x = torch.full((3, 4), amax / 2, dtype=torch.float64)
        x[0, 0] = amax
        x.requires_grad_(True)
        y = seq(x)
        fp8.update_after_forward([op.quantization])
        y.backward(torch.ones_like(y))
        fp8.update_after_backward([op.quantization])
        scales.append((linear.input.scale.item(), linear.grad_output.scale.item()))
    # After call 1: input amax 3.5 -> 128; grad_output (E5M2 under HYBRID) amax 1 -> 57344.
    # After call 2: the window [3.5, 7] -> 64; grad_output still 1.
    assert scales == [(128.0, E5M2_MAX), (64.0, E5M2_MAX)]
    assert linear.weight.scale.item() == E4M3_MAX / 0.5


# ----------------------------------------------------------------------------------------
# The quantized ops


def test_quantized_linear_computes_on_the_quantized_operands():
    recipe = recipes.parse_recipe({"name": "Float8CurrentScaling", "fp8_format": "HYBRID"})
    quantizers = fp8.LinearQuantizers(recipe)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 8, generator=gen, dtype=torch.float32, requires_grad=True)
    w = torch.randn(6, 8, generator=gen, dtype=torch.float32, requires_grad=True)
    y = fp8.quantized_linear(x, w, quantizers)
    qx = fp8.current_scaling_qdq(x, "E4M3")
    qw = fp8.current_scaling_qdq(w, "E4M3")
    assert torch.equal(y, (qx @ qw.t()).float())
    assert not torch.allclose(y, x @ w.t(), rtol=1e-4, atol=1e-4)  # the quantization shows
    dy = torch.randn(4, 6, generator=gen)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    qdy = fp8.current_scaling_qdq(dy, "E5M2")
    assert torch.equal(dx, (qdy @ qw).float())
    assert torch.equal(dw, (qdy.t() @ qx).float())


def _grouped_then(next_name, recipe, *, boundary=False):
    """GroupedLinear (2 groups, in 3, out 4, scale_bias) then `next_name` (out 4) under
    `recipe`, rows 5 split (3, 2); returns the Sequential's ops and (x, sizes, scales)."""
    grouped_attrs = {"groups": 2.0, "out": 4.0, "bias": 1.0, "scale_bias": 1.0}
    grouped = BasicOp("GroupedLinear", grouped_attrs, [5, 3])
    after = BasicOp(next_name, {}, [5, 4])
    gen = torch.Generator().manual_seed(11)
    for op in (grouped, after):
        with torch.no_grad():
            for p in op.params:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
                p.requires_grad_(True)
        op.quantization = fp8.OpQuantization(op.name, op.attrs, recipe)
    x = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    scales = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    modules = [grouped, Boundary(), after] if boundary else [grouped, after]
    return Sequential(*modules), grouped, (x, torch.tensor([3, 2]), scales)


@pytest.mark.parametrize("boundary", [False, True])
def test_a_grouped_linears_gradient_arrives_cast_by_the_next_op(boundary):
    # TE: Bias (like an activation) casts its input gradient with the GroupedLinear's group-0
    # grad_output quantizer; the GroupedLinear reduces the bias and scales gradients from
    # that and quantizes it per group again. DelayedScaling's first call: scale 1.
    recipe = recipes.parse_recipe(
        {"name": "DelayedScaling", "fp8_format": "HYBRID", "options": {"amax_history_len": "2"}}
    )
    seq, grouped, (x, sizes, scales) = _grouped_then("Bias", recipe, boundary=boundary)
    g = torch.linspace(-1.3, 1.7, 20, dtype=torch.float64).reshape(5, 4)
    g[:3] /= 64  # group 0's part far smaller: the whole tensor's amax is group 1's
    y = seq(x, sizes, scales)
    _, _, db, ds = torch.autograd.grad(y, (x, grouped.params[0], grouped.params[1], scales), g)
    one = torch.ones((), dtype=torch.float32)
    dy = g if boundary else fp8.quantize_dequantize(g, one, "E5M2")
    for k, rows in enumerate((slice(0, 3), slice(3, 5))):
        assert torch.allclose(db[k], (dy[rows] * scales[rows, None]).sum(0), rtol=1e-12, atol=0)
        assert torch.allclose(ds[rows], dy[rows] @ grouped.params[1][k], rtol=1e-12, atol=0)
    group0 = grouped.quantization.linear[0].grad_output
    expected_amax = g[:3].abs().max() if boundary else g.abs().max()
    assert group0.history[0].item() == pytest.approx(expected_amax.item(), rel=1e-6)


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override_leaves_the_backward_unquantized(override):
    recipe = recipes.parse_recipe(
        {"name": "Float8CurrentScaling", "options": {"backward_override": override}}
    )
    x = torch.linspace(-2, 3, 32, dtype=torch.float64).reshape(4, 8).requires_grad_(True)
    w = torch.linspace(-1, 1, 48, dtype=torch.float64).reshape(6, 8).requires_grad_(True)
    y = fp8.quantized_linear(x, w, fp8.LinearQuantizers(recipe))
    dy = torch.linspace(-0.7, 0.9, 24, dtype=torch.float64).reshape(4, 6)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    if override == "high_precision":
        expected_dx, expected_dw = dy @ w.detach(), dy.t() @ x.detach()
    else:
        qx = fp8.current_scaling_qdq(x, "E4M3")
        qw = fp8.current_scaling_qdq(w, "E4M3")
        expected_dx, expected_dw = dy @ qw, dy.t() @ qx
    assert torch.equal(dx, expected_dx) and torch.equal(dw, expected_dw)


def test_cache_quantized_input_keeps_the_forward_and_quantizes_the_derivatives_point():
    x = torch.tensor([[0.3, -1.7, 2.9, 0.05]], dtype=torch.float32, requires_grad=True)
    y = fp8.cached_input_activation(catalog.gelu, x)
    assert torch.equal(y, catalog.gelu(x))
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    xq = fp8.current_scaling_qdq(x, "E4M3").float().requires_grad_(True)
    (expected,) = torch.autograd.grad(catalog.gelu(xq).sum(), xq)
    assert torch.equal(dx, expected)
    (plain,) = torch.autograd.grad(catalog.gelu(x).sum(), x)
    assert not torch.equal(dx, plain)


# ----------------------------------------------------------------------------------------
# The recipe table and parser


def test_parse_recipe_fills_tes_defaults_and_names_what_is_wrong():
    recipe = recipes.parse_recipe({"name": "DelayedScaling"})
    assert recipe.fp8_format == "HYBRID" and recipe.options == {
        "margin": 0,
        "amax_history_len": 1024,
        "amax_compute_algo": "max",
    }
    assert recipe.format_for(backward=True) == "E5M2"
    assert recipe.format_for(backward=False) == "E4M3"
    assert recipes.parse_recipe(None) is None
    block = recipes.parse_recipe(
        {"name": "Float8BlockScaling", "options": {"block_scaling_dims": "1,1,2"}}
    )
    assert block.fp8_format == "E4M3"
    assert recipes.te_kwargs(block) == {
        "use_f32_scales": False,
        "backward_override": None,
        "x_block_scaling_dim": 1,
        "w_block_scaling_dim": 1,
        "grad_block_scaling_dim": 2,
    }
    for bad, message in (
        ({"name": "FP16"}, "unknown recipe 'FP16'"),
        ({"name": "DelayedScaling", "fp8_format": "E5M2"}, "fp8_format must be one of"),
        ({"name": "DelayedScaling", "options": {"margn": "1"}}, "unknown recipe options"),
        ({"name": "DelayedScaling", "options": {"margin": "-1"}}, "integer >= 0"),
        ({"name": "Float8BlockScaling", "options": {"block_scaling_dims": "2,2,1"}}, "one of"),
        ({"name": "NVFP4BlockScaling", "fp8_format": "HYBRID"}, "fp8_format"),
    ):
        with pytest.raises(ValueError, match=message):
            recipes.parse_recipe(bad)


def test_every_offered_option_value_parses():
    for name, info in recipes.RECIPES.items():
        for fmt in info.fp8_formats:
            for key, values in info.options.items():
                for value in values:
                    recipe = recipes.parse_recipe(
                        {"name": name, "fp8_format": fmt, "options": {key: value}}
                    )
                    assert recipe.name == name


# ----------------------------------------------------------------------------------------
# The torch backend


@pytest.fixture(scope="module")
def backend():
    return TorchBackend()


def test_torch_capabilities_list_the_emulated_recipes(backend):
    caps = backend.hello()["capabilities"]
    by_name = {r["name"]: r for r in caps["recipes"]}
    assert set(by_name) == set(recipes.RECIPES)
    for entry in caps["recipes"]:
        assert set(entry) == {"name", "available", "reason", "fp8_formats", "options"}
        assert all(isinstance(v, str) for vs in entry["options"].values() for v in vs)
    assert [n for n, r in by_name.items() if r["available"]] == [
        "DelayedScaling",
        "Float8CurrentScaling",
        "Float8BlockScaling",
    ]
    assert by_name["MXFP8BlockScaling"]["reason"] == (
        "the torch backend does not emulate MXFP8BlockScaling"
    )
    assert by_name["DelayedScaling"]["fp8_formats"] == ["E4M3", "HYBRID"]
    assert caps["ops"]["GELU"]["options"]["cache_quantized_input"] == [0, 1]


LINEAR_CASE = [{"name": "Linear", "attrs": {"out": 6}}, {"name": "GELU"}]


def test_a_recipe_case_runs_quantized_on_the_torch_backend(backend):
    plain_case = spec(LINEAR_CASE, shape=(4, 8), dtype="float32", seed=5)
    recipe = {"name": "Float8CurrentScaling", "fp8_format": "HYBRID", "options": {}}
    case, results = run(backend, dict(plain_case, recipe=recipe))
    _, plain = run(backend, plain_case)
    got, want = results[0], plain[0]
    assert got["status"] == "ok"
    x = case.input.float()
    w = case.ops[0].params[0].float()
    qx = fp8.current_scaling_qdq(x, "E4M3")
    qw = fp8.current_scaling_qdq(w, "E4M3")
    expected = catalog.gelu((qx @ qw.t()).float())
    assert torch.equal(got["outputs"][0].float(), expected)
    assert not torch.equal(got["outputs"][0], want["outputs"][0])


def test_an_unemulated_recipe_is_unsupported_and_an_unknown_one_an_error(backend):
    case_spec = spec(LINEAR_CASE, dtype="float32", recipe={"name": "MXFP8BlockScaling"})
    _, results = run(backend, case_spec)
    assert results[0]["status"] == "unsupported"
    assert "does not emulate MXFP8BlockScaling" in results[0]["reason"]
    with pytest.raises(ValueError, match="unknown recipe 'Float4'"):
        run(backend, spec(LINEAR_CASE, recipe={"name": "Float4"}))
