"""The three open clusters of te32 (docs/TE.md, H200 2026-12-02b), each reduced to plain TE.

    python adapter/tests/probe_te_open.py --out $OUT/probe_te_open.json   # on the H200

TE and torch only; float32 on one GPU, a few seconds. Prints one line per check and a
verdict per cluster; the JSON holds the same. Exits 0 whatever it finds.

1. grouped-override (Dispatch -> GroupedLinear, Float8CurrentScaling, backward_override=
   "dequantized"): read in TE 2.20.2, te.ops.GroupedLinear never reads the recipe's
   backward_override (ops/basic/grouped_linear.py: fuser_forward_save_ctx sets
   ctx.with_quantized_compute from FP8GlobalStateManager.is_fp8_enabled() alone, the
   forward saves the FP8 column-wise inputs and weights, _fuser_backward_split_quantize
   split-quantizes dy). Check: GroupedLinear's gradients under each override equal, bit for
   bit, those of the same recipe without an override, while BasicLinear's differ (control);
   and how far they are from the high-precision backward the override documents.
2. grouped-dbias (GroupedLinear(scale_bias) -> GELU -> ..., DelayedScaling): GELU casts its
   input gradient with the GroupedLinear's grad_output quantizer (fuser.py hands it
   prev_op.get_grad_output_quantizer()), and GroupedLinear reduces its bias and scale
   gradients from that dequantized FP8 tensor. Check: the type GroupedLinear's backward
   receives, and whether TE's dbias / dscales equal dy^T s / dy b for the dequantized FP8
   dy or for the high-precision dy (GELU's derivative in float64 at TE's own output).
3. hp-saved-fp8-input (GELU -> Linear -> ... -> SReLU -> AddExtraInput(in_place), Float8-
   BlockScaling backward_override="high_precision"): two causes. (A) the op before a
   BasicLinear casts its output with the Linear's input quantizer whatever the override,
   and BasicLinear.op_forward saves that FP8 tensor as its "original" input, so the
   high-precision wgrad reads dq(Q(x)). Check: GELU -> Linear and RMSNorm -> Linear, the
   type the Linear receives and TE's dW against dy^T x (x from a run without a recipe) and
   against dy^T dq(received). (B) the documented in-place hazard: AddExtraInput(in_place)
   writes into MakeExtraOutput's extra output, the tensor SReLU saved, so SReLU's backward
   evaluates its derivative at a + srelu(a). Check without a recipe: TE's gradient of the
   extra input against both models, in_place=True and in_place=False.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32, as the exports do

import torch  # noqa: E402

RESULTS = {"checks": [], "verdicts": {}}
DEV = "cuda"
F32 = torch.float32


def report(cluster, name, ok, detail, **numbers):
    entry = {"cluster": cluster, "check": name, "ok": ok, "detail": detail}
    entry.update(
        {
            k: (float(v) if isinstance(v, (int, float, torch.Tensor)) else v)
            for k, v in numbers.items()
        }
    )
    RESULTS["checks"].append(entry)
    flag = {True: "yes ", False: "no  ", None: "err "}[ok]
    print(f"[{cluster}] {flag}{name}: {detail}", flush=True)


def attempt(cluster, name, fn, *args):
    """fn(*args), or None after reporting what it raised as an err line of `cluster`."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - TE refusing a configuration is a result
        report(cluster, name, None, f"raised {type(exc).__name__}: {exc}")
        return None


def verdict(cluster, text):
    RESULTS["verdicts"][cluster] = text
    print(f"[{cluster}] VERDICT: {text}", flush=True)


def f64(t):
    """A TE tensor (plain or quantized, storage or subclass) as float64 on the device."""
    if (
        hasattr(t, "dequantize")
        and not isinstance(t, torch.nn.Parameter)
        and (type(t) is not torch.Tensor)
    ):
        t = t.dequantize()
    return t.detach().to(torch.float64)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def gelu_tanh_grad(y):
    """d/dy of TE's tanh-approximated GELU, float64."""
    k = math.sqrt(2.0 / math.pi)
    inner = k * (y + 0.044715 * y**3)
    th = torch.tanh(inner)
    return 0.5 * (1 + th) + 0.5 * y * (1 - th**2) * k * (1 + 3 * 0.044715 * y**2)


