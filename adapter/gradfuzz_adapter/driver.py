"""Runs one case through the paths of a backend (docs/BACKENDS.md "run").

The steps and their phase names are the same for every backend: op creation, the
call-then-bind calls, binding, Sequential construction, late binding, forward, backward.
A backend supplies a Builder (torch_backend.TorchBuilder, te_backend.TEBuilder) that knows
how its ops are made, bound, run and differentiated; this module does the rest: values on
the device, caller-tensor copies (`modified`), the loss cotangents, one autograd.grad call,
the reply's tensors and error reports.
"""

import contextlib

import torch

PHASE_CREATE = "op creation"
PHASE_CALL = "call-then-bind call"
PHASE_BIND = "binding"
PHASE_CONSTRUCT = "Sequential construction"
PHASE_LATE_BIND = "late binding"
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"


class Builder:
    """What a backend implements for the driver. Every method gets the op objects it made."""

    name = "?"

    def device(self, case):
        raise NotImplementedError

    def fusion_scope(self, fusions):
        """Context manager under which a path with these fusion names runs."""
        return contextlib.nullcontext()

    def create_op(self, op_case, case, device):
        raise NotImplementedError

    def make_boundary(self):
        raise NotImplementedError

    def call_standalone(self, op, x, extras):
        raise NotImplementedError

    def bind_input(self, op, slot, channel):
        raise NotImplementedError

    def bind_output(self, op, slot, channel, output_to_caller):
        raise NotImplementedError

    def is_locked(self, op):
        raise NotImplementedError

    def make_sequential(self, modules):
        raise NotImplementedError

    def forward(self, seq, x, extras):
        """The Sequential's outputs as a list (main output first)."""
        raise NotImplementedError

    def after_forward(self, seq, case, ops, outputs):
        """Called once forward returned `outputs` (plans, backward observers)."""

    def param_leaves(self, op, op_case):
        """Backend tensors whose gradients autograd.grad should return (requiring grad)."""
        raise NotImplementedError

    def param_grads(self, op, op_case, leaf_grads):
        """The op's parameter gradients in the model's layout (None where none)."""
        raise NotImplementedError

    def channel_leaves(self, seq, case):
        """[(fuser, channel, tensor)] whose total gradient autograd.grad should return."""
        return []

    def after_backward(self, ops):
        """Called after autograd.grad (delayed weight gradients)."""

    def recorded_channel_grads(self, case):
        """Per fuser {channel: gradient} observed by the backend, or None."""
        return None

    def plans(self, seq, case, ops):
        """Per fuser {"forward": [...], "backward": [...]} in spec op indices."""
        return []

    def any_fused(self, plans):
        return any(g["fused"] for p in plans for pass_ in ("forward", "backward") for g in p[pass_])

    def classify(self, exc):
        """("error", kind) or ("unsupported", reason)."""
        raise NotImplementedError

    def left_locked(self, seq, ops, locked_before, phase):
        """Spec op indices a failed construction left locked."""
        return []


def _to_device(t, dtype, device, requires_grad):
    """A fresh copy on `device`: floating tensors in `dtype` with `requires_grad`."""
    if t is None:
        return None
    if t.is_floating_point():
        return t.to(device=device, dtype=dtype, copy=True).requires_grad_(bool(requires_grad))
    return t.to(device=device, copy=True)


class _CallerTensors:
    """Copies of the caller-owned tensors a path receives, to see whether the path changed them."""

    def __init__(self):
        self.entries = []

    def add(self, name, t):
        if t is not None:
            self.entries.append((name, t, t.detach().clone()))

    def modified(self):
        out = []
        for name, given, pristine in self.entries:
            try:
                same = given.shape == pristine.shape and torch.equal(given.detach(), pristine)
            except RuntimeError:
                same = False  # the tensor's data was replaced or freed
            if not same:
                out.append(name)
        return out


