"""A Python stand-in for the C++ worker: builds `run`/`export` requests from a CaseSpec.

It plans the case (shapes, slot kinds, public slot order) from the catalog and draws every
tensor from the spec's seed the way harness/builder.cc does (values away from zero, router
logits with a clear winner, random split-size compositions, permutation routing maps),
rounded to the case's dtype. The values differ from the C++ generator's; the structure of
the request is the same. Used by the tests and for trying cases by hand.
"""

import math

import torch

from . import catalog
from .case import BOUNDARY
from .protocol import TensorList

MIN_MAGNITUDE = 0.1
ROUTER_MARGIN = 1.0
DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

DEFAULT_ATTRS = {
    "Linear": {"out": 16},
    "ConstantScale": {"scale": 0.5},
    "Reshape": {"features": 0},
    "SwiGLU": {"interleave": 0},
    "ScaledSwiGLU": {"interleave": 0},
    "MakeExtraOutput": {"in_place": 0},
    "AddExtraInput": {"in_place": 0},
    "DualExtraOutput": {"s0": 0.5, "s1": -1.5},
    "GroupedLinear": {"groups": 2, "out": 16, "bias": 1, "scale_bias": 0},
    "RMSNorm": {"eps": 1e-5, "zero_centered_gamma": 0},
    "LayerNorm": {"eps": 1e-5, "zero_centered_gamma": 0},
    "Dispatch": {"groups": 2},
}


def slot_shapes(name, attrs, input_shape):
    """(extra input shapes, extra output shapes) for a main input [rows, features]."""
    rows, features = input_shape
    if name in ("ScaledSwiGLU", "ScaledSReLU"):
        return [[rows]], []
    if name == "AddExtraInput":
        return [[rows, features]], []
    if name == "GroupedLinear":
        groups = int(attrs["groups"])
        return ([[groups], [rows]] if attrs.get("scale_bias") else [[groups]]), []
    if name == "Dispatch":
        groups = int(attrs["groups"])
        return [[rows, groups]], [[groups], [rows], [rows]]
    if name == "Combine":
        return [[rows]], []
    if name == "MakeExtraOutput":
        return [], [[rows, features]]
    if name == "RowStat":
        return [], [[rows]]
    if name == "DualExtraOutput":
        return [], [[rows, features], [rows, features]]
    return [], []


