"""gradfuzz case /root/out/work/export/te32_findings_09fcaec144b9e37d.json (te, float32, input [1, 1]): Dispatch -> GroupedLinear -> MakeExtraOutput -> ScaledSReLU -> AddExtraInput.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings_09fcaec144b9e37d.json --backend te
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
X = torch.tensor([[0.17804696]], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
W1 = torch.tensor([[[-0.954339], [-1.2335068], [-0.74900335], [-0.87515056]]], dtype=torch.float32).double()
B1 = torch.tensor([[-0.28133905, 0.18824556, 0.21945365, 0.3559184]], dtype=torch.float32).double()
E0 = torch.tensor([[0.6311942]], dtype=torch.float32).double()
E1 = torch.tensor([1])
DY = torch.tensor([[0.57532614, -1.230018, 0.5521048, 0.047990832]], dtype=torch.float32).double()
DY2 = torch.tensor([0.8408591], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.6250000000000001e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([0.0], dtype=torch.float64), 1.1625000000000001e-05),
    'extra_output[1]': (1e-05, 1.6250000000000001e-06, torch.tensor([0.0], dtype=torch.float64), 1.1625000000000001e-05),
    'extra_output[2]': (1e-05, 1.6250000000000001e-06, torch.tensor([0.0], dtype=torch.float64), 1e-05),
    'grad_channel[c1]': (1e-05, 1.6250000000000001e-06, torch.tensor([5.472520951954607e-07], dtype=torch.float64), 1.1649794925082226e-05),
    'grad_channel[c3]': (1e-05, 1.6250000000000001e-06, torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.float64), 2.2383309062746054e-05),
    'grad_extra_input[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([[0.0]], dtype=torch.float64), 1e-05),
    'grad_input': (1e-05, 1.6250000000000001e-06, torch.tensor([[1.2866356779994703e-06]], dtype=torch.float64), 1.1333353896848089e-05),
    'grad_param[1].GroupedLinear[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([[[4.478099668858704e-08], [1.2175753738574713e-07], [1.854142672730319e-08], [8.07824322712758e-09]]], dtype=torch.float64), 2.0501303193047507e-05),
    'grad_param[1].GroupedLinear[1]': (1e-05, 1.6250000000000001e-06, torch.tensor([[0.0, 0.0, 2.7377075628720604e-07, 3.3238495733556306e-08]], dtype=torch.float64), 2.258473933104032e-05),
    'output': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [5.426670668384759e-08, 1.4823767457983195e-07, 1.5006319564747628e-07, 4.1865904920612707e-07],
], dtype=torch.float64), 2.108194347953603e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    w1 = W1.to(dtype).requires_grad_(True)
    b1 = B1.to(dtype).requires_grad_(True)
    e0 = E0.to(dtype).requires_grad_()
    e1 = E1
    h = x
    h, (o0_0, c_c1, o0_2) = dispatch(h, e0, 1)
    h = grouped_linear(h, e1, w1, b1, None, 1)  # GroupedLinear
    c_c3 = h.view_as(h)  # MakeExtraOutput
    h = scaled_srelu(h, c_c1)  # ScaledSReLU
    h = h + c_c3  # AddExtraInput
    outputs = [h, o0_0, c_c1, o0_2]
    cotangents = [DY.to(dtype), None, DY2.to(dtype), None]
    leaves = [
        ("grad_input", x),
        ("grad_param[1].GroupedLinear[0]", w1),
        ("grad_param[1].GroupedLinear[1]", b1),
        ("grad_extra_input[0]", e0),
    ]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = Dispatch(1, output_style='vector')
    op1 = te.ops.GroupedLinear(1, 1, 4, device=DEVICE, dtype=DTYPE, bias=True, accumulate_into_main_grad=True, single_grouped_weight=False, single_grouped_bias=False, delay_wgrad_compute=False, scale_bias=False)
    copy_param_values(op1, "GroupedLinear", [v.to(DEVICE, DTYPE) for v in (W1, B1,)])
    set_param_requires_grad(op1, "GroupedLinear", [True, True])
    attach_main_grads(op1, "GroupedLinear")
    op2 = te.ops.MakeExtraOutput(in_place=False)
    op3 = te.ops.ScaledSReLU(activation_recompute_in_mlp=True)
    op4 = te.ops.AddExtraInput(in_place=True)
    state["ops"] = ops = [op0, op1, op2, op3, op4]
    op0.set_extra_output_channel(1, 'c1', output_to_caller=True)
    op2.set_extra_output_channel(0, 'c3', output_to_caller=False)
    op3.set_extra_input_channel(0, 'c1')
    op4.set_extra_input_channel(0, 'c3')
    model = te.ops.Sequential(op0, op1, op2, op3, op4)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = [E0.to(DEVICE, DTYPE, copy=True).requires_grad_(), E1.to(DEVICE, copy=True)]
    cotangents = [DY.to(DEVICE, DTYPE, copy=True), None, DY2.to(DEVICE, DTYPE, copy=True), None]
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
            *[(f"op1.{k}", t) for k, t in enumerate(param_leaves(ops[1], "GroupedLinear"))],
            *[(f"grad_extra_input[{k}]", e) for k, e in enumerate(extras)],
        ]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    if not no_grad:
        finish_weight_gradients(ops[1])
        by_id = {id(t): got.get(f"op1.{k}") for k, t in enumerate(param_leaves(ops[1], "GroupedLinear"))}
        for j, g in enumerate(model_param_got(ops[1], "GroupedLinear", by_id)):
            got[f"grad_param[1].GroupedLinear[{j}]"] = g
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


class GradfuzzError(Exception):
    kind = "unrecognized"


class InvalidArgumentError(GradfuzzError, ValueError):
    kind = "invalid-argument"


def _shape(t):
    return "<undefined>" if t is None else str(list(t.shape))


def check_2d(op, x):
    if x is None or x.dim() != 2:
        raise InvalidArgumentError(f"{op}: input must be 2-D [rows, features], got {_shape(x)}")


def check_logits(op, logits, rows, groups):
    if logits is None or logits.dim() != 2 or tuple(logits.shape) != (rows, groups):
        raise InvalidArgumentError(
            f"{op} slot 0: router logits must have shape [rows={rows}, G={groups}], "
            f"got {_shape(logits)}"
        )
    if not logits.is_floating_point():
        raise InvalidArgumentError(
            f"{op} slot 0: router logits must be floating point, got {logits.dtype}"
        )


def dispatch(x, logits, groups):
    check_2d("Dispatch", x)
    rows = x.shape[0]
    check_logits("Dispatch", logits, rows, groups)
    group = torch.argmax(logits.detach(), dim=1)
    routing_map = torch.sort(group, stable=True).indices
    split_sizes = torch.bincount(group, minlength=groups).to(torch.int64)
    probs = torch.softmax(logits, dim=1).gather(1, group.unsqueeze(1)).squeeze(1)
    return x.index_select(0, routing_map), (
        split_sizes,
        probs.index_select(0, routing_map),
        routing_map,
    )


def check_row_vector(op, slot, what, t, rows):
    if t is None or t.dim() != 1 or t.shape[0] != rows:
        raise InvalidArgumentError(
            f"{op} slot {slot}: {what} must have shape [rows={rows}], got {_shape(t)}"
        )


def check_split_sizes(op, split_sizes, groups, rows):
    where = f"{op} slot 0: split sizes"
    if split_sizes is None:
        raise InvalidArgumentError(f"{where} must be an int64 tensor [G={groups}], got None")
    if (
        split_sizes.is_floating_point()
        or split_sizes.is_complex()
        or split_sizes.dtype == torch.bool
    ):
        raise InvalidArgumentError(
            f"{where} must have an integer dtype (int64), got {split_sizes.dtype}"
        )
    if split_sizes.numel() != groups:
        raise InvalidArgumentError(f"{where} must have numel=G={groups}, got {split_sizes.numel()}")
    sizes = [int(s) for s in split_sizes.reshape(-1).tolist()]
    for g, s in enumerate(sizes):
        if s < 0:
            raise InvalidArgumentError(f"{where} must be non-negative, got {s} for group {g}")
    if sum(sizes) != rows:
        raise InvalidArgumentError(f"{where} must sum to rows={rows}, got {sum(sizes)}")
    return sizes


def grouped_linear(x, split_sizes, weights, biases=None, scales=None, groups=1):
    check_2d("GroupedLinear", x)
    if x.shape[1] != weights.shape[2]:
        raise InvalidArgumentError(
            f"GroupedLinear: input must be [rows, in={weights.shape[2]}], got {list(x.shape)}"
        )
    sizes = check_split_sizes("GroupedLinear", split_sizes, groups, x.shape[0])
    if scales is not None:
        check_row_vector("GroupedLinear", 1, "scales", scales, x.shape[0])
        scale_parts = torch.split(scales, sizes)
    parts = []
    for g, x_g in enumerate(torch.split(x, sizes)):
        if scales is not None:
            y_g = F.linear(x_g, weights[g]) + torch.outer(scale_parts[g], biases[g])
        elif biases is not None:
            y_g = F.linear(x_g, weights[g], biases[g])
        else:
            y_g = F.linear(x_g, weights[g])
        parts.append(y_g)
    return torch.cat(parts, 0)


def scaled_srelu(x, scales):
    check_2d("ScaledSReLU", x)
    check_row_vector("ScaledSReLU", 0, "scales", scales, x.shape[0])
    return torch.square(torch.relu(x)) * scales.unsqueeze(-1)


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


class Dispatch(CustomOp):
    num_extra_inputs = 1
    num_extra_outputs = 3

    def __init__(self, groups, *, output_style="vector"):
        super().__init__(output_style=output_style)
        self.groups = groups

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
        (logits,) = basic_op_extra_inputs[0]
        check_2d("Dispatch", input_)
        check_logits("Dispatch", logits, input_.shape[0], self.groups)
        probs_full = torch.softmax(opmath(logits), dim=1)
        group = torch.argmax(logits, dim=1)
        routing_map = torch.sort(group, stable=True).indices
        split_sizes = torch.bincount(group, minlength=self.groups).to(torch.int64)
        token_probs = probs_full.gather(1, group.unsqueeze(1)).squeeze(1)
        token_probs = token_probs.index_select(0, routing_map).to(logits.dtype)
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.save_for_backward(routing_map, probs_full, group)
            # TE's convention (swiglu.py: _ScaledGLU.fuser_forward): the extra input's
            # requires_grad says whether its gradient is wanted.
            ctx.logits_requires_grad = logits.requires_grad
            ctx.logits_dtype = logits.dtype
        extra = (split_sizes, token_probs, routing_map)
        return input_.index_select(0, routing_map), [pack(self.output_style, extra)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        routing_map, probs_full, group = ctx.saved_tensors
        # grad_output [rows, n] scattered back: grad_input[map[i]] = grad_output[i]
        grad_input = torch.empty_like(grad_output).index_copy_(0, routing_map, grad_output)
        grad_probs = basic_op_grad_extra_outputs[0][1]
        grad_logits = None
        if ctx.logits_requires_grad and grad_probs is not None:
            rows = probs_full.shape[0]
            # back to the original row order, then d p_k / d l_j = p_k (delta_jk - p_j)
            gp = torch.zeros(rows, dtype=probs_full.dtype, device=probs_full.device)
            gp = gp.index_copy_(0, routing_map, grad_probs.to(probs_full.dtype)).unsqueeze(1)
            p_k = probs_full.gather(1, group.unsqueeze(1))
            one_hot = torch.zeros_like(probs_full).scatter_(1, group.unsqueeze(1), 1.0)
            grad_logits = (gp * p_k * (one_hot - probs_full)).to(ctx.logits_dtype)
        return grad_input, [()], [pack(self.output_style, (grad_logits,))]


def _per_group(op, name, k):
    if name != "GroupedLinear":
        return False
    return not (op.single_grouped_weight if k == 0 else op.single_grouped_bias)


def _storage(t):
    data = getattr(t, "rowwise_data", None)
    return t if data is None else data.view(tuple(t.shape))


def param_groups(op, name):
    if name in ("Linear", "RMSNorm"):
        return [[op.weight]]
    if name == "Bias":
        return [[op.bias]]
    if name == "LayerNorm":
        return [[op.weight], [op.bias]]
    if name == "GroupedLinear":
        if op.single_grouped_weight:
            groups = [[op.weight]]
        else:
            groups = [[getattr(op, f"weight{g}") for g in range(op.num_groups)]]
        if op.has_bias:
            if op.single_grouped_bias:
                groups.append([op.bias])
            else:
                groups.append([getattr(op, f"bias{g}") for g in range(op.num_groups)])
        return groups
    return []


def copy_param_values(op, name, values):
    with torch.no_grad():
        for k, (tensors, value) in enumerate(zip(param_groups(op, name), values)):
            if _per_group(op, name, k):
                for g, t in enumerate(tensors):
                    t.copy_(value[g])
            else:
                _storage(tensors[0]).copy_(value.reshape(tuple(tensors[0].shape)))


def set_param_requires_grad(op, name, flags):
    for tensors, flag in zip(param_groups(op, name), flags):
        for t in tensors:
            t.requires_grad_(bool(flag))


def attach_main_grads(op, name):
    if not getattr(op, "_accumulate_into_main_grad", False):
        return
    for t in param_groups(op, name)[0]:
        t.main_grad = torch.zeros(tuple(t.shape), dtype=torch.float32, device=t.device)


def param_leaves(op, name):
    return [t for tensors in param_groups(op, name) for t in tensors if t.requires_grad]


def model_param_grads(op, name, autograd_grads):
    out = []
    for k, tensors in enumerate(param_groups(op, name)):
        grads = []
        for t in tensors:
            if not t.requires_grad:
                grads.append(None)
            elif k == 0 and getattr(op, "_accumulate_into_main_grad", False):
                grads.append(getattr(t, "main_grad", None))
            elif (
                k == 0
                and getattr(op, "need_backward_dw", None) is not None
                and op.need_backward_dw()
            ):
                grads.append(t.grad)
            else:
                grads.append(autograd_grads.get(id(t)))
        if any(g is None for g in grads):
            out.append(None)  # a group without its gradient: the whole tensor has none
        elif _per_group(op, name, k):
            out.append(torch.stack([g.reshape(tuple(t.shape)) for g, t in zip(grads, tensors)]))
        else:
            out.append(_storage(grads[0]).reshape(tuple(tensors[0].shape)))
    return out


def finish_weight_gradients(op):
    if getattr(op, "need_backward_dw", None) is not None and op.need_backward_dw():
        op.backward_dw()


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