class Spy:
    """Wraps cls.method for one instance: before(args, kwargs) runs ahead of the original,
    after(result) behind it."""

    def __init__(self, cls, method, target, before=None, after=None):
        self.cls, self.method, self.target = cls, method, target
        self.before, self.after = before, after
        self.original = getattr(cls, method)

    def __enter__(self):
        original, target, before, after = self.original, self.target, self.before, self.after

        def wrapped(op, *args, **kwargs):
            if op is not target:
                return original(op, *args, **kwargs)
            if before is not None:
                before(args, kwargs)
            result = original(op, *args, **kwargs)
            if after is not None:
                after(result)
            return result

        setattr(self.cls, self.method, wrapped)
        return self

    def __exit__(self, *exc):
        setattr(self.cls, self.method, self.original)
        return False


# ---------------------------------------------------------------------------------------
# 1. grouped-override


def probe_grouped_override(te, r):
    cluster = "grouped-override"
    torch.manual_seed(11)
    rows, fin, fout, groups = 32, 16, 48, 2
    x = torch.randn(rows, fin, device=DEV, dtype=F32)
    ws = [0.25 * torch.randn(fout, fin, device=DEV, dtype=F32) for _ in range(groups)]
    dy = torch.randn(rows, fout, device=DEV, dtype=F32)
    splits = torch.tensor([16, 16], dtype=torch.int64, device=DEV)

    def run_grouped(recipe):
        op = te.ops.GroupedLinear(groups, fin, fout, bias=False, device=DEV, dtype=F32)
        with torch.no_grad():
            for g in range(groups):
                getattr(op, f"weight{g}").copy_(ws[g])
        model = te.ops.Sequential(op)
        xx = x.clone().requires_grad_()
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(xx, splits)
        leaves = [xx] + [getattr(op, f"weight{g}") for g in range(groups)]
        grads = torch.autograd.grad(y, leaves, dy)
        return grads[0], torch.stack(grads[1:])

    def run_linear(recipe):
        op = te.ops.BasicLinear(fin, fout, device=DEV, dtype=F32)
        with torch.no_grad():
            op.weight.copy_(ws[0])
        model = te.ops.Sequential(op)
        xx = x.clone().requires_grad_()
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(xx)
        gx, gw = torch.autograd.grad(y, [xx, op.weight], dy)
        return gx, gw

    # high-precision backward, float64: dx_g = dy_g W_g, dW_g = dy_g^T x_g
    xd, dyd = x.double(), dy.double()
    hp_dx = torch.cat([dyd[16 * g : 16 * (g + 1)] @ ws[g].double() for g in range(groups)])
    hp_dw = torch.stack(
        [dyd[16 * g : 16 * (g + 1)].t() @ xd[16 * g : 16 * (g + 1)] for g in range(groups)]
    )

    recipes = {
        "Float8CurrentScaling HYBRID": lambda o: r.Float8CurrentScaling(
            fp8_format=r.Format.HYBRID, backward_override=o
        ),
        "Float8BlockScaling E4M3": lambda o: r.Float8BlockScaling(
            fp8_format=r.Format.E4M3, backward_override=o
        ),
    }
    ignored, honoured_control = [], []
    for label, make in recipes.items():
        try:
            base_dx, base_dw = run_grouped(make(None))
            lin_base = run_linear(make(None))
        except Exception as exc:  # noqa: BLE001 - a recipe TE refuses here is reported
            report(cluster, f"{label}: baseline", None, f"raised {type(exc).__name__}: {exc}")
            continue
        for override in ("dequantized", "high_precision"):
            try:
                dx, dw = run_grouped(make(override))
                lin = run_linear(make(override))
            except Exception as exc:  # noqa: BLE001
                report(cluster, f"{label} {override}", None, f"raised {type(exc).__name__}: {exc}")
                continue
            same = torch.equal(dx, base_dx) and torch.equal(dw, base_dw)
            lin_same = torch.equal(lin[0], lin_base[0]) and torch.equal(lin[1], lin_base[1])
            ignored.append(same)
            honoured_control.append(not lin_same)
            report(
                cluster,
                f"{label} {override}: GroupedLinear grads == no-override grads",
                same,
                f"bit for bit {same} (max |dx diff| {float((dx - base_dx).abs().max()):.3g}); "
                f"rel. error vs high-precision backward: dx {rel(dx, hp_dx):.3g}, "
                f"dW {rel(dw, hp_dw):.3g}; control BasicLinear changes with the override: "
                f"{not lin_same} (its dx vs dy W: {rel(lin[0], dyd @ ws[0].double()):.3g})",
                dx_rel_hp=rel(dx, hp_dx),
                dw_rel_hp=rel(dw, hp_dw),
                linear_dx_rel_hp=rel(lin[0], dyd @ ws[0].double()),
            )
    if ignored and all(ignored) and all(honoured_control):
        verdict(
            cluster,
            "TE DEFECT confirmed: te.ops.GroupedLinear ignores backward_override "
            "(its backward is the fully FP8 one, bit for bit), BasicLinear honours it",
        )
    elif ignored and not any(ignored):
        verdict(
            cluster,
            "NOT confirmed: GroupedLinear's gradients change with the override; "
            "re-read the case (the reference's model of the override?)",
        )
    else:
        verdict(cluster, "INCONCLUSIVE: see the checks")


