"""gradfuzz case /root/out/work/export/te32_findings-known_9765b0de65732935.json (te, float32, input [6, 2]): MakeExtraOutput -> ReLU -> AddExtraInput -> Boundary -> AddExtraInput.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings-known_9765b0de65732935.json --backend te
Expected: outputs and gradients within gradfuzz's bounds of the float64 reference, no caller tensor changed; repeat calls plan as a fresh Sequential.
"""
import os

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32

import contextlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype
DTYPE = torch.float32
DEVICE = torch.device("cuda")
X = torch.tensor([
    [0.36764452, 1.3764858],
    [-2.3993711, 0.7703049],
    [-0.8846244, -2.018645],
    [0.39257488, -0.725111],
    [0.43161348, -0.42988604],
    [-1.921404, 0.36691537],
], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
E0 = torch.tensor([
    [-1.5693839, -0.26494634],
    [-1.4380983, -0.97956073],
    [-0.37542412, 2.2535489],
    [0.92435896, 2.6704369],
    [2.576317, 0.5459701],
    [-1.0594044, 1.4018285],
], dtype=torch.float32).double()
DY = torch.tensor([
    [0.14067549, 2.4394858],
    [-0.0038570592, 0.7815924],
    [0.69571817, -0.109725654],
    [0.5837168, -0.4766466],
    [-0.31708637, 1.2258488],
    [-0.51600003, -0.13592966],
], dtype=torch.float32).double()
DY1 = torch.tensor([
    [0.34957227, -1.8166196],
    [2.7221923, 0.13777886],
    [-1.1546189, -0.7245383],
    [1.0544707, -0.40858802],
    [0.8169608, -0.4786884],
    [1.0073104, -0.96946317],
], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.3e-06, torch.tensor([
    [2.384185791015625e-07, 0.0],
    [1.9073486328125e-06, 4.76837158203125e-07],
    [0.0, 0.0],
    [2.384185791015625e-07, 0.0],
    [0.0, 2.384185791015625e-07],
    [9.5367431640625e-07, 0.0],
], dtype=torch.float64), 4.128596965781841e-05),
    'grad_channel[c0]': (1e-05, 1.3e-06, torch.tensor([
    [2.384185791015625e-07, 9.5367431640625e-07],
    [2.520158886909485e-06, 5.960464477539062e-07],
    [4.76837158203125e-07, 0.0],
    [4.76837158203125e-07, 2.384185791015625e-07],
    [4.76837158203125e-07, 2.384185791015625e-07],
    [0.0, 1.1920928955078125e-07],
], dtype=torch.float64), 4.1216736795600205e-05),
    'grad_extra_input[0]': (1e-05, 1.3e-06, torch.tensor([
    [0.0, 0.0],
    [1.862645149230957e-09, 4.76837158203125e-07],
    [4.76837158203125e-07, 5.9604644775390625e-08],
    [4.76837158203125e-07, 2.384185791015625e-07],
    [0.0, 0.0],
    [0.0, 1.1920928955078125e-07],
], dtype=torch.float64), 3.908994689230505e-05),
    'grad_input': (1e-05, 1.3e-06, torch.tensor([
    [2.384185791015625e-07, 1.9073486328125e-06],
    [2.520158886909485e-06, 1.0728836059570312e-06],
    [4.76837158203125e-07, 0.0],
    [0.0, 2.384185791015625e-07],
    [4.76837158203125e-07, 2.384185791015625e-07],
    [0.0, 2.384185791015625e-07],
], dtype=torch.float64), 4.336811702757942e-05),
    'output': (1e-05, 1.3e-06, torch.tensor([
    [4.76837158203125e-07, 9.5367431640625e-07],
    [9.5367431640625e-07, 9.5367431640625e-07],
    [7.152557373046875e-07, 0.0],
    [4.76837158203125e-07, 0.0],
    [2.384185791015625e-06, 2.384185791015625e-07],
    [9.5367431640625e-07, 1.430511474609375e-06],
], dtype=torch.float64), 4.609172383157056e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    e0 = E0.to(dtype).requires_grad_()
    h = x
    c_c0 = h.view_as(h)  # MakeExtraOutput
    h = torch.relu(h)  # ReLU
    h = h + c_c0  # AddExtraInput
    # Boundary: a plain module ends the fuser (channels end with it)
    h = h + e0  # AddExtraInput
    outputs = [h, c_c0]
    cotangents = [DY.to(dtype), DY1.to(dtype)]
    leaves = [("grad_input", x), ("grad_extra_input[0]", e0)]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.MakeExtraOutput(in_place=True)
    op1 = te.ops.ReLU(cache_quantized_input=False)
    op2 = te.ops.AddExtraInput(in_place=True)
    op3 = Boundary()  # a plain module: ends the fuser
    op4 = te.ops.AddExtraInput(in_place=True)
    state["ops"] = ops = [op0, op1, op2, op3, op4]
    op0.set_extra_output_channel(0, 'c0', output_to_caller=True)
    op2.set_extra_input_channel(0, 'c0')
    model = te.ops.Sequential(op0, op1, op2, op3, op4)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = [E0.to(DEVICE, DTYPE, copy=True).requires_grad_()]
    cotangents = [DY.to(DEVICE, DTYPE, copy=True), DY1.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},
              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) if c is not None}}
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with torch.set_grad_enabled(not no_grad):
        out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    leaves = []
    if not no_grad:
        leaves = [
            ("grad_input", x),
            *[(f"grad_extra_input[{k}]", e) for k, e in enumerate(extras)],
        ]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


