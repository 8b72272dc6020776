"""gradfuzz case /root/out/work/export/te32_findings_19c2e32aa13d0245.json (te, float32, input [1, 16]): GroupedLinear.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings_19c2e32aa13d0245.json --backend te
Expected: outputs and gradients within gradfuzz's bounds of the float64 reference, no caller tensor changed.
Quantized by recipe Float8BlockScaling (HYBRID): the expected values (EXPECTED) are gradfuzz's float64 reference with TE's quantize-dequantize (ops/quantization.cc), shipped with the script; reference() is the unquantized math, for reading.
"""
import os

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32

import contextlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype
DTYPE = torch.float32
DEVICE = torch.device("cuda")
X = torch.tensor([
    [-1.0246339, -0.29628402, -1.292837, -1.0356607, 0.6413687, 1.2837819, -1.578122, 0.99311, 1.0354432, -0.55290097, -0.19729114, -0.41693398, 0.13883075, -0.61751705, -0.5641362, -1.0538174],
], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
W0 = torch.tensor([[[-0.24042884, -0.1458354, -0.35725048, -0.121563874, 0.2767711, -0.05096408, -0.20021687, -0.06783635, -0.08892841, -0.1730326, 0.0766098, 0.10296016, 0.1477674, -0.07246517, -0.33622867, 0.33591637]]], dtype=torch.float32).double()
E0 = torch.tensor([1])
DY = torch.tensor([[0.82576805]], dtype=torch.float32).double()
RECIPE = recipe.Float8BlockScaling(fp8_format=recipe.Format.HYBRID, use_f32_scales=False, backward_override='high_precision', x_block_scaling_dim=1, w_block_scaling_dim=2, grad_block_scaling_dim=1)
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'grad_input': (1e-05, 1.3e-06, torch.tensor([
    [1.2856291675689135e-07, 6.876348379591946e-08, 2.523618007899131e-07, 1.2772322932619318e-07, 1.528170372466775e-07, 1.9161962683256206e-08, 4.8469935620687465e-08, 3.991811681203217e-08, 1.5823044208218562e-08, 1.2174384522722903e-07, 2.0667467737212064e-08, 1.2115060954442924e-07, 5.312172390858905e-08, 3.4383852209884935e-08, 1.9091558556283417e-07, 1.376450171619581e-07],
], dtype=torch.float64), 4.1100970003708496e-05),
    'grad_param[0].GroupedLinear[0]': (1e-05, 1.3e-06, torch.tensor([[[4.6381569518416654e-07, 1.5181339563241636e-07, 3.8656213519061566e-07, 4.2094643504242413e-07, 5.370955875605432e-07, 1.1952533327530546e-06, 5.175007231628115e-07, 3.1382941756419314e-07, 4.4640734131462523e-07, 3.593831081616372e-07, 1.4108775303611765e-07, 7.35541050289612e-09, 7.9730241964171e-08, 8.457872979761305e-07, 3.7129521501810814e-07, 5.10148026933166e-07]]], dtype=torch.float64), 4.486078651545852e-05),
    'output': (1e-05, 1.3e-06, torch.tensor([[1.150390625]], dtype=torch.float64), 0.575206700415039),
}
EXPECTED = [  # per call: tensor -> the float64 FP8 reference's value
    {
        'grad_input': torch.tensor([
    [-0.19853845121765268, -0.12042621408656373, -0.29500603501552014, -0.10038356376558388, 0.22854873117920427, -0.042084508974221446, -0.165332698723744, -0.05601709209594974, -0.07343423913816638, -0.14288479058054993, 0.06326192359073035, 0.08502121245436411, 0.12202159396384182, -0.059839419447889064, -0.27764689328545344, 0.27738900713101167],
], dtype=torch.float64),
        'grad_param[0].GroupedLinear[0]': torch.tensor([[[-0.8461099283282749, -0.24466187844420872, -1.0675835126233366, -0.8552155564553345, 0.529621772386367, 1.0601060692446183, -1.3031627484990551, 0.8200785125405794, 0.8550359048733682, -0.45656795777791714, -0.16291671717867473, -0.34429076405915104, 0.11464199917278073, -0.5099258557710336, -0.46584565766677244, -0.8702087360705164]]], dtype=torch.float64),
        'output': torch.tensor([[1.067626953125]], dtype=torch.float64),
    },
]


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    w0 = W0.to(dtype).requires_grad_(True)
    e0 = E0
    h = x
    h = grouped_linear(h, e0, w0, None, None, 1)  # GroupedLinear
    outputs = [h]
    cotangents = [DY.to(dtype)]
    leaves = [("grad_input", x), ("grad_param[0].GroupedLinear[0]", w0)]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.GroupedLinear(1, 16, 1, device=DEVICE, dtype=DTYPE, bias=False, accumulate_into_main_grad=False, single_grouped_weight=False, single_grouped_bias=False, delay_wgrad_compute=False, scale_bias=False)
    copy_param_values(op0, "GroupedLinear", [v.to(DEVICE, DTYPE) for v in (W0,)])
    set_param_requires_grad(op0, "GroupedLinear", [True])
    attach_main_grads(op0, "GroupedLinear")
    state["ops"] = ops = [op0]
    model = te.ops.Sequential(op0)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = [E0.to(DEVICE, copy=True)]
    cotangents = [DY.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},
              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) if c is not None}}
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with torch.set_grad_enabled(not no_grad), te.autocast(recipe=RECIPE):
        out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    leaves = []
    if not no_grad:
        leaves = [
            ("grad_input", x),
            *[(f"op0.{k}", t) for k, t in enumerate(param_leaves(ops[0], "GroupedLinear"))],
            *[(f"grad_extra_input[{k}]", e) for k, e in enumerate(extras)],
        ]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    if not no_grad:
        finish_weight_gradients(ops[0])
        by_id = {id(t): got.get(f"op0.{k}") for k, t in enumerate(param_leaves(ops[0], "GroupedLinear"))}
        for j, g in enumerate(model_param_got(ops[0], "GroupedLinear", by_id)):
            got[f"grad_param[0].GroupedLinear[{j}]"] = g
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


PATHS = [[], []]
PATH_NAMES = ['fused', 'unfused']


@pytest.mark.parametrize("fusions", PATHS, ids=PATH_NAMES)
def test_case(fusions):
    expected = EXPECTED[0]
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
