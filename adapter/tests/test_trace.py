"""A path's trace (docs/BACKENDS.md "run", a path's `trace`): per plan group, in the order
the groups ran, the tensor it handed on (forward) or returned for its input (backward), on
the torch runtime and on TE's own Python code over the stubbed extension (te_stub.py)."""

import pytest
import torch
import torch.nn.functional as F
from helpers import run, spec

from gradfuzz_adapter import catalog, ranks
from gradfuzz_adapter.case import decode_case
from gradfuzz_adapter.client import make_request, path_result
from gradfuzz_adapter.protocol import TensorList
from gradfuzz_adapter.torch_backend import runtime as torch_runtime
from gradfuzz_adapter.torch_backend.backend import TorchBackend

MLP = [
    {"name": "Linear", "attrs": {"out": 16}},
    {"name": "GELU"},
    {"name": "Linear", "attrs": {"out": 6}},
]


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


def traced(paths):
    return [dict(path, trace=True) for path in paths]


def default_paths(case_spec):
    return make_request(case_spec)[0]["paths"]


def run_with_fault(backend, case_spec, paths, fault):
    header, tensors = make_request(case_spec, paths=paths)
    case = decode_case(header, tensors)
    out = TensorList()
    results = backend.run(case, header["paths"], out, fault=fault)
    return [path_result(r, out.tensors) for r in results]


def groups(trace):
    return [(e["pass"], e["fuser"], e["begin"], e["end"], e["name"]) for e in trace]


