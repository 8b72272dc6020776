"""The te backend. Its TE-free parts (op mapping, fusion naming, error classification) are
tested as they are; the rest runs on TE 2.20.2's real Python code (OperationFuser,
Sequential, op.py, the ops that need no kernel) with the compiled extension stubbed
(te_stub.py), on the CPU, where TE's source and its Python dependencies are present."""

import types

import pytest
import torch
from helpers import judge, run, run_one_path, spec, stubbed_te_backend

from gradfuzz_adapter.case import decode_case
from gradfuzz_adapter.client import make_request, path_result
from gradfuzz_adapter.protocol import TensorList
from gradfuzz_adapter.te import op_table, params
from gradfuzz_adapter.te.classify import classify
from gradfuzz_adapter.te.fusions import fusion_name, only_fusions
from gradfuzz_adapter.te.op_table import op_recipe, render_call

# ----------------------------------------------------------------------------------------
# Without TE


def test_op_recipes_use_tes_constructors_and_option_names():
    cases = {
        ("Linear", (("out", 6), ("accumulate_into_main_grad", 1))): (
            "te.ops.BasicLinear(8, 6, device=DEVICE, dtype=DTYPE, accumulate_into_main_grad=True)"
        ),
        ("SwiGLU", (("interleave", 2), ("cache_quantized_input", 1))): (
            "te.ops.SwiGLU(cache_quantized_input=True, glu_interleave_size=2)"
        ),
        ("ScaledSwiGLU", (("interleave", 0),)): (
            "te.ops.ScaledSwiGLU(glu_interleave_size=None, activation_recompute_in_mlp=False)"
        ),
        (
            "GroupedLinear",
            (("groups", 3), ("out", 4), ("bias", 1), ("scale_bias", 1), ("delay_wgrad_compute", 1)),
        ): (
            "te.ops.GroupedLinear(3, 8, 4, device=DEVICE, dtype=DTYPE, bias=True, "
            "accumulate_into_main_grad=False, single_grouped_weight=False, "
            "single_grouped_bias=False, delay_wgrad_compute=True, scale_bias=True)"
        ),
        ("LayerNorm", (("eps", 1e-3), ("zero_centered_gamma", 1))): (
            "te.ops.LayerNorm(8, eps=0.001, device=DEVICE, dtype=DTYPE, "
            "zero_centered_gamma=True, sm_margin=0)"
        ),
        ("Reshape", (("features", 4),)): "te.ops.Reshape((-1, 4))",
        ("MakeExtraOutput", (("in_place", 1),)): "te.ops.MakeExtraOutput(in_place=True)",
        ("DualExtraOutput", (("s0", 2.0), ("s1", -1.0))): (
            "DualExtraOutput(2.0, -1.0, output_style='vector')"
        ),
    }
    for (name, attrs), expected in cases.items():
        assert render_call(*op_recipe(name, dict(attrs), [4, 8])) == expected
    with pytest.raises(NotImplementedError):
        op_recipe("Linear", {"out": 4}, [4, 8], "generator")  # TE's own ops return tuples


def test_one_op_table_drives_the_mapping_the_classes_and_the_options():
    from gradfuzz_adapter import catalog

    # Every catalog op has exactly one entry; TE's classes and the custom ops partition it.
    assert set(op_table.OPS) == set(catalog.OP_NAMES)
    assert set(op_table.TE_CLASSES) | set(op_table.CUSTOM_OPS) == set(op_table.OPS)
    assert not set(op_table.TE_CLASSES) & set(op_table.CUSTOM_OPS)
    assert op_table.CUSTOM_OPS == ("Dispatch", "Combine", "RowStat", "DualExtraOutput")
    for name, op in op_table.OPS.items():
        callee, _, _ = op_recipe(name, {}, [4, 8])
        assert callee == op.implementation, name
    # The option domains come from the same entries; single grouped params only where run.
    assert op_table.te_options(True)["GroupedLinear"]["single_grouped_weight"] == [0, 1]
    narrowed = op_table.te_options(False)["GroupedLinear"]
    assert narrowed["single_grouped_weight"] == [0] and narrowed["single_grouped_bias"] == [0]
    assert narrowed["delay_wgrad_compute"] == [0, 1]
    assert op_table.OPS["GroupedLinear"].options["single_grouped_bias"] == [0, 1]  # unchanged
    with pytest.raises(NotImplementedError, match="no mapping for catalog op 'Nope'"):
        op_recipe("Nope", {}, [4, 8])