def run_path(builder, case, path, tensors):
    """One path's reply entry (docs/BACKENDS.md "run" reply); tensors go into `tensors`."""
    result = {"name": path["name"], "status": "ok"}
    device = None
    ops = [None] * len(case.ops)
    seq = None
    phase = PHASE_CREATE
    locked_before = [False] * len(case.ops)
    outputs = []
    grads = {}
    modified = []
    plans = []
    try:
        with builder.fusion_scope(path.get("fusions") or []):
            device = builder.device(case)
            for op_case in case.ops:
                ops[op_case.index] = (
                    builder.make_boundary()
                    if op_case.boundary
                    else builder.create_op(op_case, case, device)
                )

            phase = PHASE_CALL
            for (index, grad_mode), (call_x, call_extras) in zip(
                case.call_then_bind, case.call_inputs
            ):
                with torch.set_grad_enabled(grad_mode):
                    x = _to_device(call_x, case.dtype, device, grad_mode)
                    extras = [_to_device(e, case.dtype, device, grad_mode) for e in call_extras]
                    builder.call_standalone(ops[index], x, extras)

            phase = PHASE_BIND
            for op_case in case.catalog_ops:
                op = ops[op_case.index]
                for slot, channel in op_case.bound_inputs:
                    builder.bind_input(op, slot, channel)
                for slot, channel, to_caller in op_case.bound_outputs:
                    builder.bind_output(op, slot, channel, to_caller)

            phase = PHASE_CONSTRUCT
            locked_before = [
                op is not None and not c.boundary and builder.is_locked(op)
                for op, c in zip(ops, case.ops)
            ]
            seq = builder.make_sequential(ops)

            phase = PHASE_LATE_BIND
            for index, slot, channel in case.late_binds:
                builder.bind_input(ops[index], slot, channel)

            phase = PHASE_FORWARD
            caller = _CallerTensors()
            x = _to_device(case.input, case.dtype, device, case.input_requires_grad)
            extras = [
                _to_device(e, case.dtype, device, rg)
                for e, rg in zip(case.extra_inputs, case.extra_input_requires_grad)
            ]
            caller.add("input", x)
            for k, e in enumerate(extras):
                caller.add(f"extra_input[{k}]", e)
            outputs = builder.forward(seq, x, extras)
            for k, out in enumerate(outputs):
                if not isinstance(out, torch.Tensor):
                    outputs = []
                    raise TypeError(f"output {k} of the Sequential is a {type(out).__name__}")
            builder.after_forward(seq, case, ops, outputs)

            phase = PHASE_BACKWARD
            loss_outputs, loss_cotangents = [], []
            for k, (out, cot) in enumerate(zip(outputs, case.cotangents)):
                if (
                    cot is None
                    or out is None
                    or not out.is_floating_point()
                    or not out.requires_grad
                ):
                    continue
                if tuple(out.shape) != tuple(cot.shape):
                    continue  # a shape bug; the output comparison reports it
                cot = cot.to(device=out.device, dtype=out.dtype, copy=True)
                caller.add(f"cotangent[{k}]", cot)
                loss_outputs.append(out)
                loss_cotangents.append(cot)
            wrt = []
            where = []
            if x.requires_grad:
                wrt.append(x)
                where.append(("input", None))
            param_leaves = {}
            for op_case in case.catalog_ops:
                leaves = builder.param_leaves(ops[op_case.index], op_case)
                param_leaves[op_case.index] = (len(wrt), len(leaves))
                wrt.extend(leaves)
                where.extend(("param", op_case.index) for _ in leaves)
            for k, e in enumerate(extras):
                if e is not None and e.requires_grad:
                    wrt.append(e)
                    where.append(("extra", k))
            for fuser, channel, t in builder.channel_leaves(seq, case):
                if t is not None and t.requires_grad:
                    wrt.append(t)
                    where.append(("channel", (fuser, channel)))
            computed = [None] * len(wrt)
            if loss_outputs and wrt:
                computed = list(
                    torch.autograd.grad(loss_outputs, wrt, loss_cotangents, allow_unused=True)
                )
            builder.after_backward(ops)
            grads["input"] = None
            grads["extra"] = [None] * len(extras)
            grads["channel"] = [dict() for _ in case.fusers]
            for (kind, key), g, t in zip(where, computed, wrt):
                if kind == "input":
                    grads["input"] = g
                elif kind == "extra":
                    grads["extra"][key] = g
                elif kind == "channel":
                    grads["channel"][key[0]][key[1]] = torch.zeros_like(t) if g is None else g
            grads["params"] = []
            for op_case in case.ops:
                if op_case.boundary:
                    grads["params"].append([])
                    continue
                start, count = param_leaves[op_case.index]
                grads["params"].append(
                    builder.param_grads(
                        ops[op_case.index], op_case, computed[start : start + count]
                    )
                )
            recorded = builder.recorded_channel_grads(case)
            if recorded is not None:
                grads["channel"] = recorded
            modified = caller.modified()
    except Exception as exc:  # noqa: BLE001 - every backend error becomes the path's result
        status, detail = builder.classify(exc)
        message = f"{type(exc).__name__}: {exc}"
        if status == "unsupported":
            result["status"] = "unsupported"
            result["reason"] = f"{message} [{detail}]"
        else:
            result["status"] = "error"
            result["error"] = {
                "kind": detail,
                "type": type(exc).__name__,
                "message": str(exc),
                "phase": phase,
            }
        result["left_locked"] = (
            builder.left_locked(seq, ops, locked_before, phase)
            if phase
            in (
                PHASE_CONSTRUCT,
                PHASE_FORWARD,
            )
            else []
        )
    if seq is not None:
        try:
            plans = builder.plans(seq, case, ops)
        except Exception:  # noqa: BLE001 - a plan we cannot read is left out, not an error
            plans = []
    result["plans"] = plans
    mark = len(tensors.tensors)
    try:
        result["outputs"] = [tensors.add(o) for o in outputs]
        if grads:
            result["grad_input"] = tensors.add(grads["input"])
            result["grad_params"] = [[tensors.add(g) for g in gs] for gs in grads["params"]]
            result["grad_extra_inputs"] = [tensors.add(g) for g in grads["extra"]]
            result["channel_grads"] = [
                {name: tensors.add(g) for name, g in chans.items() if g is not None}
                for chans in grads["channel"]
            ]
    except Exception as exc:  # noqa: BLE001 - a result that cannot travel is the path's error
        del tensors.tensors[mark:]
        for key in ("outputs", "grad_input", "grad_params", "grad_extra_inputs", "channel_grads"):
            result.pop(key, None)
        result["status"] = "error"
        result["error"] = {
            "kind": "unrecognized",
            "type": type(exc).__name__,
            "message": f"the path's results cannot be sent: {exc}",
            "phase": phase,
        }
    result["modified"] = modified
    result.setdefault("left_locked", [])
    return result


def run_paths(builder, case, paths, tensors):
    """Every requested path in order, honouring skip_if_nothing_fused."""
    results = []
    first_ok_unfused = None
    for path in paths:
        if path.get("skip_if_nothing_fused") and results and first_ok_unfused:
            results.append(
                {
                    "name": path["name"],
                    "status": "skipped",
                    "plans": [],
                    "modified": [],
                    "left_locked": [],
                }
            )
            continue
        result = run_path(builder, case, path, tensors)
        if not results:
            first_ok_unfused = result["status"] == "ok" and not builder.any_fused(result["plans"])
        results.append(result)
    return results
