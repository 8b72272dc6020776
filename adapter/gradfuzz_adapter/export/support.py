"""Helpers of exported scripts (and of the adapter's tests): inlined values, and the
oracle's comparison with the tolerance a request carries.

Within tolerance means, for every element k, all finite and

    |got_k - expected_k| <= atol + rtol * (rms(expected) + |expected_k|)
                            + min(baseline_factor * |baseline_k - expected_k|,
                                  baseline_cap * max(|expected_k|, rms(expected)))

where `baseline` is the reference rerun in the case's dtype (only when baseline_factor > 0),
as harness/oracle.cc judges. A gradient that is None where the expected one is non-zero is a
missing gradient; one returned where none is expected must be zero. Imports only torch.
"""

import base64
import math
import os

import torch

SCRIPT_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "bool": torch.bool,
}


def b64_tensor(text, dtype, shape):
    """A CPU tensor from the base64 of its little-endian bytes."""
    raw = bytearray(base64.b64decode(text))
    dtype = SCRIPT_DTYPES[dtype] if isinstance(dtype, str) else dtype
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).clone()


def unpack(data, dtype, shape):
    """A tensor from base64 of its little-endian bytes in `dtype`; floats widened to float64."""
    t = torch.frombuffer(bytearray(base64.b64decode(data)), dtype=getattr(torch, dtype))
    return t.reshape(shape).double() if t.is_floating_point() else t.reshape(shape)


def seeded(shape, dtype, *, seed, role, fan_in=0):
    """Values drawn as gradfuzz draws them (harness/builder.cc), rounded to `dtype`:
    role "input" N(0, 1) pushed 0.1 away from zero, "normal" N(0, 1), "weight"
    N(0, 1) / sqrt(fan_in), "vector" as "input"."""
    z = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if role == "weight":
        values = z / math.sqrt(max(fan_in, 1))
    elif role == "normal":
        values = z
    else:
        values = torch.sign(z) * (0.1 + z.abs()) + (z == 0) * 0.1
    return values.to(SCRIPT_DTYPES[dtype]).to(torch.float64)


def load_values(file_name):
    """{key: float64 tensor} from the data file gradfuzz export wrote beside the script."""
    folder = os.path.dirname(os.path.abspath(__file__))
    return torch.load(os.path.join(folder, file_name), weights_only=True)


def mismatch(expected, got, tolerance, baseline=None, gradient=True):
    """None when `got` passes against `expected`, else a one-line description of the worst
    element. tolerance: {"atol", "rtol", "baseline_factor", "baseline_cap"}."""
    if expected is None and got is None:
        return None
    if got is None:
        e = expected.detach().to("cpu", torch.float64)
        if e.numel() == 0 or (gradient and bool((e == 0).all())):
            return None
        k = int(e.abs().reshape(-1).argmax())
        kind = "missing gradient" if gradient else "missing tensor"
        return f"{kind}: expected {e.reshape(-1)[k].item():.6g} at flat index {k}, got None"
    g = got.detach().to("cpu", torch.float64)
    e = torch.zeros_like(g) if expected is None else expected.detach().to("cpu", torch.float64)
    if tuple(g.shape) != tuple(e.shape):
        return f"shape {list(g.shape)}, expected {list(e.shape)}"
    if g.numel() == 0:
        return None
    finite_e = torch.where(torch.isfinite(e), e, torch.zeros_like(e))
    rms = math.sqrt(float((finite_e * finite_e).mean()))
    allowed = tolerance["atol"] + tolerance["rtol"] * (rms + e.abs())
    factor = float(tolerance.get("baseline_factor", 0) or 0)
    if baseline is not None and factor > 0:
        b = baseline.detach().to("cpu", torch.float64)
        if tuple(b.shape) == tuple(e.shape):
            rounding = torch.nan_to_num((b - e).abs(), nan=0.0, posinf=0.0, neginf=0.0)
            cap = float(tolerance.get("baseline_cap", 0) or 0) * torch.clamp(e.abs(), min=rms)
            allowed = allowed + torch.minimum(factor * rounding, cap)
    diff = (g - e).abs()
    bad = ~(torch.isfinite(g) & torch.isfinite(e)) | (diff > allowed)
    if not bool(bad.any()):
        return None
    excess = torch.where(bad, torch.nan_to_num(diff - allowed, nan=math.inf), -math.inf)
    k = int(excess.reshape(-1).argmax())
    index = list(torch.unravel_index(torch.tensor(k), g.shape)) if g.dim() else []
    index = [int(i) for i in index]
    return (
        f"worst element {index}: got {g.reshape(-1)[k].item():.9g}, expected "
        f"{e.reshape(-1)[k].item():.9g}, |diff| {diff.reshape(-1)[k].item():.3g} > allowed "
        f"{allowed.reshape(-1)[k].item():.3g} ({int(bad.sum())} of {g.numel()} elements off)"
    )


