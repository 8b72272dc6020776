"""What TE's FP8 does that gradfuzz's reference did not (issue 14; docs/TE.md).

    python adapter/tests/probe_te_fp8.py      # on the H200 with TE installed; $OUT: JSON too

Reads nothing but TE. Each section prints one line per check and a verdict:

1. quantize: TE's quantizers (Float8Quantizer at scale 1, Float8CurrentScalingQuantizer,
   Float8BlockQuantizer 1D and 2D, shapes with partial 128-blocks) against the reference's
   rule written out here in plain torch (ops/quantization.cc): FP8 codes equal, or not.
2. gemm: te.ops.BasicLinear under each recipe in float32, its output, input gradient and
   weight gradient against the same GEMMs on the reference's operands (a) exactly and (b)
   with Hopper's FP8 accumulator emulated (32 products per step aligned to the largest
   exponent, 13 fraction bits, truncation; fast accumulation over the whole reduction for
   the forward GEMM of per-tensor recipes, a fresh accumulator every 128 products otherwise):
   |TE - emulated| should be 0 and |TE - exact| within the accumulation term.
3. options: the power-of-2 flag te.ops' Linear quantizers get for use_power_2_scales=True
   and use_f32_scales=True (TE 2.20.2 ignores both).
4. transpose: Linear -> Linear under DelayedScaling: the FP8 gradient the second Linear's
   dgrad GEMM writes for the first, its data transpose against its data (the first Linear's
   wgrad reads the transpose); the allocator's memory is filled with 0xFF (E4M3 NaN) first,
   so a transpose nobody wrote shows as NaN in the weight gradient.
5. override: Linear -> GELU under backward_override="high_precision": whether the gradient
   the Linear's backward receives is an FP8 tensor (the activation quantizing it with the
   Linear's grad_output quantizer, which the override should stop).
"""

import json
import math
import os

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FMAX = {E4M3: 448.0, E5M2: 57344.0}
RESULTS = {}


def report(section, name, ok, detail):
    RESULTS.setdefault(section, []).append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"{section:9s} {'ok  ' if ok else 'DIFF'} {name}: {detail}")


# ----------------------------------------------------------------------------------------
# The reference's quantization (ops/quantization.cc), in plain torch: codes and fp32 scales


def ref_scale(amax, dtype, pow2):
    amax = amax.float()
    bad = (amax == 0) | amax.isinf() | amax.isnan()
    scale = torch.full_like(amax, FMAX[dtype]) / torch.where(bad, torch.ones_like(amax), amax)
    scale = torch.where(
        scale.isinf(), torch.full_like(scale, torch.finfo(torch.float32).max), scale
    )
    if pow2:
        scale = (scale.contiguous().view(torch.int32) & -8388608).view(torch.float32)
    return torch.where(bad, torch.ones_like(scale), scale)


def ref_codes(x, scale, dtype):
    """(FP8 values as float64, float64 scale_inv) of x [M, K] under a broadcastable scale."""
    q = (x.float() * scale).clamp(-FMAX[dtype], FMAX[dtype]).to(dtype)
    return q.double(), (torch.ones_like(scale) / scale).double()