def assert_same(a, b, where="reply"):
    """`a` and `b` (resolved replies) agree everywhere, tensors bit for bit."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a.keys(), b.keys())
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, (where, a, b)


@pytest.fixture(scope="module")
def torch_backend():
    return TorchBackend()


# ----------------------------------------------------------------------------------------
# The torch backend


def test_a_traced_path_has_an_entry_per_op_and_pass_in_the_order_they_ran(torch_backend):
    _, results = run(torch_backend, spec(MLP), paths=[{"name": "fused", "trace": True}])
    trace = results[0]["trace"]
    forward = [("forward", 0, k, k + 1, op["name"]) for k, op in enumerate(MLP)]
    backward = [("backward", 0, k, k + 1, op["name"]) for k, op in reversed(list(enumerate(MLP)))]
    assert groups(trace) == forward + backward
    # The same groups as the path's plans.
    plans = results[0]["plans"][0]
    for pass_ in ("forward", "backward"):
        planned = [(g["begin"], g["end"], g["name"], g["fused"]) for g in plans[pass_]]
        seen = [(e["begin"], e["end"], e["name"], e["fused"]) for e in trace if e["pass"] == pass_]
        assert sorted(seen) == sorted(planned)
    assert {(e["class"], e["method"]) for e in trace} == {
        ("BasicOp", "forward"),
        ("BasicOp", "backward"),
    }
    assert not any(e["quantized"] for e in trace)


def test_the_traced_tensors_are_each_ops_output_and_input_gradient(torch_backend):
    case, results = run(torch_backend, spec(MLP), paths=[{"name": "fused", "trace": True}])
    trace = results[0]["trace"]
    w0, w2 = case.ops[0].params[0], case.ops[2].params[0]
    cotangent = case.cotangents[0]
    # The chain written out in plain torch, op by op, on the case's values.
    steps = [
        lambda h: F.linear(h, w0),
        lambda h: F.gelu(h, approximate="tanh"),
        lambda h: F.linear(h, w2),
    ]
    inputs, h = [], case.input
    for step in steps:
        inputs.append(h)
        h = step(h)
        entry = trace[len(inputs) - 1]
        torch.testing.assert_close(entry["tensor"], h, rtol=0, atol=0)

    def downstream(k, h):
        for step in steps[k:]:
            h = step(h)
        return (h * cotangent).sum()

    for entry in trace[len(steps) :]:
        k = entry["begin"]
        x = inputs[k].clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(downstream(k, x), x)
        torch.testing.assert_close(entry["tensor"], expected)
    # The first op's input gradient is the path's grad_input.
    assert torch.equal(trace[-1]["tensor"], results[0]["grad_input"])


def test_an_input_that_needs_no_gradient_leaves_the_entry_without_a_tensor(torch_backend):
    _, results = run(
        torch_backend, spec(MLP, input_requires_grad=False), paths=[{"name": "f", "trace": True}]
    )
    last = results[0]["trace"][-1]
    assert (last["pass"], last["begin"]) == ("backward", 0)
    assert last["tensor"] is None  # the Linear's weight needed its backward, its input none


def in_place_into_caller(monkeypatch):
    # A planted defect (test_driver.py): AddExtraInput(in_place) adds into the caller's
    # tensor, so that `modified` and `modified_by` have something to say.
    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)


CASES = {
    "mlp": spec(MLP),
    "channels": spec(
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("r", True)]},
            {"name": "Linear", "attrs": {"out": 8}},
            {"name": "AddExtraInput", "input_channels": ["r"]},
            {"name": "Boundary"},
            {"name": "RowStat", "output_bindings": [bound("s")]},
            {"name": "ScaledSReLU", "input_channels": ["s"]},
        ],
        repeat_calls=[{}, {"input_requires_grad": False}],
    ),
    "in_place_writer": spec(
        [
            {"name": "ConstantScale", "attrs": {"scale": 0.5}},
            {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
            {"name": "GELU"},
        ]
    ),
    "fused_under_a_recipe": spec(
        [
            {"name": "Linear", "attrs": {"out": 16}},
            {"name": "ConstantScale", "attrs": {"scale": 0.5}},
            {"name": "GELU"},
        ],
        shape=(16, 16),
        dtype="float32",
        fusions=["BackwardLinearScale"],
        recipe={"name": "Float8CurrentScaling", "fp8_format": "HYBRID"},
    ),
    "error_in_forward": spec(
        [{"name": "Linear", "attrs": {"out": 8}}, {"name": "GroupedLinear"}],
        corrupt_split_sizes=True,
    ),
    # Extra tensors everywhere: a channel with two consumers and the caller (three
    # gradients summed into its producer's), a Dispatch handing its extra outputs back as
    # a generator, GroupedLinear(scale_bias) and Combine on its channels.
    "extras": spec(
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("r", True)]},
            {"name": "Linear", "attrs": {"out": 8}},
            {"name": "AddExtraInput", "input_channels": ["r"]},
            {"name": "GELU"},
            {"name": "AddExtraInput", "input_channels": ["r"]},
            {
                "name": "Dispatch",
                "attrs": {"groups": 2},
                "output_bindings": [bound("sizes"), bound("probs", True), bound("map")],
                "output_style": "generator",
            },
            {
                "name": "GroupedLinear",
                "attrs": {"groups": 2, "out": 8, "scale_bias": 1},
                "input_channels": ["sizes", "probs"],
            },
            {"name": "Combine", "input_channels": ["map"]},
        ],
        repeat_calls=[{}],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("modified_by", [True, "rerun"])
def test_tracing_changes_nothing_else_in_the_reply(torch_backend, monkeypatch, name, modified_by):
    in_place_into_caller(monkeypatch)
    case_spec = CASES[name]
    paths = [dict(p, modified_by=modified_by) for p in default_paths(case_spec)]
    _, plain = run(torch_backend, case_spec, paths=paths)
    _, with_trace = run(torch_backend, case_spec, paths=traced(paths))
    assert not any("trace" in r for r in plain)
    ran = [r for r in with_trace if r["status"] != "skipped"]
    assert ran and all("trace" in r for r in ran)
    assert not any("trace" in r for r in with_trace if r["status"] == "skipped")
    for result in with_trace:
        assert not any("trace" in repeat for repeat in result.get("repeats", []))
        result.pop("trace", None)
    assert_same(plain, with_trace)
    if name == "in_place_writer":
        assert plain[0]["modified_by"]  # the writer search ran beside the trace


def test_a_path_that_failed_sends_the_entries_before_the_error(torch_backend):
    _, results = run(torch_backend, CASES["error_in_forward"], paths=[{"name": "f", "trace": True}])
    assert results[0]["status"] == "error" and results[0]["error"]["phase"] == "forward"
    assert groups(results[0]["trace"]) == [("forward", 0, 0, 1, "Linear")]


def test_a_fused_backward_group_is_one_entry_with_its_first_ops_input_gradient(torch_backend):
    case_spec = CASES["fused_under_a_recipe"]
    _, results = run(
        torch_backend,
        case_spec,
        paths=[{"name": "f", "fusions": case_spec["fusions"], "trace": True}],
    )
    result = results[0]
    assert result["plans"][0]["backward"][0]["name"] == "BackwardLinearScale"
    backward = [e for e in result["trace"] if e["pass"] == "backward"]
    assert groups(backward) == [
        ("backward", 0, 2, 3, "GELU"),
        ("backward", 0, 0, 2, "BackwardLinearScale"),
    ]
    assert backward[1]["fused"] and torch.equal(backward[1]["tensor"], result["grad_input"])


def test_a_planted_fault_shows_first_at_the_op_it_is_planted_in(torch_backend):
    # torch-fp8-dgrad-scaled-down: every quantized Linear's input gradient comes back
    # scaled by 2^-7; the last Linear's backward runs first.
    case_spec = spec(
        MLP[:2] + [{"name": "Linear", "attrs": {"out": 16}}],
        shape=(16, 16),
        dtype="float32",
        recipe={"name": "Float8CurrentScaling", "fp8_format": "E4M3"},
    )
    paths = [{"name": "fused", "trace": True}]
    (clean,) = run_with_fault(torch_backend, case_spec, paths, None)
    (faulty,) = run_with_fault(torch_backend, case_spec, paths, "torch-fp8-dgrad-scaled-down")
    assert groups(clean["trace"]) == groups(faulty["trace"])
    differs = [
        k
        for k, (a, b) in enumerate(zip(clean["trace"], faulty["trace"]))
        if not torch.equal(a["tensor"], b["tensor"])
    ]
    first = faulty["trace"][differs[0]]
    assert (first["pass"], first["begin"], first["end"], first["name"]) == (
        "backward",
        2,
        3,
        "Linear",
    )
    assert torch.equal(first["tensor"], clean["trace"][differs[0]]["tensor"] * 2.0**-7)


def extras(entry):
    return [(x["op"], x["slot"]) for x in entry["extras"]]


def entry_at(trace, pass_, begin):
    (entry,) = [e for e in trace if e["pass"] == pass_ and e["begin"] == begin]
    return entry


def differences(a, b):
    """Where traces `a` and `b` (of the same groups) differ, in trace order: (entry index,
    "tensor") for an entry's main tensor, then (entry index, (op, slot)) for its extras."""
    assert groups(a) == groups(b)
    out = []
    for k, (x, y) in enumerate(zip(a, b)):
        if not torch.equal(x["tensor"], y["tensor"]):
            out.append((k, "tensor"))
        assert extras(x) == extras(y)
        for u, v in zip(x["extras"], y["extras"]):
            if not torch.equal(u["tensor"], v["tensor"]):
                out.append((k, (u["op"], u["slot"])))
    return out