def compare_results(expected, got, tolerance, baseline=None, all_channels=True):
    """Every mismatch between two result dicts ("outputs", "grad_input", "grad_params",
    "grad_extra_inputs"[, "channel_grads"]) as "tensor: description" lines. Channels are
    those the expected side has a gradient for; with all_channels=False only those `got`
    exposes (te: channels whose producer's backward group holds none of their consumers)."""
    baseline = baseline or {}
    problems = []

    def check(label, e, g, b, gradient):
        message = mismatch(e, g, tolerance, b, gradient)
        if message:
            problems.append(f"{label}: {message}")

    def at(seq, i):
        return seq[i] if seq is not None and i < len(seq) else None

    n_out = max(len(expected["outputs"]), len(got.get("outputs") or []))
    for i in range(n_out):
        label = "output" if i == 0 else f"extra_output[{i - 1}]"
        check(
            label,
            at(expected["outputs"], i),
            at(got.get("outputs"), i),
            at(baseline.get("outputs"), i),
            False,
        )
    check(
        "grad_input",
        expected["grad_input"],
        got.get("grad_input"),
        baseline.get("grad_input"),
        True,
    )
    for i, grads in enumerate(expected["grad_params"]):
        for j, e in enumerate(grads):
            g = at(at(got.get("grad_params"), i), j)
            b = at(at(baseline.get("grad_params"), i), j)
            check(f"grad_param[{i}][{j}]", e, g, b, True)
    for k, e in enumerate(expected["grad_extra_inputs"]):
        check(
            f"grad_extra_input[{k}]",
            e,
            at(got.get("grad_extra_inputs"), k),
            at(baseline.get("grad_extra_inputs"), k),
            True,
        )
    if "channel_grads" in got:
        for f, channels in enumerate(expected.get("channel_grads") or []):
            got_f = at(got["channel_grads"], f) or {}
            base_f = at(baseline.get("channel_grads"), f) or {}
            for name, e in channels.items():
                if not all_channels and name not in got_f:
                    continue
                check(f"grad_channel[{name}@{f}]", e, got_f.get(name), base_f.get(name), True)
    return problems


def on_device(t, dtype, device, requires_grad=False):
    """A fresh copy of an inlined value: floating tensors in `dtype` with `requires_grad`."""
    if t is None:
        return None
    if t.is_floating_point():
        return t.to(device=device, dtype=dtype, copy=True).requires_grad_(bool(requires_grad))
    return t.to(device=device, copy=True)


def forward_backward(model, x, extras, cotangents, ops, leaves_of, grads_of, after_backward=None):
    """Runs model(x, *extras) and one torch.autograd.grad of sum_k <output_k, cotangent_k>
    (floating outputs that require grad and have a cotangent) with respect to x, every
    parameter leaves_of(op, name) gives and every extra input that requires grad.

    ops: per module of the case, (op, catalog name) or None (Boundary). grads_of(op, name,
    {id(leaf): gradient}) gives the op's parameter gradients in the model's layout;
    after_backward() runs once autograd is done (delayed weight gradients). Returns
    {"outputs", "grad_input", "grad_params", "grad_extra_inputs", "modified"}, "modified"
    naming the caller-owned tensors (input, extra inputs, cotangents) the run changed."""
    caller = [("input", x)] + [(f"extra_input[{k}]", e) for k, e in enumerate(extras)]
    pristine = {name: t.detach().clone() for name, t in caller if t is not None}
    out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    loss_outputs, loss_cotangents = [], []
    for k, (o, c) in enumerate(zip(outputs, cotangents)):
        if c is None or not o.is_floating_point() or not o.requires_grad:
            continue
        c = c.to(device=o.device, dtype=o.dtype, copy=True)
        caller.append((f"cotangent[{k}]", c))
        pristine[f"cotangent[{k}]"] = c.clone()
        loss_outputs.append(o)
        loss_cotangents.append(c)
    wrt = [x] if x.requires_grad else []
    for entry in ops:
        if entry is not None:
            wrt.extend(leaves_of(*entry))
    wrt.extend(e for e in extras if e is not None and e.requires_grad)
    grads = [None] * len(wrt)
    if loss_outputs and wrt:
        grads = torch.autograd.grad(loss_outputs, wrt, loss_cotangents, allow_unused=True)
    if after_backward is not None:
        after_backward()
    by_id = {id(t): g for t, g in zip(wrt, grads)}
    modified = []
    for name, t in caller:
        try:
            # By value, a NaN where there was one unchanged (driver._CallerTensors.modified).
            same = t.shape == pristine[name].shape and bool(
                torch.isclose(t.detach(), pristine[name], rtol=0, atol=0, equal_nan=True).all()
            )
        except RuntimeError:
            same = False
        if not same:
            modified.append(name)
    return {
        "outputs": [o.detach() for o in outputs],
        "grad_input": by_id.get(id(x)) if x.requires_grad else None,
        "grad_params": [[] if entry is None else grads_of(*entry, by_id) for entry in ops],
        "grad_extra_inputs": [
            by_id.get(id(e)) if e is not None and e.requires_grad else None for e in extras
        ],
        "modified": modified,
    }