def output_shape(name, attrs, input_shape):
    rows, features = input_shape
    if name in ("Linear", "GroupedLinear"):
        return [rows, int(attrs["out"])]
    if name in ("SwiGLU", "ScaledSwiGLU"):
        return [rows, features // 2]
    if name == "Reshape":
        target = int(attrs["features"]) or features
        return [rows * features // target, target]
    return [rows, features]


def plan_case(spec):
    """The request's "plan" (docs/BACKENDS.md): per op fuser, shapes, slots, param shapes,
    resolved attrs; public inputs and outputs in (op, slot) order."""
    shape = list(spec["input_shape"])
    ops, public_inputs, public_outputs = [], [], []
    fuser, previous_was_op = -1, False
    for i, op in enumerate(spec["ops"]):
        name = op["name"]
        if name == BOUNDARY:
            previous_was_op = False
            ops.append(
                {
                    "fuser": -1,
                    "input_shape": shape,
                    "output_shape": shape,
                    "extra_inputs": [],
                    "extra_outputs": [],
                    "param_shapes": [],
                    "attrs": {},
                }
            )
            continue
        if not previous_was_op:
            fuser += 1
        previous_was_op = True
        attrs = dict(DEFAULT_ATTRS.get(name, {}))
        attrs.update(op.get("attrs") or {})
        catalog.validate(name, attrs, shape)
        kinds_in, kinds_out = catalog.slot_kinds(name, attrs)
        shapes_in, shapes_out = slot_shapes(name, attrs, shape)
        channels = op.get("input_channels") or []
        bindings = op.get("output_bindings") or []
        for s in range(len(kinds_in)):
            if s >= len(channels) or channels[s] is None:
                public_inputs.append([i, s])
        for s in range(len(kinds_out)):
            b = bindings[s] if s < len(bindings) else {}
            if b.get("channel") is None or b.get("output_to_caller", True):
                public_outputs.append([i, s])
        out_shape = output_shape(name, attrs, shape)
        ops.append(
            {
                "fuser": fuser,
                "input_shape": shape,
                "output_shape": out_shape,
                "extra_inputs": [{"kind": k, "shape": s} for k, s in zip(kinds_in, shapes_in)],
                "extra_outputs": [{"kind": k, "shape": s} for k, s in zip(kinds_out, shapes_out)],
                "param_shapes": catalog.param_shapes(name, attrs, shape),
                "attrs": attrs,
            }
        )
        shape = out_shape
    return {
        "ops": ops,
        "public_inputs": public_inputs,
        "public_outputs": public_outputs,
        "output_shape": shape,
    }


def _normal(shape, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _away_from_zero(shape, gen):
    z = _normal(shape, gen)
    return torch.sign(z) * (MIN_MAGNITUDE + z.abs()) + (z == 0) * MIN_MAGNITUDE


def _split_sizes(rows, groups, gen):
    cuts = torch.sort(torch.randint(0, rows + 1, (groups - 1,), generator=gen)).values
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([rows])])
    return (bounds[1:] - bounds[:-1]).to(torch.int64)


def _draw_slot(op_name, slot, kind, shape, rows, gen, corrupt=False):
    if kind == "split_sizes":
        sizes = _split_sizes(rows, shape[0], gen)
        if corrupt:
            sizes[0] += 1
        return sizes
    if kind == "routing_map":
        return torch.randperm(rows, generator=gen)
    values = _away_from_zero(shape, gen)
    if op_name == "Dispatch" and slot == 0:
        winners = values.argmax(1, keepdim=True)
        values.scatter_add_(
            1, winners, torch.full(winners.shape, ROUTER_MARGIN, dtype=torch.float64)
        )
    return values


def _round(t, dtype):
    return t if not t.is_floating_point() else t.to(dtype).to(torch.float64)


def draw_values(spec, plan):
    """Every tensor of the case (float64/int64, rounded to the case dtype) in the order of
    harness/builder.cc: input, parameters, public extra inputs, surplus, cotangents, calls."""
    dtype = DTYPES[spec.get("dtype", "float64")]
    gen = torch.Generator().manual_seed(int(spec.get("seed", 0)) % (2**63))
    values = {"input": _round(_away_from_zero(spec["input_shape"], gen), dtype)}
    params = []
    for op in plan["ops"]:
        op_params = []
        for shape in op["param_shapes"]:
            if len(shape) >= 2:
                v = _normal(shape, gen) / math.sqrt(shape[-1])
            else:
                v = _away_from_zero(shape, gen)
            op_params.append(_round(v, dtype))
        params.append(op_params)
    values["params"] = params
    extras, extra_rg = [], []
    for op_index, slot in plan["public_inputs"]:
        op_plan = plan["ops"][op_index]
        entry = op_plan["extra_inputs"][slot]
        rows = op_plan["input_shape"][0]
        extras.append(
            _round(
                _draw_slot(
                    spec["ops"][op_index]["name"],
                    slot,
                    entry["kind"],
                    entry["shape"],
                    rows,
                    gen,
                    spec.get("corrupt_split_sizes", False),
                ),
                dtype,
            )
        )
        flags = spec["ops"][op_index].get("extra_input_requires_grad") or []
        extra_rg.append(entry["kind"] == "float" and (flags[slot] if slot < len(flags) else True))
    delta = int(spec.get("extra_input_count_delta", 0))
    if delta > 0:
        for _ in range(delta):
            extras.append(_round(_away_from_zero([spec["input_shape"][0]], gen), dtype))
            extra_rg.append(False)
    elif delta < 0:
        del extras[len(extras) + delta :]
        del extra_rg[len(extra_rg) + delta :]
    values["extra_inputs"] = extras
    values["extra_input_requires_grad"] = extra_rg
    cotangents = [_round(_normal(plan["output_shape"], gen), dtype)]
    for op_index, slot in plan["public_outputs"]:
        entry = plan["ops"][op_index]["extra_outputs"][slot]
        cotangents.append(
            _round(_normal(entry["shape"], gen), dtype) if entry["kind"] == "float" else None
        )
    values["cotangents"] = cotangents
    calls = []
    for step in spec.get("call_then_bind") or []:
        op_plan = plan["ops"][step["op"]]
        rows = op_plan["input_shape"][0]
        call_x = _round(_away_from_zero(op_plan["input_shape"], gen), dtype)
        call_extras = [
            _round(
                _draw_slot(spec["ops"][step["op"]]["name"], s, e["kind"], e["shape"], rows, gen),
                dtype,
            )
            for s, e in enumerate(op_plan["extra_inputs"])
        ]
        calls.append((call_x, call_extras))
    values["call_inputs"] = calls
    return values


def make_request(spec, op="run", paths=None, **extra):
    """(header, tensors) of a request for `spec` (a CaseSpec dict)."""
    plan = plan_case(spec)
    values = draw_values(spec, plan)
    out = TensorList()
    header_values = {
        "input": out.add(values["input"], widen=False),
        "params": [[out.add(p, widen=False) for p in op_params] for op_params in values["params"]],
        "extra_inputs": [out.add(e, widen=False) for e in values["extra_inputs"]],
        "extra_input_requires_grad": values["extra_input_requires_grad"],
        "cotangents": [out.add(c, widen=False) for c in values["cotangents"]],
        "call_inputs": [
            {
                "input": out.add(x, widen=False),
                "extra_inputs": [out.add(e, widen=False) for e in es],
            }
            for x, es in values["call_inputs"]
        ],
    }
    plan = {k: v for k, v in plan.items() if k != "output_shape"}
    if paths is None:
        paths = [
            {"name": "fused", "fusions": list(spec.get("fusions") or [])},
            {"name": "unfused", "fusions": [], "skip_if_nothing_fused": True},
        ]
    header = {"op": op, "spec": spec, "plan": plan, "paths": paths, "values": header_values}
    header.update(extra)
    return header, out.tensors


def reply_tensor(reply_tensors, ref):
    return None if ref is None else reply_tensors[ref]


def path_result(path, reply_tensors):
    """A run reply's path entry (or repeat call) with its tensor indices resolved."""

    def t(ref):
        return reply_tensor(reply_tensors, ref)

    out = dict(path)
    out["outputs"] = [t(r) for r in path.get("outputs") or []]
    if "grad_input" in path:
        out["grad_input"] = t(path["grad_input"])
        out["grad_params"] = [[t(r) for r in op] for op in path["grad_params"]]
        out["grad_extra_inputs"] = [t(r) for r in path["grad_extra_inputs"]]
    if "channel_grads" in path:
        out["channel_grads"] = [{k: t(r) for k, r in c.items()} for c in path["channel_grads"]]
    if "trace" in path:
        out["trace"] = [
            dict(
                e,
                tensor=t(e["tensor"]),
                extras=[dict(x, tensor=t(x["tensor"])) for x in e.get("extras") or []],
            )
            for e in path["trace"]
        ]
    if "repeats" in path:
        out["repeats"] = [path_result(r, reply_tensors) for r in path["repeats"]]
    return out
