"""The case's reference in plain float64 PyTorch, one catalog op at a time: the torch calls
of its catalog function (catalog.py) with its attrs filled in. The compact form writes its
reference() with these lines (tests/test_export_compact.py holds each op's lines to
catalog.apply, values and gradients)."""

from .. import catalog


def reference_lines(op, h, extras, params, outs):
    """One catalog op of the reference in plain PyTorch: the torch calls of its catalog
    function (catalog.py) with its attrs filled in, on input variable `h`, extra input
    variables `extras` and parameter variables `params`, assigning extra output slot s to
    `outs[s]`. Returns (lines, the variable holding the op's main output)."""
    name, attrs = op.name, op.attrs
    real = lambda key, default: repr(catalog.attr_real(name, attrs, key, default))  # noqa: E731
    integer = lambda key, default, low=0: catalog.attr_int(name, attrs, key, default, low)  # noqa: E731
    flag = lambda key: catalog.attr_bool(name, attrs, key, 0)  # noqa: E731
    needed = {"ScaledSwiGLU": 1, "ScaledSReLU": 1, "AddExtraInput": 1, "GroupedLinear": 1}
    needed.update({"Dispatch": 1, "Combine": 1})
    if name == "GroupedLinear" and flag("scale_bias"):
        needed[name] = 2
    missing = [s for s in range(needed.get(name, 0)) if s >= len(extras) or extras[s] is None]
    if missing:
        raise ValueError(f"op {op.index} ({name}): extra input slot {missing[0]} has no value")
    e, p = extras, params
    if name in ("SwiGLU", "ScaledSwiGLU"):
        k = integer("interleave", 0)
        scaled = f" * {e[0]}.unsqueeze(-1)" if name == "ScaledSwiGLU" else ""
        halves = (
            f"a, b = {h}.chunk(2, dim=-1)"
            if k == 0
            else f"a, b = (t.flatten(-2) for t in {h}.unflatten(-1, (-1, 2, {k})).unbind(-2))"
        )
        return [f"{halves}  # {name}", f"h = F.silu(a) * b{scaled}"], "h"
    if name == "GroupedLinear":
        w, b = p[0], (p[1] if len(p) > 1 else None)
        lines = [
            f"sizes = {e[0]}.tolist()  # GroupedLinear: rows in {integer('groups', 2, 1)} groups"
        ]
        if flag("scale_bias"):
            lines += [
                f"parts = enumerate(zip({h}.split(sizes), {e[1]}.split(sizes)))",
                f"h = torch.cat([F.linear(xg, {w}[g]) + torch.outer(sg, {b}[g]) "
                "for g, (xg, sg) in parts])",
            ]
        else:
            bias = f", {b}[g]" if b else ""
            lines.append(
                f"h = torch.cat([F.linear(xg, {w}[g]{bias}) "
                f"for g, xg in enumerate({h}.split(sizes))])"
            )
        return lines, "h"
    if name == "Dispatch":
        sizes, probs, routing = outs[:3]
        return [
            f"group = torch.argmax({e[0]}.detach(), dim=1)  # Dispatch: row r to argmax(logits[r])",
            f"{routing} = torch.sort(group, stable=True).indices  # rows reordered by group",
            f"{sizes} = torch.bincount(group, minlength={integer('groups', 2, 1)}).to(torch.int64)",
            f"{probs} = torch.softmax({e[0]}, dim=1).gather(1, group.unsqueeze(1)).squeeze(1)"
            f".index_select(0, {routing})",
            f"h = {h}.index_select(0, {routing})",
        ], "h"
    if name in ("MakeExtraOutput", "RowStat", "DualExtraOutput", "Identity", *catalog.COLLECTIVES):
        # The collectives are identities on the unsharded tensors (catalog.collective).
        line = {
            **dict.fromkeys(catalog.COLLECTIVES),
            "MakeExtraOutput": f"{outs[0]} = {h}.view_as({h})" if outs else None,
            "RowStat": f"{outs[0]} = torch.mean(torch.square({h}), dim=-1)" if outs else None,
            "DualExtraOutput": f"{', '.join(outs[:2])} = {h} * {real('s0', 0.5)}, "
            f"{h} * {real('s1', -1.5)}",
            "Identity": None,
        }[name]
        return ([f"{line}  # {name}"] if line else []), h
    if name in ("RMSNorm", "LayerNorm"):
        features = op.param_shapes[0][0]
        gamma = f"1 + {p[0]}" if flag("zero_centered_gamma") else p[0]
        beta = f", {p[1]}" if name == "LayerNorm" else ""
        function = "F.rms_norm" if name == "RMSNorm" else "F.layer_norm"
        line = f"h = {function}({h}, ({features},), {gamma}{beta}, {real('eps', 1e-5)})"
        return [f"{line}  # {name}"], "h"
    expressions = {
        "Linear": f"F.linear({h}, {p[0] if p else None})",
        "Bias": f"{h} + {p[0] if p else None}",
        "ConstantScale": f"{h} * {real('scale', 0.5)}",
        "ReLU": f"torch.relu({h})",
        "GELU": f'F.gelu({h}, approximate="tanh")',
        "SReLU": f"torch.square(torch.relu({h}))",
        "ScaledSReLU": f"torch.square(torch.relu({h})) * {e[0] if e else None}.unsqueeze(-1)",
        "AddExtraInput": f"{h} + {e[0] if e else None}",
        "Combine": f"{h}.index_select(0, torch.argsort({e[0] if e else None}.to(torch.int64)))",
        "Reshape": f"{h}.reshape(-1, {integer('features', 0) or op.input_shape[-1]})",
    }
    if name not in expressions:
        raise ValueError(f"op {op.index}: no reference for catalog op '{name}'")
    return [f"h = {expressions[name]}  # {name}"], "h"
