"""gradfuzz case /root/out/work/export/te32_findings_26c481d57be72dea.json (te, float32, input [1, 1]): MakeExtraOutput -> MakeExtraOutput -> AddExtraInput.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings_26c481d57be72dea.json --backend te
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
X = torch.tensor([[0.39701974]], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
DY = torch.tensor([[-0.94863266]], dtype=torch.float32).double()
DY1 = torch.tensor([[0.5079243]], dtype=torch.float32).double()
DY2 = torch.tensor([[0.048374277]], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.3e-06, torch.tensor([[2.384185791015625e-07]], dtype=torch.float64), 1.0635334956645966e-05),
    'extra_output[1]': (1e-05, 1.3e-06, torch.tensor([[2.384185791015625e-07]], dtype=torch.float64), 1.0635334956645966e-05),
    'grad_channel[c0]': (1e-05, 1.3e-06, torch.tensor([[3.2782554626464844e-07]], dtype=torch.float64), 1.1334248668327929e-05),
    'grad_input': (1e-05, 1.3e-06, torch.tensor([[8.046627044677734e-07]], dtype=torch.float64), 1.2145588088408113e-05),
    'output': (1e-05, 1.3e-06, torch.tensor([[4.76837158203125e-07]], dtype=torch.float64), 1.1270669913291932e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    h = x
    o0_0 = h.view_as(h)  # MakeExtraOutput
    c_c0 = h.view_as(h)  # MakeExtraOutput
    h = h + c_c0  # AddExtraInput
    outputs = [h, o0_0, c_c0]
    cotangents = [DY.to(dtype), DY1.to(dtype), DY2.to(dtype)]
    leaves = [("grad_input", x)]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.MakeExtraOutput(in_place=False)
    op1 = te.ops.MakeExtraOutput(in_place=True)
    op2 = te.ops.AddExtraInput(in_place=True)
    state["ops"] = ops = [op0, op1, op2]
    op1.set_extra_output_channel(0, 'c0', output_to_caller=True)
    op2.set_extra_input_channel(0, 'c0')
    model = te.ops.Sequential(op0, op1, op2)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = []
    cotangents = [DY.to(DEVICE, DTYPE, copy=True), DY1.to(DEVICE, DTYPE, copy=True), DY2.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},
              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) if c is not None}}
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with torch.set_grad_enabled(not no_grad):
        out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    leaves = []
    if not no_grad:
        leaves = [("grad_input", x)]
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
    # Repeat calls of the same Sequential (same values), against the reference and
    # against the plans a fresh Sequential makes at its first call with that pattern.
    for k, (no_grad, input_requires_grad) in enumerate([(False, True)], start=1):
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