def ref_block(x, dtype, rows, cols):
    """Per block of rows x cols (partial blocks cover what is there), power-of-2 scales."""
    m, k = x.shape
    pm, pk = (-m) % rows, (-k) % cols
    a = torch.nn.functional.pad(x.float().abs(), (0, pk, 0, pm))
    amax = a.reshape((m + pm) // rows, rows, (k + pk) // cols, cols).amax(dim=(1, 3))
    scale = ref_scale(amax, dtype, True).repeat_interleave(rows, 0).repeat_interleave(cols, 1)
    return ref_codes(x, scale[:m, :k], dtype)


def ref_quantize(kind, x, dtype, dim=1, columnwise=False):
    """(codes, scale_inv per element) of the reference's quantization of x [M, K]."""
    if kind == "delayed":  # call 1: every scale 1
        return ref_codes(x, torch.ones((), device=x.device), dtype)
    if kind == "current":
        return ref_codes(x, ref_scale(x.float().abs().amax(), dtype, False), dtype)
    if dim == 2:
        return ref_block(x, dtype, 128, 128)
    return ref_block(x, dtype, 128, 1) if columnwise else ref_block(x, dtype, 1, 128)


# ----------------------------------------------------------------------------------------
# Hopper's FP8 accumulator (ops/quantization.cc: emulate_fp8_gemm), vectorised


def trunc_to(x, exponent):
    unit = torch.ldexp(torch.ones_like(x), exponent)
    return torch.trunc(x / unit) * unit


def ilogb(x):
    _, e = torch.frexp(x)
    return e - 1


def emulate(a, b, fast, bits=13, step=32, promote=128):
    """a [M, K] . b [K, N] in float64 value space (exact where scales are powers of two)."""
    p = a[:, None, :] * b.t()[None, :, :]  # [M, N, K], exact
    k = p.shape[-1]
    span = k if fast else promote
    promoted = torch.zeros(p.shape[:2], dtype=torch.float32, device=p.device)
    acc = torch.zeros(p.shape[:2], dtype=torch.float64, device=p.device)
    for k0 in range(0, k, step):
        if k0 % span == 0 and k0 > 0:
            promoted = promoted + acc.float()
            acc = torch.zeros_like(acc)
        terms = torch.cat([acc[..., None], p[..., k0 : k0 + step]], dim=-1)
        nonzero = terms != 0
        e = torch.where(
            nonzero, ilogb(terms.abs()), torch.full_like(terms, -(10**6), dtype=torch.int32)
        )
        largest = e.amax(-1, keepdim=True)
        kept = torch.where(nonzero, trunc_to(terms, largest - bits), torch.zeros_like(terms))
        s = kept.sum(-1)
        acc = torch.where(s != 0, trunc_to(s, ilogb(s.abs().clamp_min(1e-300)) - bits), s)
    return (promoted + acc.float()).double()


def term(a, b, fast, bits=13, step=32, promote=128):
    """ops/quantization.cc: fp8_accumulation_term."""
    k = a.shape[1]
    span = k if fast else promote
    t = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    partial = torch.zeros_like(t)
    for k0 in range(0, k, step):
        if k0 % span == 0:
            partial = torch.zeros_like(partial)
        a_s, b_s = a[:, k0 : k0 + step], b[k0 : k0 + step]
        n = a_s.shape[1]
        largest = a_s.abs().amax(1, keepdim=True) * b_s.abs().amax(0, keepdim=True)
        unit = 2.0**-bits * torch.maximum(partial.abs(), largest)
        signs = (torch.sign(a_s) @ torch.sign(b_s)).abs()
        t += unit * (signs * 0.5 + math.sqrt(n / 12) + 1)
        partial += a_s @ b_s
    return t


# ----------------------------------------------------------------------------------------


def probe_quantize(te_mod):
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.float8_tensor import (
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
    )

    tex_dtype = {E4M3: te_mod.DType.kFloat8E4M3, E5M2: te_mod.DType.kFloat8E5M2}
    gen = torch.Generator(device="cuda").manual_seed(1)
    for shape in ((16, 48), (20, 200), (130, 257)):
        x = torch.randn(shape, device="cuda", generator=gen) * 3
        for dtype in (E4M3, E5M2):
            cases = {
                "delayed": (
                    Float8Quantizer(
                        torch.ones(1, device="cuda"),
                        torch.zeros(1, device="cuda"),
                        tex_dtype[dtype],
                    ),
                    {},
                ),
                "current": (
                    Float8CurrentScalingQuantizer(tex_dtype[dtype], torch.device("cuda")),
                    {},
                ),
            }
            for dim in (1, 2):
                for columnwise in (False, True) if dim == 1 else (False,):
                    q = Float8BlockQuantizer(
                        tex_dtype[dtype],
                        rowwise=not columnwise,
                        columnwise=columnwise,
                        block_scaling_dim=dim,
                    )
                    cases[f"block{dim}d{'-col' if columnwise else ''}"] = (
                        q,
                        {"dim": dim, "columnwise": columnwise},
                    )
            for name, (quantizer, kw) in cases.items():
                kind = name if name in ("delayed", "current") else "block"
                got = quantizer(x).dequantize(dtype=torch.float32).double()
                codes, sinv = ref_quantize(kind, x, dtype, **kw)
                want = codes * sinv
                diff = (got - want).abs().max().item()
                report(
                    "quantize",
                    f"{name} {str(dtype)[-7:]} {list(shape)}",
                    diff == 0,
                    f"max |TE - ref| {diff:.3g}",
                )


def probe_gemm(te):
    from transformer_engine.common import recipe as r

    recipes = {
        "DelayedScaling E4M3": (
            r.DelayedScaling(fp8_format=r.Format.E4M3),
            "delayed",
            E4M3,
            1,
            1,
            True,
        ),
        "DelayedScaling HYBRID": (
            r.DelayedScaling(fp8_format=r.Format.HYBRID),
            "delayed",
            E5M2,
            1,
            1,
            True,
        ),
        "Float8CurrentScaling E4M3": (
            r.Float8CurrentScaling(fp8_format=r.Format.E4M3),
            "current",
            E4M3,
            1,
            1,
            True,
        ),
        "Float8BlockScaling 1,2,1": (r.Float8BlockScaling(), "block", E4M3, 1, 2, False),
        "Float8BlockScaling 1,1,1": (
            r.Float8BlockScaling(w_block_scaling_dim=1),
            "block",
            E4M3,
            1,
            1,
            False,
        ),
    }
    gen = torch.Generator(device="cuda").manual_seed(2)
    for rows, k_in, out in ((16, 48, 16), (160, 1024, 272)):
        x0 = torch.randn(rows, k_in, device="cuda", generator=gen)
        w0 = torch.randn(out, k_in, device="cuda", generator=gen) / math.sqrt(k_in)
        dy = torch.randn(rows, out, device="cuda", generator=gen)
        for label, (recipe, kind, gdtype, xdim, wdim, fast) in recipes.items():
            op = te.ops.BasicLinear(k_in, out, device="cuda", dtype=torch.float32)
            with torch.no_grad():
                op.weight.copy_(w0)
            x = x0.clone().requires_grad_(True)
            with te.autocast(enabled=True, recipe=recipe):
                y = op(x)
            y.backward(dy)
            torch.cuda.synchronize()
            q = {
                role: {
                    col: ref_quantize(kind, t, dt, dim=dim, columnwise=col) for col in (False, True)
                }
                for role, t, dt, dim in (
                    ("x", x0, E4M3, xdim),
                    ("w", w0, E4M3, wdim),
                    ("g", dy, gdtype, 1),
                )
            }

            def dq(role, columnwise, q=q):
                codes, scale_inv = q[role][columnwise]
                return codes * scale_inv

            gemms = {
                # y = x . W^T (row-wise copies); dx = dy . W (dy row-wise, W column-wise);
                # dW = dy^T . x (column-wise copies)
                "fprop": (y, dq("x", False), dq("w", False).t(), fast),
                "dgrad": (x.grad, dq("g", False), dq("w", True), False),
                "wgrad": (op.weight.grad, dq("g", True).t(), dq("x", True), False),
            }
            for gemm, (got, a, b, is_fast) in gemms.items():
                got = got.double()
                exact = a @ b
                emulated = emulate(a, b, is_fast)
                t = term(a, b, is_fast)
                to_emulated = (got - emulated).abs().max().item()
                ratio = ((got - exact).abs() / t).max().item()
                # ok: within the term; bit for bit with the emulation where the scales are
                # powers of two (per-tensor scales align products in code space, not value space)
                report(
                    "gemm",
                    f"{label} {gemm} [{a.shape[0]},{a.shape[1]}]x[{b.shape[1]}]",
                    ratio <= 1,
                    f"max |TE - emulated| {to_emulated:.3g}, max |TE - exact| / term {ratio:.3f}, "
                    f"|TE - exact| / |exact| {((got - exact).norm() / exact.norm()).item():.2e}",
                )


def probe_options(te):
    from transformer_engine.common import recipe as r

    for label, recipe, documented in (
        (
            "Float8CurrentScaling(use_power_2_scales=True)",
            r.Float8CurrentScaling(use_power_2_scales=True),
            True,
        ),
        (
            "Float8BlockScaling(use_f32_scales=True)",
            r.Float8BlockScaling(use_f32_scales=True),
            False,
        ),
    ):
        op = te.ops.BasicLinear(32, 32, device="cuda", dtype=torch.float32)
        with te.autocast(enabled=True, recipe=recipe):
            op(torch.randn(32, 32, device="cuda"))
        got = [
            op.get_quantizer("forward", 0).force_pow_2_scales,
            op.get_quantizer("forward", 1).force_pow_2_scales,
        ]
        report(
            "options",
            label,
            all(g == documented for g in got),
            f"quantizers' force_pow_2_scales {got}, documented {documented}",
        )


def probe_transpose(te):
    from transformer_engine.common import recipe as r

    for fmt in ("E4M3", "HYBRID"):
        captured = {}
        first = te.ops.BasicLinear(32, 48, device="cuda", dtype=torch.float32)
        second = te.ops.BasicLinear(48, 16, device="cuda", dtype=torch.float32)
        original = type(first).op_backward

        def op_backward(self, ctx, grad_output, _original=original, first=first, captured=captured):
            if self is first:
                captured["dy"] = grad_output
                data = getattr(grad_output, "_data", None)
                transpose = getattr(grad_output, "_transpose", None)
                if data is not None and transpose is not None:
                    captured["transpose_matches"] = bool(
                        torch.equal(transpose, data.t().contiguous())
                    )
            return _original(self, ctx, grad_output)

        type(first).op_backward = op_backward
        try:
            model = te.ops.Sequential(first, second)
            x = torch.randn(32, 32, device="cuda", requires_grad=True)
            with te.autocast(
                enabled=True, recipe=r.DelayedScaling(fp8_format=getattr(r.Format, fmt))
            ):
                y = model(x)
            # Small blocks of E4M3 NaN bytes, freed: the caching allocator's small pool hands
            # them out again, so a buffer nobody writes reads as NaN.
            junk = [torch.full((4096,), 255, dtype=torch.uint8, device="cuda") for _ in range(256)]
            del junk
            y.backward(torch.randn_like(y))
            torch.cuda.synchronize()
        finally:
            type(first).op_backward = original
        dy = captured.get("dy")
        wgrad_finite = (
            bool(first.weight.grad.isfinite().all()) if first.weight.grad is not None else None
        )
        report(
            "transpose",
            f"Linear->Linear DelayedScaling {fmt}",
            captured.get("transpose_matches", True) and wgrad_finite,
            f"first Linear's dy {type(dy).__name__}, its _transpose equals _data.T: "
            f"{captured.get('transpose_matches')}, weight gradient finite: {wgrad_finite}",
        )


def probe_override(te):
    from transformer_engine.common import recipe as r

    for label, recipe in (
        (
            "Float8CurrentScaling HYBRID",
            r.Float8CurrentScaling(fp8_format=r.Format.HYBRID, backward_override="high_precision"),
        ),
        ("Float8BlockScaling", r.Float8BlockScaling(backward_override="high_precision")),
    ):
        seen = {}
        linear = te.ops.BasicLinear(32, 32, device="cuda", dtype=torch.float32)
        original = type(linear).op_backward

        def op_backward(self, ctx, grad_output, _original=original, linear=linear, seen=seen):
            if self is linear:
                seen["type"] = type(grad_output).__name__
            return _original(self, ctx, grad_output)

        type(linear).op_backward = op_backward
        try:
            model = te.ops.Sequential(linear, te.ops.GELU())
            x = torch.randn(32, 32, device="cuda", requires_grad=True)
            with te.autocast(enabled=True, recipe=recipe):
                y = model(x)
            y.backward(torch.randn_like(y))
        finally:
            type(linear).op_backward = original
        quantized = seen.get("type", "") not in ("Tensor", "")
        report(
            "override",
            f"Linear->GELU {label} high_precision",
            not quantized,
            f"the Linear's grad_output is a {seen.get('type')}",
        )


def main():
    import transformer_engine.pytorch as te
    import transformer_engine_torch as tex

    torch.backends.cuda.matmul.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability()
    print(f"device {torch.cuda.get_device_name()} sm_{major}{minor}")
    for name, fn in (
        ("quantize", lambda: probe_quantize(tex)),
        ("gemm", lambda: probe_gemm(te)),
        ("options", lambda: probe_options(te)),
        ("transpose", lambda: probe_transpose(te)),
        ("override", lambda: probe_override(te)),
    ):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one section's failure is its line
            report(name, "section", False, f"raised {type(exc).__name__}: {exc}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe_te_fp8.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
