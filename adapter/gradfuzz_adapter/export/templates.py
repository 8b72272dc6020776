"""The compact form's script-local helpers (TEMPLATES, emitted when used, in HELPER_ORDER),
and run()'s caller-tensor lines; the distributed form shares `check`."""

# run()'s caller tensors by name, where the literal dict does not fit a line.
CALLER_LINE = (
    '    caller = {"input": x, '
    '**{f"cotangent[{k}]": c for k, c in enumerate(dys) if c is not None}}'
)
CALLER_LINES = [
    '    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)}}',
    '    caller.update({f"cotangent[{k}]": c for k, c in enumerate(dys) if c is not None})',
]

# Script-local helpers, emitted when used (in this order).
HELPER_ORDER = (
    "results",
    "results_groups",
    "check",
    "check_all",
    "check_all_paths",
    "check_all_baseline",
    "only_fusions",
    "channel_leaves",
    "locked_te",
    "locked_torch",
    "before_repeat_call",
    "plans",
)

TEMPLATES = {
    "results": '''
def results(outputs, cotangents, leaves, zeros=True):
    """The outputs by name, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named
    leaves requiring grad; where nothing reached one: zeros, or None with zeros=False."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach()
           for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    leaves = [(n, t) for n, t in leaves if t is not None and t.requires_grad]
    if pairs and leaves:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in leaves],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(leaves, grads):
            got[n] = (torch.zeros_like(t) if zeros else None) if g is None else g
    return got
''',
    "results_groups": '''
def results(outputs, cotangents, leaves, zeros=True):
    """The outputs by name, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named
    leaves requiring grad (a list: one per group, stacked, None if one has none); where
    nothing reached one: zeros, or None with zeros=False."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach()
           for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    flat = [(n, t) for n, ts in leaves for t in (ts if isinstance(ts, list) else [ts])
            if t is not None and t.requires_grad]
    if pairs and flat:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in flat],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(flat, grads):
            zero = torch.zeros_like(t) if zeros else None
            got.setdefault(n, []).append(zero if g is None else g)
        for n, ts in [(n, ts) for n, ts in leaves if n in got]:
            stacked = torch.stack(got[n]) if all(g is not None for g in got[n]) else None
            got[n] = stacked if isinstance(ts, list) else got[n][0]
    return got
''',
    "check": '''
def check(name, got, e, atol, rtol, allowance=None, norm_bound=None):
    """Why `got` is off gradfuzz's bound of `e` (oracle/oracle.h), or None: all finite, |got - e|
    <= atol + rtol (rms(e) + |e|) + allowance (unjudged where inf), ||got - e|| <= norm_bound."""
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
''',
    "check_all": '''
def check_all(got, expected):
    """What is off among the tensors either side has (channels: the reference's), by BOUNDS."""
    names = [n for n in {**expected, **got} if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *BOUNDS.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]
''',
    "check_all_paths": '''
def check_all(got, expected, bounds):
    """What is off among the tensors either side has (channels: the reference's), by `bounds`
    (the path's own, EXPECTATIONS; FALLBACK for the tensors it does not name)."""
    names = [n for n in {**expected, **got} if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *bounds.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]
''',
    "check_all_baseline": '''
def check_all(got, expected, baseline):
    """What is off among the tensors either side has (channels: those the reference has),
    under FALLBACK: atol, rtol and the rounding allowance min(factor |b - e|, cap max(|e|,
    rms(e))) of the baseline b, the reference run in the case dtype."""
    atol, rtol, factor, cap = FALLBACK
    problems = []
    for n in {**expected, **got}:
        e, b = expected.get(n), (baseline or {}).get(n)
        if n not in expected and n.startswith("grad_channel"):
            continue
        allowance = None
        if e is not None and b is not None and e.is_floating_point():  # integers: exact
            rms = torch.where(e.isfinite(), e, 0).square().mean().sqrt()
            rounding = torch.nan_to_num((b.double() - e).abs(), 0.0, 0.0, 0.0)
            allowance = torch.minimum(factor * rounding, cap * torch.clamp(e.abs(), min=rms))
        problems.append(check(n, got.get(n), e, atol, rtol, allowance))
    return [p for p in problems if p]
''',
    "only_fusions": '''
def only_fusions(monkeypatch, names):
    """Only the fusions called `names` in TE's registry (fuser.py: OperationFuser's lists)."""
    def name(f):
        parts = f.__qualname__.split(".")
        owner = parts[-2] if len(parts) > 1 and parts[-2] != "<locals>" else None
        return getattr(f, "gradfuzz_fusion_name", None) or owner or OWNERS.get(parts[-1], parts[-1])
    for attr in [a for a in dir(OperationFuser) if a.endswith("_fusion_functions")]:
        functions = getattr(OperationFuser, attr) + OWN.get(attr, [])
        monkeypatch.setattr(OperationFuser, attr, [f for f in functions if name(f) in names])
''',
    "channel_leaves": '''
def channel_leaves(model):
    """The runtime's channel values of the last forward, named as the oracle names them."""
    return [(f"grad_channel[{name}{'' if f == 0 else f'@fuser{f}'}]", t)
            for f, fuser in enumerate(model.fusers) for name, t in fuser.channels.items()
            if t is not None and t.is_floating_point()]
''',
    "locked_te": """
def locked(op):
    return bool(getattr(op, "_extra_tensor_channels_locked", False))  # op.py
""",
    "locked_torch": """
def locked(op):
    return bool(getattr(op, "locked", False))
""",
    "before_repeat_call": '''
def before_repeat_call(ops):
    """Between two steps, as a training loop: accumulated parameter gradients cleared."""
    for p in [p for op in ops if hasattr(op, "parameters") for p in op.parameters()]:
        p.grad = None
        if getattr(p, "main_grad", None) is not None:
            p.main_grad.zero_()
''',
    "plans": '''
def plans(model):
    """Each fuser's plans of its last call: (op, basic op indices) per pass."""
    fusers = [m for m in getattr(model, "_module_groups", None) or [] if hasattr(m, "_forward_ops")]
    return [[[(getattr(op, "fusion_name", type(op).__name__), idxs) for op, idxs in ops]
             for ops in (f._forward_ops, f._backward_ops)] for f in fusers]
''',
}