PATHS = [['UserbuffersForwardLinear', 'ForwardLinearBiasAdd', 'ForwardLinearBiasActivation', 'ForwardLinearScaleAdd', 'FusedResidual.forward'], []]
PATH_NAMES = ['fused', 'unfused']


@pytest.mark.parametrize("fusions", PATHS, ids=PATH_NAMES)
def test_case(fusions):
    expected = reference()
    state = {}
    with only_fusions(fusions):
        model = build(state)
        got, modified = call(model, state["ops"])
    problems = check_all(got, expected)
    problems += [f"{name}: changed by the call (a caller tensor)" for name in modified]
    # Repeat calls of the same Sequential (same values), against the reference and
    # against the plans a fresh Sequential makes at its first call with that pattern.
    for k, (no_grad, input_requires_grad) in enumerate([(True, False), (False, True)], start=1):
        wanted = reference(input_requires_grad=input_requires_grad)
        skip = ("grad",) if no_grad else ("grad_channel",)  # no channels in repeats
        wanted = {n: t for n, t in wanted.items() if not n.startswith(skip)}
        with only_fusions(fusions):
            before_repeat_call(state["ops"])
            got, modified = call(model, state["ops"], input_requires_grad, no_grad)
            fresh_state = {}
            fresh = build(fresh_state)
            call(fresh, fresh_state["ops"], input_requires_grad, no_grad)
        got = {n: t for n, t in got.items() if not n.startswith("grad_channel")}
        problems += [f"call[{k}] {p}" for p in check_all(got, wanted)]
        problems += [f"call[{k}] {n}: changed by the call" for n in modified]
        if plans(model) != plans(fresh):
            problems.append(f"call[{k}] plans {plans(model)}, a fresh Sequential's {plans(fresh)}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------
# What the test uses: the adapter's te.ops extensions, gradfuzz's catalog functions and comparison


class Boundary(torch.nn.Module):
    def forward(self, x):
        self.last_input = x
        return x


class GradfuzzError(Exception):
    kind = "unrecognized"


class InvalidArgumentError(GradfuzzError, ValueError):
    kind = "invalid-argument"


class FusedResidual(te.ops.FusedOperation):
    def __init__(self, producer, inner, consumer, *, fusion_name, returns_channel):
        super().__init__((producer, inner, consumer))
        self.fusion_name = fusion_name
        self.returns_channel = returns_channel

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        basic_op_kwargs,
    ):
        if self.fusion_name == "FusedResidual.backward":
            raise RuntimeError("FusedResidual.backward is backward-only; its forward ran")
        producer, inner, consumer = self.basic_ops
        # The inner op runs its own forward and fills its own context. Its neighbours'
        # quantizers are what the fuser would pass it (fuser.py: prev_op/next_op).
        y, inner_extra_outputs = inner.fuser_forward(
            [basic_op_ctxs[1]],
            input_,
            basic_op_extra_inputs=[basic_op_extra_inputs[1]],
            prev_op_grad_output_quantizer=producer.get_grad_output_quantizer(),
            next_op_input_quantizer=consumer.get_input_quantizer(),
            basic_op_kwargs=[basic_op_kwargs[1]],
        )
        if tuple(y.shape) != tuple(input_.shape):
            raise InvalidArgumentError(
                f"AddExtraInput slot 0: extra input must have the input's shape "
                f"{list(y.shape)}, got {list(input_.shape)}"
            )
        # y [rows, n] + x [rows, n], out of place: x is still C's value
        output = y + input_
        channel = input_ if self.returns_channel else None
        return output, [(channel,), inner_extra_outputs[0], ()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        if self.fusion_name == "FusedResidual.forward":
            raise RuntimeError("FusedResidual.forward is forward-only; its backward ran")
        inner = self.basic_ops[1]
        grad_inner, inner_grad_params, inner_grad_extra_inputs = inner.fuser_backward(
            [basic_op_ctxs[1]],
            grad_output,
            basic_op_grad_extra_outputs=[basic_op_grad_extra_outputs[1]],
        )
        # AddExtraInput: d(inner output) = d(C) = grad_output [rows, n]; MakeExtraOutput:
        # dx = inner dx + d(C) from AddExtraInput + d(C) from everyone else.
        grad_input = grad_output if grad_inner is None else grad_inner + grad_output
        (grad_extra_output,) = basic_op_grad_extra_outputs[0]
        if grad_extra_output is not None:
            grad_input = grad_input + grad_extra_output
        return (
            grad_input,
            [(), inner_grad_params[0], ()],
            [(), inner_grad_extra_inputs[0], (grad_output,)],
        )


def residual_pattern(window):
    producer, inner, consumer = window
    if any(op.is_fused_op for op in window):
        return False
    if not isinstance(producer, te.ops.MakeExtraOutput):
        return False
    if not isinstance(consumer, te.ops.AddExtraInput):
        return False
    if inner.num_extra_inputs or inner.num_extra_outputs:
        return False
    channel = producer._extra_output_channels[0]
    return channel is not None and consumer._extra_input_channels[0] == channel


def fuse_residual(ops, fusion_name):
    out = []
    i = 0
    while i < len(ops):
        window = ops[i : i + 3]
        if len(window) == 3 and residual_pattern(window):
            producer, inner, consumer = window
            channel = producer._extra_output_channels[0]
            basic = [b for op in ops for b in (op.basic_ops if op.is_fused_op else [op])]
            consumed_elsewhere = any(
                b is not consumer and channel in b._extra_input_channels for b in basic
            )
            returns_channel = producer._extra_output_to_caller[0] or consumed_elsewhere
            out.append(
                FusedResidual(
                    producer,
                    inner,
                    consumer,
                    fusion_name=fusion_name,
                    returns_channel=returns_channel,
                )
            )
            i += 3
        else:
            out.append(ops[i])
            i += 1
    return out


def fuse_residual_backward(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.backward")
fuse_residual_backward.gradfuzz_fusion_name = "FusedResidual.backward"


def fuse_residual_forward(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.forward")
fuse_residual_forward.gradfuzz_fusion_name = "FusedResidual.forward"


def fuse_residual_joint(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.joint")
fuse_residual_joint.gradfuzz_fusion_name = "FusedResidual.joint"


def register_fusions():
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    registered = OperationFuser.forward_backward_fusion_functions
    if fuse_residual_joint in registered:
        return
    te.ops.register_forward_fusion(fuse_residual_forward)
    te.ops.register_backward_fusion(fuse_residual_backward)
    te.ops.register_forward_backward_fusion(fuse_residual_joint)


@contextlib.contextmanager
def only_fusions(names):
    """Only the fusions called `names` in TE's registry (fuser.py: OperationFuser's lists)."""
    saved = {a: getattr(OperationFuser, a) for a in dir(OperationFuser) if a.endswith("_functions")}
    name = lambda f: getattr(f, "gradfuzz_fusion_name", None) or f.__qualname__.split(".")[0]
    try:
        for attr, funcs in saved.items():
            setattr(OperationFuser, attr, [f for f in funcs if name(f) in names])
        yield
    finally:
        for attr, funcs in saved.items():
            setattr(OperationFuser, attr, funcs)


def results(outputs, cotangents, leaves, zeros=True):
    """The outputs, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named leaves
    requiring grad (where nothing reached one: zeros, the reference's, or None), by name."""
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach() for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    leaves = [(n, t) for n, t in leaves if t is not None and t.requires_grad]
    if pairs and leaves:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in leaves],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(leaves, grads):
            got[n] = (torch.zeros_like(t) if zeros else None) if g is None else g
    return got


def check(name, got, e, atol, rtol, allowance=None, norm_bound=None):
    """Why `got` is off gradfuzz's bound of `e` (oracle/oracle.h), or None: every element
    finite and |got - e| <= atol + rtol (rms(e) + |e|) + allowance (unjudged where that is
    infinite), and ||got - e|| <= norm_bound."""
    if got is None:
        fine = e is None or e.numel() == 0 or (name.startswith("grad") and not e.any())
        return None if fine else f"{name}: none returned"
    got = got.detach().to("cpu", torch.float64)
    e = torch.zeros_like(got) if e is None else e.detach().to(torch.float64)
    if got.shape != e.shape:
        return f"{name}: shape {list(got.shape)}, expected {list(e.shape)}"
    a = torch.zeros_like(e) if allowance is None else allowance.double()
    judged, finite, diff = ~a.isinf(), got.isfinite() & e.isfinite(), (got - e).abs()
    rms = torch.where(e.isfinite(), e, 0).square().mean().sqrt()
    bad = judged & (~finite | (diff > atol + rtol * (rms + e.abs()) + torch.where(judged, a, 0)))
    if bad.any():
        k = int(torch.where(bad, torch.nan_to_num(diff, nan=float("inf")), -1).argmax())
        return (f"{name}: {int(bad.sum())} of {e.numel()} off, worst at flat index {k}: got "
                f"{got.flatten()[k]:.9g}, expected {e.flatten()[k]:.9g}")
    error = torch.where(judged & finite, diff, 0).norm()
    if norm_bound is not None and error > norm_bound:
        return f"{name}: error norm {float(error):.3g} > {norm_bound:.3g}"


def check_all(got, expected, baseline=None):
    """Every tensor either side has (channels: those the reference has), under BOUNDS or
    else FALLBACK."""
    names = [n for n in dict.fromkeys([*expected, *got])
             if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *BOUNDS.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]


def before_repeat_call(ops):
    """Between two steps, as a training loop: accumulated parameter gradients cleared."""
    for op in ops:
        for p in op.parameters() if hasattr(op, "parameters") else getattr(op, "params", []):
            p.grad = None
            if getattr(p, "main_grad", None) is not None:
                p.main_grad.zero_()


def plans(model):
    """Each fuser's plans of its last call: (op, basic op indices) per pass."""
    fusers = [m for m in getattr(model, "_module_groups", None) or [] if hasattr(m, "_forward_ops")]
    return [[[(getattr(op, "fusion_name", type(op).__name__), idxs) for op, idxs in ops]
             for ops in (f._forward_ops, f._backward_ops)] for f in fusers]


register_fusions()  # the adapter's FusedResidual, in all three passes