def test_scripts_build_the_recipe_object_as_a_user_writes_it():
    from gradfuzz_adapter.te import embed

    delayed = {"name": "DelayedScaling", "fp8_format": "E4M3", "options": {"margin": "1"}}
    assert embed.recipe_call(delayed) == (
        "te_recipe.DelayedScaling(fp8_format=te_recipe.Format.E4M3, margin=1, "
        "amax_history_len=1024, amax_compute_algo='max')"
    )
    assert embed.recipe_call(None) == "None"
    block = {"name": "Float8BlockScaling", "options": {"backward_override": "dequantized"}}
    assert embed.recipe_call(block) == (
        "te_recipe.Float8BlockScaling(fp8_format=te_recipe.Format.E4M3, use_f32_scales=False, "
        "backward_override='dequantized', x_block_scaling_dim=1, w_block_scaling_dim=2, "
        "grad_block_scaling_dim=1)"
    )


def test_scripts_embed_the_te_modules_whole_without_importing_them():
    from gradfuzz_adapter.te import embed

    sections = embed.script_sections()
    titles = [t for t, _ in sections]
    assert titles[-1] is None and sections[-1][1] == "register_fusions()\n"
    text = "".join(source for _, source in sections)
    for expected in (
        "def param_groups(op, name):",
        "def only_fusions(operation_fuser, names):",
        "class Dispatch(CustomOp):",
        "class FusedResidual(te.ops.FusedOperation):",
        "def register_fusions():",
    ):
        assert expected in text, expected
    # Docstrings and top-level imports are left to the script.
    assert "import transformer_engine" not in text.split("def register_fusions")[0]
    assert not any(line.startswith(("import ", "from ")) for line in text.splitlines())


def test_fusions_are_named_after_their_fused_op():
    class ForwardLinearBiasAdd:
        @staticmethod
        def fuse_forward_ops(ops, **unused):
            return ops

    def fuse_glu_ops(ops, **unused):
        return ops

    assert fusion_name(ForwardLinearBiasAdd.fuse_forward_ops) == "ForwardLinearBiasAdd"
    assert fusion_name(fuse_glu_ops) == "GroupedMLP_CuTeGEMMGLU"
    fuse_glu_ops.gradfuzz_fusion_name = "FusedResidual.joint"
    assert fusion_name(fuse_glu_ops) == "FusedResidual.joint"


def test_only_fusions_narrows_the_lists_and_restores_them_on_error():
    class Fuser:
        forward_backward_fusion_functions = []
        forward_fusion_functions = []
        backward_fusion_functions = []

    class BackwardLinearAdd:
        @staticmethod
        def fuse_backward_ops(ops, **unused):
            return ops

    class BackwardLinearScale:
        @staticmethod
        def fuse_backward_ops(ops, **unused):
            return ops

    original = [BackwardLinearAdd.fuse_backward_ops, BackwardLinearScale.fuse_backward_ops]
    Fuser.backward_fusion_functions = original
    with pytest.raises(KeyError):
        with only_fusions(Fuser, ["BackwardLinearScale"]):
            assert Fuser.backward_fusion_functions == [BackwardLinearScale.fuse_backward_ops]
            assert Fuser.forward_fusion_functions == []
            raise KeyError("a failing path")
    assert Fuser.backward_fusion_functions is original


@pytest.mark.parametrize(
    "exc, expected",
    [
        (
            ValueError("Extra tensor channel 'c' has multiple producers (ops 0 and 1)"),
            ("error", "duplicate-producer"),
        ),
        (
            ValueError("Extra tensor channel 'c' consumed by op 1 (AddExtraInput) has no producer"),
            ("error", "missing-producer"),
        ),
        (
            ValueError("Extra tensor channel 'c' consumed by op 0 (X) has no earlier producer"),
            ("error", "producer-not-earlier"),
        ),
        (
            RuntimeError("Cannot change extra tensor channels of RowStat because ..."),
            ("error", "locked"),
        ),
        (ValueError("Expected 2 extra inputs but got 1"), ("error", "extra-input-count")),
        (
            IndexError("Extra input index 3 is out of range for AddExtraInput with 1 extra inputs"),
            ("error", "slot-out-of-range"),
        ),
        (
            ValueError("Extra output channel must be a non-empty string or None"),
            ("error", "invalid-channel-name"),
        ),
        (
            RuntimeError("Op 0 extra output 0 is public, but FusedResidual returned None"),
            ("error", "public-output-returned-none"),
        ),
        (
            RuntimeError(
                "Op 0 extra output 0 is required by an operation outside its forward "
                "fusion, but X returned None"
            ),
            ("error", "needed-outside-its-fusion"),
        ),
        (
            RuntimeError("Found mismatch after fusing operations (basic_ops=[], fused_ops=[])"),
            ("error", "plan-mismatch"),
        ),
        (TypeError("object of type 'generator' has no len()"), ("error", "generator-misuse")),
        (
            RuntimeError("Expected op 0 to generate 3 extra outputs, but got 2"),
            ("error", "extra-count"),
        ),
        (
            RuntimeError("split_with_sizes expects split_sizes to sum exactly to 6"),
            ("error", "invalid-argument"),
        ),
        (
            RuntimeError("CUDA error: an illegal memory access was encountered"),
            ("error", "unrecognized"),
        ),
    ],
)
def test_tes_messages_map_to_error_kinds(exc, expected):
    assert classify(exc) == expected


