"""gradfuzz case /root/out/work/export/te32_findings_7f2f3b36e014dd81.json (te, float32, input [1, 6]): MakeExtraOutput -> Linear -> AddExtraInput.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings_7f2f3b36e014dd81.json --backend te
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
    [1.3872645, -1.5975015, -0.35945195, -1.6537384, -0.32156444, 2.967176],
], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
W1 = torch.tensor([
    [0.13826038, 0.32648998, 0.47050503, 0.08076905, 0.0024888914, 0.92064476],
    [-0.33507633, -0.6807968, -0.037815906, -0.41512558, 0.059689753, -0.0108471755],
    [0.74072015, -0.41381615, 0.26967576, 0.33712006, -0.44384658, -0.13141],
    [0.11723044, -0.14542818, -0.61655784, -0.51541203, 0.9032377, -0.522586],
    [-0.12593296, -0.066641875, 0.41711444, -0.36606836, 0.18827319, -0.15606636],
    [0.060769327, 0.10362954, -0.06201385, -0.18806, -0.12585348, 0.71143824],
], dtype=torch.float32).double()
DY = torch.tensor([
    [-0.80373776, 1.2684584, 0.5748389, 1.4277712, -0.50019693, 0.34530482],
], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'grad_channel[c0]': (1e-05, 1.3e-06, torch.tensor([[0.0, 0.0, 0.0, 9.5367431640625e-07, 0.0, 2.384185791015625e-07]], dtype=torch.float64), 2.7891374389166924e-05),
    'grad_input': (1e-05, 1.3e-06, torch.tensor([
    [1.4291350858286478e-07, 5.610805313693845e-07, 2.857564602720686e-07, 7.98399714341258e-07, 9.112183914083971e-07, 9.849933917394083e-07],
], dtype=torch.float64), 2.7335692567478076e-05),
    'grad_param[1].Linear[0]': (1e-05, 1.3e-06, torch.tensor([
    [4.989453827874968e-07, 2.108042735926574e-07, 7.429235893141595e-08, 2.809589432217763e-07, 1.6619082998658996e-07, 5.57544353796402e-07],
    [1.4626039046561345e-06, 6.053833203623071e-07, 8.118104233290069e-08, 5.728516043745913e-07, 2.739561750786379e-07, 5.013753252569586e-07],
    [7.85174506745534e-07, 1.2688587958109565e-07, 2.598278570076218e-08, 3.0714318199898116e-08, 9.394489097758196e-08, 2.526967364246957e-07],
    [1.7477952951594489e-06, 2.3162363049777923e-06, 1.6516827372470289e-07, 1.9737361753868754e-06, 6.483239758381387e-07, 1.0039179869636428e-06],
    [7.048247425700538e-07, 6.914615369169042e-08, 5.7582155932323076e-08, 2.3076154320733622e-08, 9.484119800617918e-08, 2.1487539925146848e-07],
    [5.422319304670964e-07, 3.5724423241845216e-07, 1.1201801441984571e-07, 1.6450982798232872e-07, 2.1025755359005416e-08, 7.064253395583364e-07],
], dtype=torch.float64), 7.393907856272848e-05),
    'output': (1e-05, 1.3e-06, torch.tensor([
    [9.316640614542848e-07, 1.0131534331492276e-06, 3.475145575748684e-07, 9.565467138372696e-07, 7.63489978794496e-07, 2.0884996914105614e-06],
], dtype=torch.float64), 3.467635344123337e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    w1 = W1.to(dtype).requires_grad_(True)
    h = x
    c_c0 = h.view_as(h)  # MakeExtraOutput
    h = h @ w1.T  # Linear
    h = h + c_c0  # AddExtraInput
    outputs = [h]
    cotangents = [DY.to(dtype)]
    leaves = [("grad_input", x), ("grad_param[1].Linear[0]", w1)]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.MakeExtraOutput(in_place=True)
    op1 = te.ops.BasicLinear(6, 6, device=DEVICE, dtype=DTYPE, accumulate_into_main_grad=False)
    with torch.no_grad():
        op1.weight.copy_(W1)
    op2 = te.ops.AddExtraInput(in_place=False)
    state["ops"] = ops = [op0, op1, op2]
    op0.set_extra_output_channel(0, 'c0', output_to_caller=False)
    op2.set_extra_input_channel(0, 'c0')
    model = te.ops.Sequential(op0, op1, op2)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = []
    cotangents = [DY.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},
              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) if c is not None}}
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with torch.set_grad_enabled(not no_grad):
        out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    leaves = []
    if not no_grad:
        leaves = [("grad_input", x), ("grad_param[1].Linear[0]", ops[1].weight)]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


PATHS = [['BackwardLinearAdd'], []]
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
