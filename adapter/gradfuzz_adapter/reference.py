"""A plain-autograd evaluator of a case: the catalog functions wired by channel name.

It mirrors gradfuzz's C++ reference (ops/reference.cc) and is what exported scripts
compute their expected values with (float64 on the CPU, or the case's dtype for the
rounding baseline). No fuser, no locking, no custom autograd: channels are a dict per run
of ops between Boundary modules, public extra inputs are taken in (op, slot) order.
Embedded in exported scripts after errors.py and catalog.py.
"""

import torch

from .catalog import apply
from .errors import ExtraInputCountError, MissingProducerError


def _leaf(t, dtype, device, requires_grad):
    """A fresh leaf copy: floating tensors in `dtype` with `requires_grad`; integers as they are."""
    if t is None:
        return None
    t = t.detach().to(device)
    if t.is_floating_point():
        return t.to(dtype).clone().requires_grad_(bool(requires_grad))
    return t.clone()


def reference(
    ops,
    x,
    params,
    extra_inputs,
    cotangents,
    *,
    input_requires_grad=True,
    param_requires_grad=None,
    extra_input_requires_grad=None,
    dtype=torch.float64,
    device="cpu",
):
    """Evaluates `ops` on the given values and differentiates sum <output_k, cotangent_k>.

    ops: per module {"name", "attrs", "input_channels", "output_bindings"} (Boundary: only
    the name); "input_channels" one entry per extra input slot (None = public),
    "output_bindings" one [channel or None, output_to_caller] per extra output slot.
    params: per module, per parameter (model layout). Returns a dict with "outputs" (main,
    then public extra outputs), "grad_input", "grad_params", "grad_extra_inputs",
    "channel_grads" (per run of ops between Boundary modules: name -> gradient of the
    channel's value) and "channel_values". A gradient is None where the tensor does not
    require grad; zeros where it does but nothing reached it.
    """
    param_requires_grad = param_requires_grad or [[True] * len(p) for p in params]
    extra_input_requires_grad = extra_input_requires_grad or [True] * len(extra_inputs)
    x0 = _leaf(x, dtype, device, input_requires_grad)
    leaves_params = [
        [_leaf(p, dtype, device, rg) for p, rg in zip(op_params, flags)]
        for op_params, flags in zip(params, param_requires_grad)
    ]
    leaves_extras = [
        _leaf(e, dtype, device, rg) for e, rg in zip(extra_inputs, extra_input_requires_grad)
    ]
    public_slots = sum(
        sum(1 for c in op.get("input_channels", []) if c is None)
        for op in ops
        if op["name"] != "Boundary"
    )
    if public_slots != len(leaves_extras):
        raise ExtraInputCountError(
            f"reference: expected {public_slots} public extra inputs, got {len(leaves_extras)}"
        )

    channel_values = []
    channels = None
    public_outputs = []
    next_extra = 0
    h = x0
    for i, op in enumerate(ops):
        if op["name"] == "Boundary":
            channels = None
            continue
        if channels is None:
            channels = {}
            channel_values.append(channels)
        extras = []
        for slot, channel in enumerate(op.get("input_channels", [])):
            if channel is None:
                extras.append(leaves_extras[next_extra])
                next_extra += 1
            elif channel in channels:
                extras.append(channels[channel])
            else:
                raise MissingProducerError(
                    f"reference: op {i} ({op['name']}) extra input slot {slot} reads channel "
                    f"'{channel}' before any op of its fuser produced it"
                )
        attrs = dict(op.get("attrs", {}))
        attrs["in_place"] = 0  # the reference never writes in place
        h, outs = apply(op["name"], h, extras, leaves_params[i], attrs)
        for slot, (channel, to_caller) in enumerate(op.get("output_bindings", [])):
            value = outs[slot]
            if channel is not None:
                channels[channel] = value
            if to_caller or channel is None:
                public_outputs.append(value)
    outputs = [h] + public_outputs

    wrt = []

    def want(t):
        if t is None or not t.requires_grad:
            return None
        wrt.append(t)
        return len(wrt) - 1

    input_pos = want(x0)
    param_pos = [[want(p) for p in op_params] for op_params in leaves_params]
    extra_pos = [want(e) for e in leaves_extras]
    channel_pos = [
        {name: want(v) for name, v in chans.items() if v.is_floating_point()}
        for chans in channel_values
    ]
    loss_outputs, loss_cotangents = [], []
    for out, cot in zip(outputs, cotangents):
        if cot is None or not out.is_floating_point() or not out.requires_grad:
            continue
        loss_outputs.append(out)
        loss_cotangents.append(cot.detach().to(device=device, dtype=out.dtype))
    grads = [None] * len(wrt)
    if loss_outputs and wrt:
        grads = torch.autograd.grad(
            loss_outputs, wrt, loss_cotangents, retain_graph=True, allow_unused=True
        )

    def pick(pos):
        if pos is None:
            return None
        g = grads[pos]
        return torch.zeros_like(wrt[pos]) if g is None else g

    return {
        "outputs": [o.detach() for o in outputs],
        "grad_input": pick(input_pos),
        "grad_params": [[pick(p) for p in op_pos] for op_pos in param_pos],
        "grad_extra_inputs": [pick(p) for p in extra_pos],
        "channel_grads": [
            {name: pick(p) for name, p in chans.items() if p is not None} for chans in channel_pos
        ],
        "channel_values": [
            {name: v.detach() for name, v in chans.items()} for chans in channel_values
        ],
    }