# ---------------------------------------------------------------------------------------
# 2. grouped-dbias


def probe_grouped_dbias(te, r):
    cluster = "grouped-dbias"
    from transformer_engine.pytorch.ops.basic.grouped_linear import GroupedLinear

    torch.manual_seed(12)
    rows, fin, fout = 32, 16, 32
    x = torch.randn(rows, fin, device=DEV, dtype=F32)
    w = 0.25 * torch.randn(fout, fin, device=DEV, dtype=F32)
    b = torch.randn(fout, device=DEV, dtype=F32)
    s = 0.5 + torch.rand(rows, device=DEV, dtype=F32)
    dout = torch.randn(rows, fout, device=DEV, dtype=F32)
    splits = torch.tensor([rows], dtype=torch.int64, device=DEV)

    cases = {
        "no recipe (control)": None,
        "DelayedScaling HYBRID": r.DelayedScaling(fp8_format=r.Format.HYBRID),
        "Float8CurrentScaling HYBRID": r.Float8CurrentScaling(fp8_format=r.Format.HYBRID),
    }
    from_fp8 = {}
    for label, recipe in cases.items():
        op = te.ops.GroupedLinear(1, fin, fout, bias=True, scale_bias=True, device=DEV, dtype=F32)
        with torch.no_grad():
            op.weight0.copy_(w)
            op.bias0.copy_(b)
        model = te.ops.Sequential(op, te.ops.GELU())
        seen = {}

        def on_forward_result(result, seen=seen):
            seen["y_lin"] = f64(result[0])  # GroupedLinear's output: GELU's input

        def on_backward(args, kwargs, seen=seen):
            grad = args[1]
            seen["type"] = type(grad).__name__
            seen["dy"] = f64(grad)

        xx = x.clone().requires_grad_()
        ss = s.clone().requires_grad_()
        try:
            with (
                Spy(GroupedLinear, "fuser_backward", op, before=on_backward),
                Spy(GroupedLinear, "fuser_forward", op, after=on_forward_result),
            ):
                with te.autocast(enabled=recipe is not None, recipe=recipe):
                    y = model(xx, splits, ss)
                gb, gs = torch.autograd.grad(y, [op.bias0, ss], dout)
        except Exception as exc:  # noqa: BLE001
            report(cluster, label, None, f"raised {type(exc).__name__}: {exc}")
            continue
        # the high-precision dy: GELU's derivative (float64) at TE's own GELU input
        y_lin = seen["y_lin"]
        dy_hp = dout.double() * gelu_tanh_grad(y_lin)
        dy_q = seen["dy"]
        sd, bd = s.double(), b.double()
        db_hp, db_q = dy_hp.t() @ sd, dy_q.t() @ sd
        ds_hp, ds_q = dy_hp @ bd, dy_q @ bd
        e_hp, e_q = rel(gb, db_hp), rel(gb, db_q)
        es_hp, es_q = rel(gs, ds_hp), rel(gs, ds_q)
        quantized = seen.get("type") not in (None, "Tensor", "Parameter")
        if recipe is None:
            ok = not quantized and e_hp < 1e-4  # control: no cast, dbias from dy itself
            name = f"{label}: dbias/dscales from the high-precision grad"
        else:
            ok = quantized and e_q < 1e-4 and e_hp > 10 * max(e_q, 1e-6)
            from_fp8[label] = ok
            name = f"{label}: dbias/dscales from the FP8 grad"
        report(
            cluster,
            name,
            ok,
            f"GroupedLinear receives a {seen.get('type')}; dbias rel. error vs dy_fp8^T s "
            f"{e_q:.3g}, vs dy_hp^T s {e_hp:.3g}; dscales vs dy_fp8 b {es_q:.3g}, vs dy_hp b "
            f"{es_hp:.3g}; |dy_fp8 - dy_hp|/|dy_hp| {rel(dy_q, dy_hp):.3g}",
            dbias_rel_fp8=e_q,
            dbias_rel_hp=e_hp,
            dscales_rel_fp8=es_q,
            dscales_rel_hp=es_hp,
        )
    if from_fp8 and all(from_fp8.values()):
        verdict(
            cluster,
            "TE BEHAVIOUR the reference does not model, confirmed: GroupedLinear's "
            "dbias and dscales are reduced from the FP8 gradient the activation cast with "
            "its grad_output quantizer (the reference reduces the high-precision dy)",
        )
    elif from_fp8 and not any(from_fp8.values()):
        verdict(cluster, "NOT confirmed: dbias follows the high-precision dy; re-read the case")
    else:
        verdict(cluster, "INCONCLUSIVE: see the checks")


