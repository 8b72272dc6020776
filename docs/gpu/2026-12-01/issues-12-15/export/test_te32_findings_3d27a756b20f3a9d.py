"""gradfuzz case /root/out/work/export/te32_findings_3d27a756b20f3a9d.json (te, float32, input [1, 8]): MakeExtraOutput -> Linear -> AddExtraInput.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings_3d27a756b20f3a9d.json --backend te
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
    [-0.5365404, 0.6972315, 0.31754765, 2.027165, -1.1994251, 0.5238344, 2.7713065, -1.1174908],
], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
W1 = torch.tensor([
    [-0.28802174, 0.36504295, -0.2566802, 0.41449445, -0.77317137, -0.4084044, 0.23258263, -0.6416175],
    [-0.23911914, -0.0524822, -0.30743048, 0.6494759, 0.02497489, 0.2137352, 0.18200296, -0.572233],
    [-0.2879033, 0.26498508, 0.13784122, -0.14952137, -0.037212495, -0.37943643, -0.73806804, 0.48796484],
    [0.06532483, 0.19672793, 0.07580505, -0.20787218, -0.6317793, -0.6236647, 0.103704475, 0.24021655],
    [-0.21167949, -0.013733118, 0.20931469, -0.5059302, -0.5053671, -0.11826689, 0.4280302, 0.8341848],
    [-0.10877199, -0.037960425, -0.71980655, -0.43414837, -0.05984748, 0.030706463, 0.20370743, 0.06578986],
    [-0.29533857, 0.0034213602, -0.24541302, 0.010373529, -0.026477305, -0.6588267, 0.07117811, 0.0452071],
    [-0.5341473, -0.22707632, 0.4656725, -0.023672502, 0.029843004, 0.052436836, -0.062215697, 0.4440846],
], dtype=torch.float32).double()
DY = torch.tensor([
    [-0.45702177, -0.7546251, -1.2902728, -0.9315175, -0.54326963, 0.22047113, -1.0187247, -0.09722791],
], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'grad_channel[c0]': (1e-05, 1.3e-06, torch.tensor([
    [2.384185791015625e-07, 0.0, 9.5367431640625e-07, 0.0, 0.0, 1.1920928955078125e-07, 0.0, 0.0],
], dtype=torch.float64), 3.159827487838251e-05),
    'grad_input': (1e-05, 1.3e-06, torch.tensor([
    [6.999196848767042e-07, 2.1307307562778988e-07, 1.1010355649432313e-06, 4.884516933145733e-07, 2.807981900332379e-07, 9.98480167879734e-07, 7.236272434596458e-07, 9.814352459613929e-07],
], dtype=torch.float64), 3.3607403203455546e-05),
    'grad_param[1].Linear[0]': (1e-05, 1.3e-06, torch.tensor([
    [1.7631799664741266e-07, 1.245926739557035e-07, 8.57570938705976e-08, 2.7991541173832957e-07, 2.5443858930884744e-07, 1.5803479413989407e-07, 7.538862973888172e-07, 3.3090964279836044e-07],
    [5.339165909390431e-08, 1.7964100607059663e-07, 2.497819195923512e-08, 5.2271388994995505e-08, 4.299113243177999e-08, 9.759480690263445e-08, 1.4320266927825287e-07, 5.656875146087259e-07],
    [6.682799948976026e-07, 7.870442573221226e-07, 2.2654185727333243e-07, 1.705316662992118e-06, 8.294670124087133e-07, 5.490003900376905e-07, 2.104001850966597e-06, 2.61423883785028e-06],
    [3.154275418637553e-08, 6.247989290386613e-07, 4.830107513953408e-08, 4.555545274342876e-07, 3.206326937288395e-07, 2.5289693894592347e-08, 7.318899406527635e-07, 1.2151849659858271e-06],
    [1.0671783456928097e-07, 2.3680945560045075e-07, 2.890158157242695e-08, 1.0602343536447734e-07, 2.1730602384195663e-07, 2.6228690330754034e-08, 3.16364094032906e-07, 6.111149559728801e-07],
    [9.233447428869113e-08, 1.1344636874355274e-07, 6.182422751521699e-08, 3.1371240538646816e-07, 5.334295849479531e-08, 6.801483465324054e-08, 3.834214226117183e-07, 1.8313244254386518e-07],
    [4.298340172681492e-08, 5.377193019739934e-07, 1.960580675586243e-08, 8.632350727566518e-07, 4.7527169044769835e-07, 2.234488647445687e-07, 1.9025446817977354e-07, 1.1968986655119807e-06],
    [3.3383074082848907e-09, 7.09760321626618e-08, 5.0677062546355955e-09, 3.0437746545430855e-08, 2.7477604191972205e-08, 4.758728522347155e-09, 2.57992098795512e-08, 9.904908893076936e-08],
], dtype=torch.float64), 9.3592261995571e-05),
    'output': (1e-05, 1.3e-06, torch.tensor([
    [2.04477925080937e-06, 1.912833567985217e-06, 2.140093176450364e-06, 9.818673873951411e-09, 5.363566568661327e-07, 1.358458989741962e-07, 6.050678287294886e-07, 1.2091789951540477e-06],
], dtype=torch.float64), 3.8354044115932836e-05),
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
    op1 = te.ops.BasicLinear(8, 8, device=DEVICE, dtype=DTYPE, accumulate_into_main_grad=False)
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
