"""A `run`/`export` request (docs/BACKENDS.md) decoded into plain Python values.

The CaseSpec JSON is the case file's (harness/case_spec.cc); the plan resolves every op's
attrs (catalog defaults filled in), shapes and slot kinds; the values are indices into the
frame's tensors (float64 or int64 on the CPU).
"""

from dataclasses import dataclass, field

import torch

from . import catalog
from .protocol import DTYPES

BOUNDARY = "Boundary"


@dataclass
class OpCase:
    """One module of the case's Sequential."""

    index: int
    name: str
    fuser: int  # -1 for Boundary
    attrs: dict
    input_shape: list
    output_shape: list
    extra_input_kinds: list
    extra_output_kinds: list
    # Per extra input slot: the bound channel or None (public).
    input_channels: list
    # Per extra output slot: (channel or None, output_to_caller).
    output_bindings: list
    output_style: str
    param_shapes: list
    param_requires_grad: list
    params: list  # float64 CPU values in the model's layout
    # A distributed case's rank plan holds this rank's shapes; this is the op's input on the
    # unsharded tensors (what te.ops's constructors are given). Else input_shape.
    global_input_shape: list = field(default_factory=list)

    @property
    def boundary(self):
        return self.name == BOUNDARY

    @property
    def bound_inputs(self):
        return [(s, c) for s, c in enumerate(self.input_channels) if c is not None]

    @property
    def bound_outputs(self):
        return [(s, c, t) for s, (c, t) in enumerate(self.output_bindings) if c is not None]


@dataclass
class Case:
    spec: dict
    ops: list
    dtype_name: str
    dtype: torch.dtype
    device: str
    input: torch.Tensor
    input_requires_grad: bool
    extra_inputs: list
    extra_input_requires_grad: list
    cotangents: list
    call_then_bind: list  # [(op index, grad_mode)]
    call_inputs: list  # [(input, [extra inputs])]
    late_binds: list  # [(op index, slot, channel)]
    fusers: list = field(default_factory=list)  # spec op indices per fuser
    public_inputs: list = field(default_factory=list)
    public_outputs: list = field(default_factory=list)
    # The run request's "modified_by" (default true): whether a changed caller tensor's
    # writer is looked for, and how (driver.run_path: True, "rerun" or False).
    writers: bool | str = True
    # Ranks of a distributed case (harness/sharding.h); this process is one of them.
    world_size: int = 1
    # Per repeat call: None, or per spec op the parameter values its optimizer step writes
    # (spec.repeat_calls[k].update; harness/builder.h: step_param).
    step_params: list = field(default_factory=list)
    # The caller holds every call's outputs and reads them again after the backward and
    # after the later calls (spec.read_after_backward).
    read_after_backward: bool = False
    # Every op built on device "meta" and materialised before its values are copied in
    # (spec.deferred_init; Builder.create_op does both).
    deferred_init: bool = False
    # Each run of ops between Boundary modules a Sequential of its own, all called in one
    # autocast (spec.several_sequentials; driver.Chain).
    several_sequentials: bool = False
    # Every Linear's weight a quantized tensor of the recipe (spec.quantized_params), and
    # the caller reads those weights after each call (spec.held_quantized_tensor).
    quantized_params: bool = False
    held_quantized_tensor: bool = False

    @property
    def catalog_ops(self):
        return [op for op in self.ops if not op.boundary]


def _tensor(tensors, ref) -> torch.Tensor | None:
    if ref is None:
        return None
    if not isinstance(ref, int) or not 0 <= ref < len(tensors):
        raise ValueError(f"tensor index {ref!r} out of range ({len(tensors)} tensors)")
    return tensors[ref]


def _flag(flags, i, default=True):
    return bool(flags[i]) if i < len(flags) else default


def _writers_mode(value):
    """A request's "modified_by": true (the default), false or "rerun"."""
    if value is True or value is False or value == "rerun":
        return value
    raise ValueError(f'"modified_by" must be true, false or "rerun", got {value!r}')