# A channel r of the caller's and of two consumers: each consumer's gradient is its own.
TWO_CONSUMERS = [
    {"name": "MakeExtraOutput", "output_bindings": [bound("r", True)]},
    {"name": "Linear", "attrs": {"out": 8}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
    {"name": "GELU"},
    {"name": "AddExtraInput", "input_channels": ["r"]},
]


def test_a_channels_trace_extras_are_its_value_and_each_consumers_own_gradient(torch_backend):
    case, results = run(
        torch_backend, spec(TWO_CONSUMERS), paths=[{"name": "fused", "trace": True}]
    )
    result = results[0]
    trace = result["trace"]
    assert [extras(e) for e in trace] == [
        [(0, 0)],  # MakeExtraOutput's extra output
        [],
        [],
        [],
        [],
        [(4, 0)],  # AddExtraInput's extra-input gradient, its backward first
        [],
        [(2, 0)],
        [],
        [],
    ]
    assert all(x["quantized"] is False for e in trace for x in e["extras"])
    # Forward: the extra output is MakeExtraOutput's input.
    assert torch.equal(trace[0]["extras"][0]["tensor"], case.input)
    # Backward, in plain torch: each consumer's extra input as a variable of its own.
    w = case.ops[1].params[0]
    cotangent = case.cotangents[0]
    e2 = case.input.clone().requires_grad_(True)
    e4 = case.input.clone().requires_grad_(True)
    y = F.gelu(F.linear(case.input, w) + e2, approximate="tanh") + e4
    g2, g4 = torch.autograd.grad((y * cotangent).sum(), [e2, e4])
    last = entry_at(trace, "backward", 4)["extras"][0]["tensor"]
    first = entry_at(trace, "backward", 2)["extras"][0]["tensor"]
    torch.testing.assert_close(last, g4, rtol=0, atol=0)  # the cotangent itself
    assert torch.equal(last, cotangent)
    torch.testing.assert_close(first, g2)
    # The channel's gradient is theirs and the caller's together (a hook on the channel's
    # tensor would have given each consumer this sum).
    torch.testing.assert_close(
        result["channel_grads"][0]["r"], case.cotangents[1] + first + last, rtol=0, atol=1e-12
    )


def test_grouped_linears_scales_gradient_is_in_its_slot(torch_backend):
    ops = [{"name": "GroupedLinear", "attrs": {"groups": 2, "out": 8, "scale_bias": 1}}]
    case, results = run(torch_backend, spec(ops), paths=[{"name": "fused", "trace": True}])
    result = results[0]
    forward, backward = result["trace"]
    assert extras(forward) == []
    assert extras(backward) == [(0, 1)]  # slot 0, the split sizes, has no gradient
    sizes, scales = case.extra_inputs
    weights, biases = case.ops[0].params
    s = scales.clone().requires_grad_(True)
    rows = sizes.tolist()
    parts = [
        x_g @ weights[g].T + s_g[:, None] * biases[g]
        for g, (x_g, s_g) in enumerate(zip(case.input.split(rows), s.split(rows)))
    ]
    (expected,) = torch.autograd.grad((torch.cat(parts) * case.cotangents[0]).sum(), s)
    torch.testing.assert_close(backward["extras"][0]["tensor"], expected)
    assert torch.equal(backward["extras"][0]["tensor"], result["grad_extra_inputs"][1])


def test_a_defect_in_an_extra_gradient_shows_first_in_that_ops_extra(torch_backend, monkeypatch):
    # No planted fault breaks an extra gradient alone: ScaledSwiGLU made to double its
    # scales' gradient (the forward value unchanged, bit for bit). The scales are RowStat's
    # channel, so the error reaches RowStat's input gradient, later in backward.
    ops = [
        {"name": "RowStat", "output_bindings": [bound("s")]},
        {"name": "Linear", "attrs": {"out": 16}},
        {"name": "ScaledSwiGLU", "input_channels": ["s"]},
        {"name": "Linear", "attrs": {"out": 6}},
    ]
    paths = [{"name": "fused", "trace": True}]
    _, (clean,) = run(torch_backend, spec(ops), paths=paths)
    original = catalog.scaled_swiglu

    def doubled_scales_gradient(x, scales, interleave=0):
        return original(x, scales.detach() + 2 * (scales - scales.detach()), interleave)

    monkeypatch.setattr(catalog, "scaled_swiglu", doubled_scales_gradient)
    _, (faulty,) = run(torch_backend, spec(ops), paths=paths)
    for key in ("outputs",):
        assert all(torch.equal(a, b) for a, b in zip(clean[key], faulty[key]))
    found = differences(clean["trace"], faulty["trace"])
    k, where = found[0]
    entry = faulty["trace"][k]
    assert (entry["pass"], entry["begin"], entry["name"], where) == (
        "backward",
        2,
        "ScaledSwiGLU",
        (2, 0),
    )
    assert (k, "tensor") not in found  # its main gradient is right
    assert torch.equal(entry["extras"][0]["tensor"], 2 * clean["trace"][k]["extras"][0]["tensor"])
    # Without the extras the first divergence would be RowStat's input gradient.
    assert [faulty["trace"][j]["name"] for j, w in found if w == "tensor"] == ["RowStat"]


def test_a_generator_of_extra_outputs_is_traced_as_it_is_drawn(torch_backend):
    ops = [{"name": "DualExtraOutput", "output_style": "generator"}]
    case, results = run(torch_backend, spec(ops), paths=[{"name": "fused", "trace": True}])
    result = results[0]
    forward = result["trace"][0]
    assert extras(forward) == [(0, 0), (0, 1)]
    for item, output in zip(forward["extras"], result["outputs"][1:]):
        assert torch.equal(item["tensor"], output)
    assert torch.equal(forward["extras"][0]["tensor"], 0.5 * case.input)


def test_rank_requests_drop_the_trace():
    header = {
        "spec": {"world_size": 2},
        "paths": [{"name": "fused", "trace": True, "fusions": []}],
        "ranks": [{"plan": {"ops": []}, "values": {"input": 0}}] * 2,
    }
    for request, _ in ranks.rank_requests(header, [torch.zeros(1)]):
        assert request["paths"] == [{"name": "fused", "fusions": []}]
    assert header["paths"][0]["trace"] is True  # the request itself is left alone


def test_a_trace_flag_that_is_not_a_bool_is_the_requests_error(torch_backend):
    with pytest.raises(ValueError, match='"trace" must be true or false, got 1'):
        run(torch_backend, spec(MLP), paths=[{"name": "fused", "trace": 1}])


# ----------------------------------------------------------------------------------------
# The te backend on TE's Python code


@pytest.fixture(scope="module")
def te_backend():
    import te_stub

    reason = te_stub.available()
    if reason:
        pytest.skip(reason)
    te_stub.install()
    from gradfuzz_adapter.te.backend import TEBackend

    return TEBackend(device="cpu")


RESIDUAL = [
    {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
    {"name": "ConstantScale", "attrs": {"scale": 0.75}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
]


def test_a_fused_te_group_is_one_entry_with_tes_class_and_method(te_backend):
    paths = [{"name": "joint", "fusions": ["FusedResidual.joint"], "trace": True}]
    _, results = run(te_backend, spec(RESIDUAL, dtype="float32"), paths=paths)
    result = results[0]
    fields = [
        (e["pass"], e["begin"], e["end"], e["name"], e["fused"], e["class"], e["method"])
        for e in result["trace"]
    ]
    assert fields == [
        ("forward", 0, 3, "FusedResidual.joint", True, "FusedResidual", "fuser_forward"),
        ("backward", 0, 3, "FusedResidual.joint", True, "FusedResidual", "fuser_backward"),
    ]
    forward, backward = result["trace"]
    assert torch.equal(forward["tensor"], result["outputs"][0])
    assert torch.equal(backward["tensor"], result["grad_input"])


def test_unfused_te_groups_name_the_method_that_computes_them(te_backend):
    _, results = run(
        te_backend,
        spec(RESIDUAL, dtype="float32"),
        paths=[{"name": "unfused", "fusions": [], "trace": True}],
    )
    methods = {(e["pass"], e["class"]): e["method"] for e in results[0]["trace"]}
    # ConstantScale keeps BasicOperation's fuser_forward, which calls its op_forward;
    # MakeExtraOutput and AddExtraInput (extra tensors) compute in fuser_forward itself.
    assert methods == {
        ("forward", "MakeExtraOutput"): "fuser_forward",
        ("forward", "ConstantScale"): "op_forward",
        ("forward", "AddExtraInput"): "fuser_forward",
        ("backward", "AddExtraInput"): "fuser_backward",
        ("backward", "ConstantScale"): "op_backward",
        ("backward", "MakeExtraOutput"): "fuser_backward",
    }
    trace = results[0]["trace"]
    scaled = 0.75 * trace[0]["tensor"].to(torch.float32)  # in the case dtype, then widened
    assert torch.equal(trace[1]["tensor"], scaled.to(torch.float64))


def test_a_traced_tensor_is_copied_when_its_group_returned(te_backend):
    # TE's MakeExtraOutput hands on its input itself, as its output and as the channel;
    # AddExtraInput(in_place) then adds into that very tensor.
    ops = [dict(RESIDUAL[0]), RESIDUAL[1], dict(RESIDUAL[2], attrs={"in_place": 1})]
    case, results = run(
        te_backend,
        spec(ops, dtype="float32", input_requires_grad=False),
        paths=[{"name": "unfused", "fusions": [], "trace": True}],
    )
    assert results[0]["modified"] == ["input"]  # the write happened
    make_extra_output = results[0]["trace"][0]
    assert make_extra_output["name"] == "MakeExtraOutput"
    assert torch.equal(make_extra_output["tensor"], case.input)


ALL_PATHS = [
    {"name": "joint", "fusions": ["FusedResidual.joint"]},
    {"name": "forward_fused", "fusions": ["FusedResidual.forward"]},
    {"name": "unfused", "fusions": []},
]
ALL_TRACED = traced(ALL_PATHS)


def test_tracing_changes_nothing_else_in_a_te_reply(te_backend):
    paths = ALL_PATHS
    case_spec = spec(RESIDUAL, dtype="float32", repeat_calls=[{}])
    _, plain = run(te_backend, case_spec, paths=paths)
    _, with_trace = run(te_backend, case_spec, paths=traced(paths))
    for result in with_trace:
        assert result.pop("trace")
    assert_same(plain, with_trace)


def test_tracing_leaves_tes_classes_as_they_were(te_backend):
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    from gradfuzz_adapter.te.extensions import FusedResidual

    classes = [OperationFuser, FusedResidual] + [
        type(op) for op in te_backend.builder.te.ops.__dict__.values() if isinstance(op, type)
    ]
    before = [dict(vars(cls)) for cls in classes]
    run(te_backend, spec(RESIDUAL, dtype="float32"), paths=ALL_TRACED)
    # A path that raises in its forward: BasicLinear needs a GEMM kernel, stubbed here.
    _, results = run(
        te_backend,
        spec(RESIDUAL + [{"name": "Linear"}], dtype="float32"),
        paths=[{"name": "unfused", "fusions": [], "trace": True}],
    )
    assert results[0]["status"] == "error" and results[0]["error"]["phase"] == "forward"
    assert groups(results[0]["trace"]) == [
        ("forward", 0, k, k + 1, op["name"]) for k, op in enumerate(RESIDUAL)
    ]
    assert [dict(vars(cls)) for cls in classes] == before


def test_a_quantized_te_output_is_sent_dequantized(te_backend, monkeypatch):
    from transformer_engine.pytorch.ops.basic.identity import Identity
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
    from transformer_engine_torch import DType

    def as_fp8(x):
        data = x.detach().to(torch.float8_e4m3fn).view(torch.uint8)
        scale_inv = torch.ones((), dtype=torch.float32, device=x.device)
        return Float8Tensor(
            shape=x.shape,
            dtype=x.dtype,
            data=data,
            fp8_scale_inv=scale_inv,
            fp8_dtype=DType.kFloat8E4M3,
            requires_grad=False,
            device=x.device,
        )

    try:
        probe = as_fp8(torch.ones(2, 2)).dequantize()
    except Exception as exc:  # noqa: BLE001 - the stub may lack what TE's FP8 tensor needs
        pytest.skip(f"the stubbed TE cannot make and read a Float8Tensor: {exc!r}")
    assert torch.equal(probe, torch.ones(2, 2))
    # Identity hands on its input as an FP8 tensor (scale 1), as an op whose output the next
    # op's input quantizer made would; ConstantScale reads it dequantized.
    original = Identity.op_forward
    monkeypatch.setattr(
        Identity, "op_forward", lambda self, ctx, x, **kw: as_fp8(original(self, ctx, x, **kw))
    )
    case, results = run(
        te_backend,
        spec(
            [{"name": "Identity"}, {"name": "ConstantScale", "attrs": {"scale": 0.5}}],
            dtype="float32",
        ),
        paths=[{"name": "fused", "trace": True}],
    )
    assert results[0]["status"] == "ok", results[0]
    identity, scale = results[0]["trace"][:2]
    assert identity["quantized"] and not scale["quantized"]
    expected = case.input.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
    assert torch.equal(identity["tensor"], expected)
    assert not torch.equal(expected, case.input)  # the FP8 rounding shows
    assert torch.equal(scale["tensor"], 0.5 * expected)


def test_a_fused_te_groups_extras_map_to_their_ops_and_slots(te_backend):
    # The fused group is fuser 1's basic ops 0-2, spec ops 2-4.
    ops = [
        {"name": "ConstantScale", "attrs": {"scale": 0.5}},
        {"name": "Boundary"},
        {"name": "MakeExtraOutput", "output_bindings": [bound("r", True)]},
        {"name": "ConstantScale", "attrs": {"scale": 0.75}},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    case_spec = spec(ops, dtype="float32")
    paths = [
        {"name": "joint", "fusions": ["FusedResidual.joint"], "trace": True},
        {"name": "unfused", "fusions": [], "trace": True},
    ]
    case, (joint, unfused) = run(te_backend, case_spec, paths=paths)
    assert [(e["pass"], e["fuser"], e["begin"], e["end"], extras(e)) for e in joint["trace"]] == [
        ("forward", 0, 0, 1, []),
        ("forward", 1, 2, 5, [(2, 0)]),  # MakeExtraOutput's output; AddExtraInput has none
        ("backward", 1, 2, 5, [(4, 0)]),  # AddExtraInput's gradient; MakeExtraOutput's none
        ("backward", 0, 0, 1, []),
    ]
    fused_forward, fused_backward = joint["trace"][1:3]
    # MakeExtraOutput's extra output is its input, fuser 0's output; the channel is public.
    assert torch.equal(fused_forward["extras"][0]["tensor"], joint["trace"][0]["tensor"])
    assert torch.equal(fused_forward["extras"][0]["tensor"], joint["outputs"][1])
    # AddExtraInput, the last op, returns its output's gradient: the cotangent.
    cotangent = case.cotangents[0].to(torch.float32).to(torch.float64)
    assert torch.equal(fused_backward["extras"][0]["tensor"], cotangent)
    # The same (op, slot) pairs, with the same values, in the unfused path's groups.
    pairs = {
        (e["pass"], x["op"], x["slot"]): x["tensor"] for e in unfused["trace"] for x in e["extras"]
    }
    assert set(pairs) == {("forward", 2, 0), ("backward", 4, 0)}
    assert torch.equal(pairs[("forward", 2, 0)], fused_forward["extras"][0]["tensor"])
    assert torch.equal(pairs[("backward", 4, 0)], fused_backward["extras"][0]["tensor"])


def test_te_extras_skip_integer_slots_and_keep_a_generators_error(te_backend):
    ops = [
        {
            "name": "Dispatch",
            "attrs": {"groups": 2},
            "output_bindings": [bound("sizes"), bound("probs", True), bound("map")],
        },
        {"name": "Combine", "input_channels": ["map"]},
    ]
    case, results = run(
        te_backend, spec(ops, dtype="float32"), paths=[{"name": "f", "trace": True}]
    )
    assert results[0]["status"] == "ok", results[0]
    trace = results[0]["trace"]
    assert [(e["pass"], e["begin"], extras(e)) for e in trace] == [
        ("forward", 0, [(0, 0), (0, 1), (0, 2)]),  # split sizes, probabilities, routing map
        ("forward", 1, []),
        ("backward", 1, []),  # the routing map has no gradient
        ("backward", 0, [(0, 0)]),  # the logits'
    ]
    sizes, probs, routing = (x["tensor"] for x in trace[0]["extras"])
    assert sizes.dtype == torch.int64 and int(sizes.sum()) == case.input.shape[0]
    assert torch.equal(probs, results[0]["outputs"][1])
    assert torch.equal(trace[-1]["extras"][0]["tensor"], results[0]["grad_extra_inputs"][0])
    # A generator TE's fuser cannot take: the same error traced or not.
    ops = [{"name": "RowStat", "output_style": "generator"}]
    for traced_ in (False, True):
        _, results = run(
            te_backend, spec(ops, dtype="float32"), paths=[{"name": "f", "trace": traced_}]
        )
        assert (results[0]["error"]["kind"], results[0]["error"]["phase"]) == (
            "generator-misuse",
            "forward",
        )
    assert extras(results[0]["trace"][0]) == [(0, 0)]
    assert results[0]["trace"][0]["extras"][0]["tensor"] is None  # never drawn
