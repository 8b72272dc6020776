"""gradfuzz case /root/out/work/export/te32_findings-known_9b4c9e464d5423c9.json (te, float32, input [2, 3]): MakeExtraOutput -> Linear.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings-known_9b4c9e464d5423c9.json --backend te
Expected: outputs and gradients within gradfuzz's bounds of the float64 reference, no caller tensor changed.
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
    [-1.4179496, -0.12762524, -0.57940483],
    [1.250064, 0.10601101, 0.53478473],
], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = False
W1 = torch.tensor([
    [0.09355375, -0.8029694, 0.26011476],
    [-0.6661843, 0.19028428, 0.12612419],
], dtype=torch.float32).double()
DY = torch.tensor([[0.5379161, 0.870896], [-1.5178274, -0.13933355]], dtype=torch.float32).double()
DY1 = torch.tensor([
    [0.78044564, -0.42389554, 0.81085354],
    [0.9243398, 0.54464644, 2.5506837],
], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.3e-06, torch.tensor([
    [0.0, 0.0, 4.76837158203125e-07],
    [9.5367431640625e-07, 5.9604644775390625e-08, 0.0],
], dtype=torch.float64), 2.7700175069851383e-05),
    'grad_param[1].Linear[0]': (1e-05, 1.3e-06, torch.tensor([
    [1.599951758635143e-06, 1.51646204926692e-07, 2.2039040459276293e-07],
    [3.077554424635309e-07, 6.041882372187501e-08, 4.593415212639229e-07],
], dtype=torch.float64), 2.9610224572234147e-05),
    'output': (1e-05, 1.3e-06, torch.tensor([
    [1.4064075770647833e-07, 1.619171108302453e-07],
    [1.1614036665719141e-07, 5.618366305526479e-07],
], dtype=torch.float64), 2.1808309477654907e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    w1 = W1.to(dtype).requires_grad_(True)
    h = x
    c_c0 = h.view_as(h)  # MakeExtraOutput
    h = h @ w1.T  # Linear
    outputs = [h, c_c0]
    cotangents = [DY.to(dtype), DY1.to(dtype)]
    leaves = [("grad_input", x), ("grad_param[1].Linear[0]", w1)]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.MakeExtraOutput(in_place=True)
    op1 = te.ops.BasicLinear(3, 2, device=DEVICE, dtype=DTYPE, accumulate_into_main_grad=True)
    copy_param_values(op1, "Linear", [v.to(DEVICE, DTYPE) for v in (W1,)])
    set_param_requires_grad(op1, "Linear", [True])
    attach_main_grads(op1, "Linear")
    state["ops"] = ops = [op0, op1]
    op0.set_extra_output_channel(0, 'c0', output_to_caller=True)
    model = te.ops.Sequential(op0, op1)
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
        leaves = [
            ("grad_input", x),
            *[(f"op1.{k}", t) for k, t in enumerate(param_leaves(ops[1], "Linear"))],
        ]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    if not no_grad:
        finish_weight_gradients(ops[1])
        by_id = {id(t): got.get(f"op1.{k}") for k, t in enumerate(param_leaves(ops[1], "Linear"))}
        for j, g in enumerate(model_param_got(ops[1], "Linear", by_id)):
            got[f"grad_param[1].Linear[{j}]"] = g
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


PATHS = [['ForwardLinearBiasActivation', 'UserbuffersBackwardLinear', 'BackwardLinearAdd', 'BackwardLinearScale', 'BackwardAddRMSNorm'], []]
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