@pytest.mark.parametrize(
    "exc",
    [
        NotImplementedError("anything"),
        ValueError("Supported dtypes are float32, float16, bfloat16 (got torch.float64)"),
        RuntimeError("Unsupported dtype (torch.float64)"),
        RuntimeError("Bias 1 has requires_grad=False, but expected requires_grad=True."),
        RuntimeError(
            "Single grouped parameters require the native grouped-tensor GroupedLinear path, "
            "which is unavailable for the current device"
        ),
        ValueError(
            "ScaledSwiGLU does not support activation recomputation in the fused grouped MLP"
        ),
    ],
)
def test_documented_limits_are_unsupported(exc):
    status, reason = classify(exc)
    assert status == "unsupported" and reason


# ----------------------------------------------------------------------------------------
# On TE's Python code


@pytest.fixture(scope="module")
def backend():
    return stubbed_te_backend()


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


RESIDUAL = [
    {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
    {"name": "ConstantScale", "attrs": {"scale": 0.75}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
]
ALL_PATHS = [
    {"name": "joint", "fusions": ["FusedResidual.joint"]},
    {"name": "forward_fused", "fusions": ["FusedResidual.forward"]},
    {"name": "backward_fused", "fusions": ["FusedResidual.backward"]},
    {"name": "unfused", "fusions": []},
]


def test_hello_lists_tes_fusions_and_ours(backend):
    caps = backend.hello()["capabilities"]
    fusions = {(f["name"], f["pass"]) for f in caps["fusions"]}
    assert {
        ("FusedResidual.joint", "joint"),
        ("FusedResidual.forward", "forward"),
        ("FusedResidual.backward", "backward"),
        ("ForwardLinearBiasAdd", "forward"),
        ("ForwardLinearBiasActivation", "forward"),
        ("ForwardLinearScaleAdd", "forward"),
        ("BackwardLinearAdd", "backward"),
        ("BackwardLinearScale", "backward"),
        ("BackwardActivationBias", "backward"),
        ("BackwardAddRMSNorm", "backward"),
    } <= fusions
    assert caps["deviations"] == ["surplus_extra_inputs_ignored", "lazy_fuser_construction"]
    assert caps["devices"] == ["cuda"] and "float64" not in caps["dtypes"]
    assert caps["ops"]["Linear"]["implementation"] == "te.ops.BasicLinear"
    assert caps["ops"]["Dispatch"]["output_styles"] == ["vector", "generator"]
    assert caps["ops"]["GroupedLinear"]["options"]["delay_wgrad_compute"] == [0, 1]


@pytest.mark.parametrize("to_caller", [False, True])
def test_fused_residual_in_every_pass_matches_the_reference(backend, to_caller):
    ops = [dict(RESIDUAL[0], output_bindings=[bound("r", to_caller)])] + RESIDUAL[1:]
    case, results = run(backend, spec(ops, dtype="float32"), paths=ALL_PATHS)
    names = {r["name"]: r for r in results}
    for result in results:
        assert judge(case, result, all_channels=False) == [], result["name"]
    assert names["joint"]["plans"][0]["forward"] == [
        {"name": "FusedResidual.joint", "begin": 0, "end": 3, "fused": True}
    ]
    assert names["forward_fused"]["plans"][0]["forward"][0]["name"] == "FusedResidual.forward"
    assert [g["fused"] for g in names["forward_fused"]["plans"][0]["backward"]] == [False] * 3
    assert names["backward_fused"]["plans"][0]["backward"][0]["name"] == "FusedResidual.backward"
    # The channel's gradient is visible where the producer's backward group holds none of
    # its consumers, and is then the reference's.
    assert set(names["unfused"]["channel_grads"][0]) == {"r"}
    assert set(names["forward_fused"]["channel_grads"][0]) == {"r"}
    assert names["joint"]["channel_grads"] == [{}]


def test_fused_residual_hands_the_channel_to_a_consumer_outside(backend):
    ops = RESIDUAL + [{"name": "AddExtraInput", "input_channels": ["r"]}]
    case, results = run(backend, spec(ops, dtype="float32"), paths=ALL_PATHS[:1])
    assert judge(case, results[0], all_channels=False) == []
    assert results[0]["plans"][0]["forward"][0]["fused"]


def test_custom_ops_and_mixed_routing_match_the_reference(backend):
    ops = [
        {
            "name": "Dispatch",
            "attrs": {"groups": 3},
            "output_bindings": [bound("sizes", True), {"channel": None}, bound("map")],
        },
        {"name": "RowStat", "output_bindings": [bound("s", True)]},
        {
            "name": "DualExtraOutput",
            "attrs": {"s0": 0.5, "s1": 2.0},
            "output_bindings": [bound("a"), {"channel": None}],
        },
        {"name": "AddExtraInput", "input_channels": ["a"]},
        {"name": "Boundary"},
        {"name": "AddExtraInput"},
        {"name": "MakeExtraOutput", "output_bindings": [bound("m")]},
        {"name": "Identity"},
        {"name": "AddExtraInput", "input_channels": ["m"]},
    ]
    case, results = run(backend, spec(ops, shape=(6, 8), dtype="float32"))
    for result in results[:1]:
        assert judge(case, result, all_channels=False) == []
    # Outputs: main, split sizes (int64), probs, RowStat's stat, DualExtraOutput's slot 1.
    assert [tuple(t.shape) for t in results[0]["outputs"]] == [(6, 8), (3,), (6,), (6,), (6, 8)]
    assert results[0]["outputs"][1].dtype == torch.int64
    # "s" has no consumer but is public: its gradient is the caller's; "map" is an integer.
    assert set(results[0]["channel_grads"][0]) == {"a", "s"}
    assert set(results[0]["channel_grads"][1]) == {"m"}


def test_a_slot_returned_twice_exposes_no_channel_gradient(backend):
    # MakeExtraOutput last: TE returns its input as the main output and as the public extra
    # output, the same tensor twice; PyTorch hands both cotangents to the second, so the
    # gradient the producer's slot receives is not the channel's.
    ops = [
        {"name": "ConstantScale", "attrs": {"scale": 2.0}},
        {"name": "MakeExtraOutput", "output_bindings": [bound("c", True)]},
        {"name": "MakeExtraOutput", "output_bindings": [bound("d", True)]},
        {"name": "Bias"},
        {"name": "RowStat", "output_bindings": [bound("s", True)]},
    ]
    case, results = run(backend, spec(ops, dtype="float32"))
    assert results[0]["outputs"][1] is not None
    assert judge(case, results[0], all_channels=False) == []
    # c and d are the same tensor (MakeExtraOutput passes x through); s is RowStat's own.
    assert set(results[0]["channel_grads"][0]) == {"s"}


def test_review_findings_2_and_3_show_in_te(backend):
    ops = [{"name": "RowStat", "output_style": "generator"}]
    _, results = run(backend, spec(ops, dtype="float32"))
    assert (results[0]["error"]["kind"], results[0]["error"]["phase"]) == (
        "generator-misuse",
        "forward",
    )
    ops = [{"name": "RowStat", "output_bindings": [bound("c")]}]
    _, results = run(
        backend, spec(ops, dtype="float32", call_then_bind=[{"op": 0, "grad_mode": False}])
    )
    assert (results[0]["error"]["kind"], results[0]["error"]["phase"]) == ("locked", "binding")


def test_routing_errors_come_at_the_first_forward(backend):
    ops = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "AddExtraInput", "input_channels": ["r"]},
        {"name": "Boundary"},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    _, results = run(backend, spec(ops, dtype="float32"))
    error = results[0]["error"]
    assert (error["kind"], error["phase"], error["type"]) == (
        "missing-producer",
        "forward",
        "ValueError",
    )
    # TE built (and locked) the first fuser before the second one failed.
    assert results[0]["left_locked"] == [0, 1]


def test_extra_input_count_deviation(backend):
    ops = [{"name": "AddExtraInput"}]
    _, results = run(backend, spec(ops, dtype="float32", extra_input_count_delta=-1))
    assert results[0]["error"]["kind"] == "extra-input-count"
    _, results = run(backend, spec(ops, dtype="float32", extra_input_count_delta=1))
    assert results[0]["status"] == "ok"  # surplus_extra_inputs_ignored


def test_in_place_ops_writing_into_caller_tensors_are_reported(backend):
    ops = [
        {"name": "MakeExtraOutput", "attrs": {"in_place": 1}, "output_bindings": [bound("c")]},
        {"name": "ConstantScale", "attrs": {"scale": 0.5}},
        {"name": "AddExtraInput", "attrs": {"in_place": 1}, "input_channels": ["c"]},
    ]
    _, results = run(backend, spec(ops, dtype="float32"), paths=ALL_PATHS[3:])
    # AddExtraInput(in_place) adds into the channel's value, the caller's input itself;
    # MakeExtraOutput(in_place) accumulates into the gradient it is handed, the caller's
    # cotangent routed through the channel.
    assert results[0]["modified"] == ["input", "cotangent[0]"]


def fake_grouped_linear(groups, single_weight=False, single_bias=False, main_grad=False):
    """Duck-typed stand-in for te.ops.GroupedLinear's parameters (grouped_linear.py)."""
    op = types.SimpleNamespace(
        num_groups=groups,
        has_bias=True,
        single_grouped_weight=single_weight,
        single_grouped_bias=single_bias,
        _accumulate_into_main_grad=main_grad,
    )
    if single_weight:
        op.weight = torch.nn.Parameter(torch.zeros(groups, 3, 2))
    for g in range(groups):
        setattr(op, f"weight{g}", None if single_weight else torch.nn.Parameter(torch.zeros(3, 2)))
        setattr(op, f"bias{g}", None if single_bias else torch.nn.Parameter(torch.zeros(3)))
    if single_bias:
        op.bias = torch.nn.Parameter(torch.zeros(groups, 3))
    return op


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("single", [False, True])
def test_grouped_linear_parameters_map_to_the_model_layout(groups, single):
    op = fake_grouped_linear(groups, single_weight=single, single_bias=single)
    weights = torch.arange(groups * 6, dtype=torch.float32).reshape(groups, 3, 2)
    biases = torch.arange(groups * 3, dtype=torch.float32).reshape(groups, 3)
    params.copy_param_values(op, "GroupedLinear", [weights, biases])
    leaves = params.param_leaves(op, "GroupedLinear")
    assert len(leaves) == (2 if single else 2 * groups)
    # Gradients come back per TE parameter; the model wants [G, out, in] and [G, out].
    grads = {id(t): t.detach() * 10 for t in leaves}
    got = params.model_param_grads(op, "GroupedLinear", grads)
    assert torch.equal(got[0], weights * 10) and torch.equal(got[1], biases * 10)


def test_main_grad_and_requires_grad_flags():
    op = fake_grouped_linear(2, main_grad=True)
    params.set_param_requires_grad(op, "GroupedLinear", [True, False])
    params.attach_main_grads(op, "GroupedLinear")
    assert op.weight0.main_grad.dtype == torch.float32 and op.weight1.main_grad.shape == (3, 2)
    op.weight1.main_grad += 2.0  # what the wgrad GEMM accumulates
    got = params.model_param_grads(op, "GroupedLinear", {})  # autograd returned dummies
    assert torch.equal(got[0][1], torch.full((3, 2), 2.0)) and got[1] is None


# ----------------------------------------------------------------------------------------
# Recipes on TE's Python code


def test_recipe_capabilities_come_from_tes_availability_checks(backend):
    caps = backend.hello()["capabilities"]
    entries = {r["name"]: r for r in caps["recipes"]}
    assert list(entries) == [
        "DelayedScaling",
        "Float8CurrentScaling",
        "Float8BlockScaling",
        "MXFP8BlockScaling",
        "NVFP4BlockScaling",
    ]
    assert entries["Float8BlockScaling"]["options"]["block_scaling_dims"][0] == "1,2,1"
    assert entries["NVFP4BlockScaling"]["fp8_formats"] == ["E4M3"]
    assert caps["ops"]["GELU"]["options"]["cache_quantized_input"] == [0, 1]
    if not torch.cuda.is_available():
        # TE's checks read the device's compute capability; without a GPU they fail, and
        # the failure is the reason.
        for entry in entries.values():
            assert entry["available"] is False
        assert entries["DelayedScaling"]["reason"].startswith("is_fp8_available() failed: ")
        assert entries["MXFP8BlockScaling"]["reason"].startswith("is_mxfp8_available() failed")


def test_recipe_options_te_ignores_are_not_offered(backend):
    """TE 2.20.2 configures its quantizers from the recipe's class attributes, which the
    dataclass fields use_power_2_scales / use_f32_scales do not reach: only the value whose
    documented meaning is what TE does is drawn, the other is listed as not honoured."""
    from transformer_engine.common.recipe import Float8BlockScaling, Float8CurrentScaling

    from gradfuzz_adapter.te import recipes as te_recipes

    caps = backend.hello()["capabilities"]
    entries = {r["name"]: r for r in caps["recipes"]}
    current = Float8CurrentScaling.fp8_quant_fwd_inp.power_2_scale
    block = Float8BlockScaling.fp8_quant_fwd_inp.power_2_scale
    assert entries["Float8CurrentScaling"]["options"]["use_power_2_scales"] == [
        "1" if current else "0"
    ]
    assert entries["Float8CurrentScaling"]["not_honoured"] == {
        "use_power_2_scales": ["0" if current else "1"]
    }
    assert entries["Float8BlockScaling"]["options"]["use_f32_scales"] == ["0" if block else "1"]
    assert entries["Float8BlockScaling"]["not_honoured"] == {
        "use_f32_scales": ["1" if block else "0"]
    }
    # Every other option keeps its values.
    assert entries["Float8BlockScaling"]["options"]["block_scaling_dims"] == [
        "1,2,1",
        "1,1,1",
        "2,1,1",
        "1,1,2",
    ]
    assert "not_honoured" not in entries["DelayedScaling"]
    # An option TE's recipe object does honour keeps both values (a recipe class whose
    # quantizer parameters follow the field).
    assert te_recipes.honoured_values("DelayedScaling", "margin", ["0", "1"]) == (["0", "1"], [])


def test_honoured_values_keep_both_where_the_field_reaches_the_quantizers(monkeypatch):
    from transformer_engine.common import recipe as te_recipe

    from gradfuzz_adapter.te import recipes as te_recipes

    class Params:
        def __init__(self, power):
            self.power_2_scale = power

    class Honouring:
        def __init__(self, use_power_2_scales=False):
            for attr in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
                setattr(self, attr, Params(use_power_2_scales))

    monkeypatch.setattr(te_recipe, "Float8CurrentScaling", Honouring)
    kept = te_recipes.honoured_values("Float8CurrentScaling", "use_power_2_scales", ["0", "1"])
    assert kept == (["0", "1"], [])


def test_fp8_gemm_accumulation_is_declared_for_hopper_only(backend):
    from transformer_engine.pytorch.module import base

    from gradfuzz_adapter.te import recipes as te_recipes

    hopper = te_recipes.gemm_accumulation((9, 0))
    assert hopper["fraction_bits"] == 13 and hopper["products_per_step"] == 32
    assert hopper["promotion_products"] == 128
    # te.ops' constants: the forward GEMM fast, dgrad and wgrad split; block scaling split.
    assert (base._2X_ACC_FPROP, base._2X_ACC_DGRAD, base._2X_ACC_WGRAD) == (False, True, True)
    assert hopper["fast_accumulation"] == {
        "DelayedScaling": ["fprop"],
        "Float8CurrentScaling": ["fprop"],
        "Float8BlockScaling": [],
    }
    for other in (None, (8, 9), (10, 0), (12, 0)):
        assert te_recipes.gemm_accumulation(other) is None
    caps = backend.hello()["capabilities"]
    if not torch.cuda.is_available():
        # Without a device whose accumulation is pinned, TE is held to the coarse estimate.
        assert caps["fp8_gemm_accumulation"] is None and caps["fp8_reference_exact"] is False


@pytest.fixture
def fp8_supported(backend, monkeypatch):
    """TE's cached answers of its support checks set to "supported", as on an H200 for the
    per-tensor and block recipes (quantization.py: check_fp8_support and friends)."""
    from transformer_engine.pytorch import quantization

    monkeypatch.setattr(quantization, "_FP8_SUPPORT", (True, ""))
    monkeypatch.setattr(quantization, "_FP8_BLOCK_SCALING_SUPPORT", (True, ""))
    monkeypatch.setattr(quantization, "_MXFP8_SUPPORT", (False, "needs sm100"))
    monkeypatch.setattr(backend.builder, "recipe_availability", {})
    return quantization


def test_each_call_runs_inside_tes_autocast_with_the_cases_recipe(backend, fp8_supported):
    from transformer_engine.common.recipe import DelayedScaling, Format
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    manager = fp8_supported.FP8GlobalStateManager
    outer_state = manager.quantization_state
    seen = []
    original = OperationFuser.maybe_fuse_ops

    def recording(self, is_grad_enabled, recipe, *args, **kwargs):
        seen.append((recipe, manager.is_fp8_enabled(), manager.quantization_state))
        return original(self, is_grad_enabled, recipe, *args, **kwargs)

    recipe = {
        "name": "DelayedScaling",
        "fp8_format": "E4M3",
        "options": {"margin": "1", "amax_history_len": "2", "amax_compute_algo": "most_recent"},
    }
    OperationFuser.maybe_fuse_ops = recording
    try:
        case, results = run(
            backend, spec(RESIDUAL, dtype="float32", recipe=recipe), paths=ALL_PATHS[:2]
        )
    finally:
        OperationFuser.maybe_fuse_ops = original
    for result in results:
        assert judge(case, result, all_channels=False) == [], result["name"]
    assert len(seen) == 2  # one fuser per path
    for te_recipe, enabled, state in seen:
        assert isinstance(te_recipe, DelayedScaling) and enabled
        assert te_recipe.fp8_format == Format.E4M3 and te_recipe.margin == 1
        assert te_recipe.amax_history_len == 2 and te_recipe.amax_compute_algo == "most_recent"
        assert state is not outer_state  # each path has a fresh quantization state
    assert seen[0][2] is not seen[1][2]
    assert manager.quantization_state is outer_state and not manager.is_fp8_enabled()


def test_a_paths_sequentials_share_its_quantization_state_and_a_scratch_run_has_its_own(
    backend, fp8_supported
):
    """As in one process, a second Sequential over the path's ops runs in the path's TE
    quantization state (its autocast exits update the histories the first registered there);
    the fresh Sequential whose plans a repeat call's are compared with runs in one of its own,
    so its exits roll none of the path's histories."""
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    manager = fp8_supported.FP8GlobalStateManager
    seen = []
    original = OperationFuser.maybe_fuse_ops

    def recording(self, is_grad_enabled, recipe, *args, **kwargs):
        seen.append((self, manager.quantization_state))  # the fuser kept: no id reused
        return original(self, is_grad_enabled, recipe, *args, **kwargs)

    recipe = {"name": "DelayedScaling", "fp8_format": "E4M3"}
    calls = [{"second_sequential": True}, {"input_requires_grad": False}]
    OperationFuser.maybe_fuse_ops = recording
    try:
        _, results = run(
            backend,
            spec(RESIDUAL, dtype="float32", recipe=recipe, repeat_calls=calls),
            paths=ALL_PATHS[:1],
        )
    finally:
        OperationFuser.maybe_fuse_ops = original
    assert results[0]["status"] == "ok", results[0]
    fusers = list({id(fuser): fuser for fuser, _ in seen}.values())
    # The path's two Sequentials, and the fresh plans of call 3 (call 2's requires-grad
    # pattern is call 1's, whose plans are the expected ones).
    assert len(fusers) == 3
    states = {id(fuser): state for fuser, state in seen}
    path_state = states[id(fusers[0])]
    # Call 1 in the first Sequential, calls 2 and 3 in the second: all in the path's state.
    second = [f for f in fusers[1:] if sum(g is f for g, _ in seen) == 2]
    assert len(second) == 1 and states[id(second[0])] is path_state
    scratch = [f for f in fusers[1:] if f is not second[0]]
    assert len(scratch) == 1 and all(states[id(f)] is not path_state for f in scratch)


def test_a_recipe_te_reports_unavailable_makes_each_path_unsupported(backend, fp8_supported):
    case_spec = spec(RESIDUAL, dtype="float32", recipe={"name": "MXFP8BlockScaling"})
    _, results = run(backend, case_spec)
    assert results[0]["status"] == "unsupported"
    assert results[0]["reason"] == (
        "NotImplementedError: MXFP8BlockScaling is not available here: needs sm100 "
        "[NotImplementedError]"
    )


def test_linear_into_linear_under_current_scaling_raises_in_te(backend, fp8_supported, monkeypatch):
    """docs/BACKENDS.md "Where te.ops quantizes": BasicLinear hands its GEMM the next
    linear's input quantizer, which _functional_forward accepts only for delayed scaling.
    (The recipe state needs a CUDA stream query; on the CPU it is answered "not capturing".)"""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    ops = [{"name": "Linear", "attrs": {"out": 16}}, {"name": "Linear", "attrs": {"out": 16}}]
    recipe = {"name": "Float8CurrentScaling", "fp8_format": "E4M3"}
    _, results = run(backend, spec(ops, shape=(16, 16), dtype="float32", recipe=recipe))
    error = results[0]["error"]
    assert (error["type"], error["phase"]) == ("RuntimeError", "forward")
    assert (
        error["message"]
        == "Attempting to generate quantized output tensor with unsupported quantizer"
    )


# The usage script's steps on TE's own Python (docs/BACKENDS.md "Steps"): ops the stub runs.
USAGE_OPS = [
    {"name": "Bias"},
    {"name": "ConstantScale", "attrs": {"scale": 0.5}},
    {"name": "Bias"},
]
USAGE_CALLS = [
    {"checkpoint": True},
    {"no_grad": True, "inference_mode": True},
    {"recompute": True, "second_sequential": True},
    {"no_grad": True},
]


def _usage_run(backend, fault=None):
    case_spec = spec(USAGE_OPS, dtype="float32", repeat_calls=USAGE_CALLS, read_after_backward=True)
    header, tensors = make_request(case_spec, paths=[{"name": "unfused", "fusions": []}])
    return run_one_path(backend, header, tensors, fault)


def test_the_usage_steps_run_on_tes_python_and_its_faults_show(backend):
    clean = _usage_run(backend)
    assert clean["status"] == "ok", clean
    assert clean["modified"] == []
    for repeat in clean["repeats"]:
        assert repeat["status"] == "ok", repeat
        assert repeat["modified"] == [] and "graph_outputs" not in repeat, repeat
        # No optimizer step: every call gives the first call's output.
        torch.testing.assert_close(repeat["outputs"][0], clean["outputs"][0], rtol=0, atol=0)
    # A checkpoint whose parameters never load: the fresh ops' scrambled values show.
    lost = _usage_run(backend, "te-usage-checkpoint-params-not-loaded")
    assert not torch.equal(lost["repeats"][0]["outputs"][0], clean["outputs"][0])
    # An eval pass run with grad: its outputs carry a graph.
    graph = _usage_run(backend, "te-usage-eval-pass-keeps-graph")
    assert graph["repeats"][3].get("graph_outputs") == [0], graph["repeats"][3]


def test_deferred_init_builds_tes_ops_on_meta_and_materialises_them(backend, monkeypatch):
    """docs/BACKENDS.md "Steps": Bias built on "meta" (bias.py defers its parameter) and
    reset_parameters'd before the case's values are copied in; it runs as built directly. (TE
    materialises on its default CUDA device: the CPU stands in for it here.)"""
    from transformer_engine.pytorch.ops.basic import bias

    original = bias.canonicalize_device
    monkeypatch.setattr(
        bias,
        "canonicalize_device",
        lambda device: torch.device("cpu") if device is None else original(device),
    )
    built = []
    devices = []
    init = bias.Bias.__init__

    def recording_init(self, *args, **kwargs):
        devices.append(torch.device(kwargs.get("device")).type)
        init(self, *args, **kwargs)

    monkeypatch.setattr(bias.Bias, "__init__", recording_init)

    def run_with(deferred):
        case_spec = spec(USAGE_OPS, dtype="float32", deferred_init=deferred)
        header, tensors = make_request(case_spec, paths=[{"name": "unfused", "fusions": []}])
        case = decode_case(header, tensors)
        out = TensorList()
        create = backend.builder.create_op

        def recording(op_case, case, device):
            op = create(op_case, case, device)
            built.append((deferred, op))
            return op

        monkeypatch.setattr(backend.builder, "create_op", recording)
        try:
            result = backend.run(case, header["paths"], out)[0]
        finally:
            monkeypatch.setattr(backend.builder, "create_op", create)
        return case, path_result(result, out.tensors)

    case, deferred = run_with(True)
    assert deferred["status"] == "ok", deferred
    assert devices and set(devices) == {"meta"}
    devices.clear()
    assert judge(case, deferred) == []
    _, direct = run_with(False)
    torch.testing.assert_close(deferred["outputs"][0], direct["outputs"][0], rtol=0, atol=0)
    assert devices and set(devices) == {"cpu"}
    ops = [op for was_deferred, op in built if was_deferred and hasattr(op, "bias")]
    assert ops and all(op.bias.device.type == "cpu" for op in ops)
