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