def decode_case(request, tensors):
    """Case from a request's "spec", "plan" and "values" (ValueError naming the problem)."""
    spec = request["spec"]
    plan = request.get("plan") or {}
    plan_ops = plan.get("ops") or []
    values = request.get("values") or {}
    spec_ops = spec["ops"]
    if plan_ops and len(plan_ops) != len(spec_ops):
        raise ValueError(f"plan has {len(plan_ops)} ops for {len(spec_ops)} spec ops")
    dtype_name = spec.get("dtype", "float64")
    if dtype_name not in ("float64", "float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype '{dtype_name}'")
    value_params = values.get("params") or []

    ops = []
    fuser = -1
    previous_was_op = False
    shape = list(spec.get("input_shape", [4, 8]))
    for i, op_spec in enumerate(spec_ops):
        name = op_spec["name"]
        entry = plan_ops[i] if plan_ops else {}
        if name == BOUNDARY:
            previous_was_op = False
            ops.append(
                OpCase(i, name, -1, {}, shape, shape, [], [], [], [], "vector", [], [], [], shape)
            )
            continue
        if not previous_was_op:
            fuser += 1
        previous_was_op = True
        attrs = dict(op_spec.get("attrs") or {})
        attrs.update(entry.get("attrs") or {})
        input_shape = list(entry.get("input_shape") or shape)
        if "extra_inputs" in entry:
            kinds_in = [s.get("kind", "float") for s in entry["extra_inputs"]]
            kinds_out = [s.get("kind", "float") for s in entry["extra_outputs"]]
        else:
            kinds_in, kinds_out = catalog.slot_kinds(name, attrs)
        output_shape = list(entry.get("output_shape") or input_shape)
        param_shape_list = entry.get("param_shapes")
        if param_shape_list is None:
            param_shape_list = catalog.param_shapes(name, attrs, input_shape)
        # As many entries as the op has slots, or as the spec lists (binding a slot the op
        # lacks is the spec's to try: the setter raises slot-out-of-range).
        channels = list(op_spec.get("input_channels") or [])
        input_channels = [
            channels[s] if s < len(channels) else None
            for s in range(max(len(kinds_in), len(channels)))
        ]
        bindings = list(op_spec.get("output_bindings") or [])
        output_bindings = []
        for s in range(max(len(kinds_out), len(bindings))):
            b = bindings[s] if s < len(bindings) else {}
            channel = b.get("channel")
            output_bindings.append(
                (channel, True if channel is None else bool(b.get("output_to_caller", True)))
            )
        prg = list(op_spec.get("param_requires_grad") or [])
        refs = value_params[i] if i < len(value_params) else []
        ops.append(
            OpCase(
                index=i,
                name=name,
                fuser=fuser,
                attrs=attrs,
                input_shape=input_shape,
                output_shape=output_shape,
                extra_input_kinds=kinds_in,
                extra_output_kinds=kinds_out,
                input_channels=input_channels,
                output_bindings=output_bindings,
                output_style=op_spec.get("output_style", "vector"),
                param_shapes=[list(s) for s in param_shape_list],
                param_requires_grad=[_flag(prg, j) for j in range(len(param_shape_list))],
                params=[_tensor(tensors, r) for r in refs],
                global_input_shape=list(entry.get("global_input_shape") or input_shape),
            )
        )
        shape = output_shape

    fusers = [[op.index for op in ops if op.fuser == f] for f in range(fuser + 1)]
    input_tensor = _tensor(tensors, values.get("input"))
    if input_tensor is None:
        raise ValueError("values.input is missing")
    extra_inputs = [_tensor(tensors, r) for r in values.get("extra_inputs") or []]
    extra_rg = list(values.get("extra_input_requires_grad") or [])
    calls = []
    for call in values.get("call_inputs") or []:
        calls.append(
            (
                _tensor(tensors, call.get("input")),
                [_tensor(tensors, r) for r in call.get("extra_inputs") or []],
            )
        )
    steps = [
        (int(s["op"]), bool(s.get("grad_mode", True))) for s in spec.get("call_then_bind") or []
    ]
    if len(calls) != len(steps):
        raise ValueError(f"{len(calls)} call_inputs for {len(steps)} call_then_bind steps")
    return Case(
        spec=spec,
        ops=ops,
        dtype_name=dtype_name,
        dtype=DTYPES[dtype_name],
        device=spec.get("device", "cpu"),
        input=input_tensor,
        input_requires_grad=bool(spec.get("input_requires_grad", True)),
        extra_inputs=extra_inputs,
        extra_input_requires_grad=[_flag(extra_rg, k, False) for k in range(len(extra_inputs))],
        cotangents=[_tensor(tensors, r) for r in values.get("cotangents") or []],
        call_then_bind=steps,
        call_inputs=calls,
        late_binds=[
            (int(s["op"]), int(s["slot"]), s["channel"]) for s in spec.get("late_binds") or []
        ],
        fusers=fusers,
        public_inputs=[tuple(p) for p in plan.get("public_inputs") or []],
        public_outputs=[tuple(p) for p in plan.get("public_outputs") or []],
        writers=_writers_mode(request.get("modified_by", True)),
        world_size=int(spec.get("world_size", 1)),
        step_params=_step_params(values, spec, tensors),
        read_after_backward=bool(spec.get("read_after_backward", False)),
        deferred_init=bool(spec.get("deferred_init", False)),
        several_sequentials=bool(spec.get("several_sequentials", False)),
        quantized_params=bool(spec.get("quantized_params", False)),
        held_quantized_tensor=bool(spec.get("held_quantized_tensor", False)),
    )


def _step_params(values, spec, tensors):
    """values.step_params: per repeat call None or per op [tensor] (an update's values)."""
    steps = values.get("step_params") or []
    calls = spec.get("repeat_calls") or []
    if steps and len(steps) != len(calls):
        raise ValueError(f"{len(steps)} step_params for {len(calls)} repeat calls")
    out = []
    for k, step in enumerate(steps):
        if step is None:
            out.append(None)
            continue
        if not calls[k].get("update", False):
            raise ValueError(f"step_params[{k}] given for a repeat call without an update")
        out.append([[_tensor(tensors, r) for r in refs] for refs in step])
    for k, call in enumerate(calls):
        if call.get("update", False) and (k >= len(out) or out[k] is None):
            raise ValueError(
                f"repeat call {k + 1} updates the parameters but values.step_params has none"
            )
    return out


def reference_ops(case):
    """The case's modules as reference.reference() takes them."""
    out = []
    for op in case.ops:
        if op.boundary:
            out.append({"name": op.name})
            continue
        out.append(
            {
                "name": op.name,
                "attrs": dict(op.attrs),
                "input_channels": list(op.input_channels),
                "output_bindings": [list(b) for b in op.output_bindings],
            }
        )
    return out


def run_reference(case, dtype=torch.float64, device="cpu"):
    """The plain-autograd reference of the case (float64, or the rounding baseline)."""
    from .reference import reference

    return reference(
        reference_ops(case),
        case.input,
        [op.params for op in case.ops],
        case.extra_inputs,
        case.cotangents,
        input_requires_grad=case.input_requires_grad,
        param_requires_grad=[op.param_requires_grad for op in case.ops],
        extra_input_requires_grad=case.extra_input_requires_grad,
        dtype=dtype,
        device=device,
    )