# ---------------------------------------------------------------------------------------
# 3. hp-saved-fp8-input


def probe_hp_saved_input(te, r):
    cluster = "hp-saved-fp8-input"
    from transformer_engine.pytorch.ops.basic.basic_linear import BasicLinear

    torch.manual_seed(13)
    rows, n = 32, 16
    x = torch.randn(rows, n, device=DEV, dtype=F32)
    w = 0.25 * torch.randn(n, n, device=DEV, dtype=F32)
    dy = torch.randn(rows, n, device=DEV, dtype=F32)

    def run(first, recipe):
        lin = te.ops.BasicLinear(n, n, device=DEV, dtype=F32)
        with torch.no_grad():
            lin.weight.copy_(w)
        pre = te.ops.GELU() if first == "GELU" else te.ops.RMSNorm(n, device=DEV, dtype=F32)
        model = te.ops.Sequential(pre, lin)
        seen = {}

        def on_forward(args, kwargs, seen=seen):
            inp = args[1] if len(args) > 1 else kwargs.get("input_")
            seen["type"] = type(inp).__name__
            seen["x"] = f64(inp)

        xx = x.clone().requires_grad_()
        with Spy(BasicLinear, "op_forward", lin, before=on_forward):
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = model(xx)
            (gw,) = torch.autograd.grad(y, [lin.weight], dy)
        return gw, seen

    recipes = {
        "Float8BlockScaling E4M3": r.Float8BlockScaling(
            fp8_format=r.Format.E4M3, backward_override="high_precision"
        ),
        "Float8CurrentScaling HYBRID": r.Float8CurrentScaling(
            fp8_format=r.Format.HYBRID, backward_override="high_precision"
        ),
    }
    defect = []
    dyd = dy.double()
    for first in ("GELU", "RMSNorm"):
        plain = attempt(cluster, f"{first} -> Linear, no recipe", run, first, None)
        if plain is None:
            continue
        _, plain = plain
        dw_hp = dyd.t() @ plain["x"]
        for label, recipe in recipes.items():
            got = attempt(cluster, f"{first} -> Linear {label} high_precision", run, first, recipe)
            if got is None:
                continue
            gw, seen = got
            dw_q = dyd.t() @ seen["x"]
            e_hp, e_q = rel(gw, dw_hp), rel(gw, dw_q)
            quantized = seen.get("type") not in (None, "Tensor", "Parameter")
            hit = quantized and e_q < 1e-5 and e_hp > 10 * max(e_q, 1e-7)
            defect.append(hit)
            report(
                cluster,
                f"(A) {first} -> Linear {label} high_precision: wgrad on FP8 input",
                hit,
                f"the Linear receives a {seen.get('type')}; dW rel. error vs dy^T dq(received) "
                f"{e_q:.3g}, vs dy^T x (high precision) {e_hp:.3g}",
                dw_rel_fp8=e_q,
                dw_rel_hp=e_hp,
            )

    # (B) the in-place hazard, no recipe: GELU -> Linear -> AddExtraInput(E) ->
    # MakeExtraOutput(c0) -> SReLU -> AddExtraInput(c0, in_place)
    e0 = torch.randn(rows, n, device=DEV, dtype=F32)
    inplace_explains = None
    for in_place in (True, False):
        try:
            ops = [
                te.ops.GELU(),
                te.ops.BasicLinear(n, n, device=DEV, dtype=F32),
                te.ops.AddExtraInput(in_place=False),
                te.ops.MakeExtraOutput(in_place=False),
                te.ops.SReLU(),
                te.ops.AddExtraInput(in_place=in_place),
            ]
            with torch.no_grad():
                ops[1].weight.copy_(w)
            ops[3].set_extra_output_channel(0, "c0", output_to_caller=False)
            ops[5].set_extra_input_channel(0, "c0")
            model = te.ops.Sequential(*ops)
            xx = x.clone().requires_grad_()
            ee = e0.clone().requires_grad_()
            y = model(xx, ee)
            y = y[0] if isinstance(y, (tuple, list)) else y
            (ge,) = torch.autograd.grad(y, [ee], dy)
        except Exception as exc:  # noqa: BLE001
            report(cluster, f"(B) in_place={in_place}", None, f"raised {type(exc).__name__}: {exc}")
            continue
        k = math.sqrt(2.0 / math.pi)
        xd = x.double()
        h = 0.5 * xd * (1 + torch.tanh(k * (xd + 0.044715 * xd**3)))
        a = e0.double() + h @ w.double().t()
        srelu = torch.relu(a) ** 2
        clean = dyd + dyd * 2 * torch.relu(a)
        aliased = dyd + dyd * 2 * torch.relu(a + srelu)
        e_clean, e_alias = rel(ge, clean), rel(ge, aliased)
        matches = "aliased" if e_alias < e_clean else "clean"
        if in_place:
            inplace_explains = e_alias < 1e-4 and e_clean > 1e-2
        report(
            cluster,
            f"(B) no recipe, last AddExtraInput in_place={in_place}",
            (matches == "aliased") if in_place else (matches == "clean"),
            f"grad of the extra input vs SReLU' at a: {e_clean:.3g}, at a + srelu(a): "
            f"{e_alias:.3g} (matches the {matches} model)",
            rel_clean=e_clean,
            rel_aliased=e_alias,
        )
    parts = []
    if defect and all(defect):
        parts.append(
            "(A) TE DEFECT confirmed: under backward_override=high_precision the "
            "Linear's weight gradient uses the FP8 input the op before it cast"
        )
    elif defect and not any(defect):
        parts.append("(A) NOT confirmed: the high-precision wgrad reads the original input")
    else:
        parts.append("(A) INCONCLUSIVE")
    if inplace_explains:
        parts.append(
            "(B) documented in-place hazard confirmed: SReLU differentiates at the "
            "tensor the in-place AddExtraInput wrote (the magnitude of the finding)"
        )
    else:
        parts.append("(B) in-place model not confirmed")
    verdict(cluster, "; ".join(parts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="where to write the JSON results")
    args = parser.parse_args()
    start = time.time()
    try:
        import transformer_engine
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as r

        torch.backends.cuda.matmul.allow_tf32 = False
        major, minor = torch.cuda.get_device_capability()
        RESULTS["device"] = f"{torch.cuda.get_device_name()} sm_{major}{minor}"
        RESULTS["te"] = getattr(transformer_engine, "__version__", "?")
        RESULTS["torch"] = torch.__version__
        print(f"device {RESULTS['device']}, TE {RESULTS['te']}, torch {torch.__version__}")
        for name, fn in (
            ("grouped-override", probe_grouped_override),
            ("grouped-dbias", probe_grouped_dbias),
            ("hp-saved-fp8-input", probe_hp_saved_input),
        ):
            try:
                fn(te, r)
            except Exception as exc:  # noqa: BLE001 - one cluster's failure is its verdict
                traceback.print_exc()
                verdict(name, f"PROBE ERROR {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - no TE or no GPU: say so, exit 0
        traceback.print_exc()
        RESULTS["error"] = f"{type(exc).__name__}: {exc}"
    RESULTS["seconds"] = round(time.time() - start, 2)
    print(f"{RESULTS['seconds']} s")
    if args.out:
        try:
            with open(args.out, "w") as f:
                json.dump(RESULTS, f, indent=1)
        except OSError as exc:
            print(f"could not write {args.out}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
