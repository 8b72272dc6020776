"""gradfuzz case /root/out/work/export/te32_findings_38226614007f6112.json (te, float32, input [1, 1]): MakeExtraOutput -> AddExtraInput -> AddExtraInput -> RowStat -> RMSNorm.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings_38226614007f6112.json --backend te
Expected: outputs and gradients within gradfuzz's bounds of the float64 reference, no caller tensor changed.
"""
import os

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32

import contextlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype
DTYPE = torch.float32
DEVICE = torch.device("cuda")
X = torch.tensor([[1.0655812]], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
GAMMA4 = torch.tensor([-0.60930645], dtype=torch.float32).double()
DY = torch.tensor([[-0.7177366]], dtype=torch.float32).double()
DY1 = torch.tensor([0.052238934], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.6250000000000001e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([8.233614721575577e-06], dtype=torch.float64), 3.0722958110656244e-05),
    'grad_channel[c0]': (1e-05, 1.6250000000000001e-06, torch.tensor([[5.585696687404607e-07]], dtype=torch.float64), 1.1364749373214694e-05),
    'grad_input': (1e-05, 1.6250000000000001e-06, torch.tensor([[5.994359248973069e-07]], dtype=torch.float64), 1.1927914770715348e-05),
    'grad_param[4].RMSNorm[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([4.2518560317006404e-07], dtype=torch.float64), 1.1378914208904453e-05),
    'output': (1e-05, 1.6250000000000001e-06, torch.tensor([[7.672955604220988e-10]], dtype=torch.float64), 1.0990506152156691e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    gamma4 = GAMMA4.to(dtype).requires_grad_(True)
    h = x
    c_c0 = h.view_as(h)  # MakeExtraOutput
    h = h + c_c0  # AddExtraInput
    h = h + c_c0  # AddExtraInput
    h, (o3_0,) = row_stat(h)
    h = rms_norm(h, gamma4, 1e-05, False)  # RMSNorm
    outputs = [h, o3_0]
    cotangents = [DY.to(dtype), DY1.to(dtype)]
    leaves = [("grad_input", x), ("grad_param[4].RMSNorm[0]", gamma4)]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.MakeExtraOutput(in_place=True)
    op1 = te.ops.AddExtraInput(in_place=True)
    op2 = te.ops.AddExtraInput(in_place=False)
    op3 = RowStat(output_style='vector')
    op4 = te.ops.RMSNorm(1, eps=1e-05, device=DEVICE, dtype=DTYPE, zero_centered_gamma=False, sm_margin=1)
    with torch.no_grad():
        op4.weight.copy_(GAMMA4)
    state["ops"] = ops = [op0, op1, op2, op3, op4]
    op0.set_extra_output_channel(0, 'c0', output_to_caller=False)
    op1.set_extra_input_channel(0, 'c0')
    op2.set_extra_input_channel(0, 'c0')
    model = te.ops.Sequential(op0, op1, op2, op3, op4)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = []
    cotangents = [DY.to(DEVICE, DTYPE, copy=True), DY1.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},
              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) if c is not None}}
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with torch.set_grad_enabled(not no_grad):
        out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    leaves = []
    if not no_grad:
        leaves = [("grad_input", x), ("grad_param[4].RMSNorm[0]", ops[4].weight)]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


PATHS = [[], []]
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
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------
# What the test uses: the adapter's te.ops extensions, gradfuzz's catalog functions and comparison


def row_stat(x):
    return x.view_as(x), (torch.mean(torch.square(x), dim=-1),)


class GradfuzzError(Exception):
    kind = "unrecognized"


class InvalidArgumentError(GradfuzzError, ValueError):
    kind = "invalid-argument"


def _shape(t):
    return "<undefined>" if t is None else str(list(t.shape))


def check_features(op, x, features):
    if x is None or x.dim() < 1 or x.shape[-1] != features:
        raise InvalidArgumentError(
            f"{op}: input must have {features} features (last dim), got shape {_shape(x)}"
        )


def rms_norm(x, gamma, eps, zero_centered_gamma=False):
    check_features("RMSNorm", x, gamma.shape[0])
    scale = 1 + gamma if zero_centered_gamma else gamma
    return F.rms_norm(x, (x.shape[-1],), scale, eps)


class CustomOp(te.ops.BasicOperation):
    def __init__(self, *, output_style="vector"):
        super().__init__()
        self.output_style = output_style

    def op_forward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} overrides fuser_forward, not op_forward")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} overrides fuser_backward, not op_backward")


def opmath(t):
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def pack(style, tensors):
    if style == "generator":
        return (t for t in tensors)
    return tuple(tensors)


class RowStat(CustomOp):
    num_extra_outputs = 1

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
        x = opmath(input_)
        stat = (x * x).mean(-1).to(input_.dtype)
        if basic_op_ctxs[0].requires_grad:
            # A detached alias, not input_ itself: input_ is also this op's output, so
            # the next op may save the same tensor and free it in its backward (e.g.
            # activation.py: _ActivationOperation.op_backward calls utils.py:
            # clear_tensor_data on it), which runs before this op's backward.
            basic_op_ctxs[0].save_for_backward(input_.detach())
        return input_, [pack(self.output_style, (stat,))]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        (grad_stat,) = basic_op_grad_extra_outputs[0]
        grad_input = grad_output
        if grad_stat is not None:
            (x,) = basic_op_ctxs[0].saved_tensors
            # grad_output [rows, n] + grad_stat [rows, 1] * 2 x [rows, n] / n
            grad_input = opmath(grad_output) + opmath(grad_stat).unsqueeze(-1) * (
                2.0 / x.shape[-1]
            ) * opmath(x)
            grad_input = grad_input.to(grad_output.dtype)
        return grad_input, [()], [pack(self.output_style, ())]


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
