"""The torch backend: every case on its runtime (runtime.py, plain PyTorch eager).

A third, independent implementation of the catalog and of the repaired runtime semantics,
on the CPU and, where present, CUDA. Its one fusion, BackwardLinearScale, fires only under
an FP8 recipe (an emulation of TE's fused op, which quantizes the Linear's gradient before
the ConstantScale's scale: runtime.FUSIONS); elsewhere its fused and unfused paths
are the same computation (the unfused one is skipped when asked to be).
A case's FP8 recipe (and cache_quantized_input) runs on fp8.py's emulation: the ops it
quantizes carry an fp8.OpQuantization, and the delayed-scaling histories live in the
ops, so they persist across the calls of one Sequential.
"""

import contextlib
import os
import platform

import torch

from .. import catalog, faults, recipes
from ..driver import USAGE, Builder, HeldWeight, run_paths, torch_writer_scope
from ..errors import GradfuzzError
from ..fp8_state import FP8_MAX, state_entry
from ..invariants import check_emulated, fp8_checks_on
from . import fp8, parallel
from .faults import FAULTS
from .runtime import FUSIONS, BasicOp, Boundary, Sequential


class TorchBuilder(Builder):
    name = "torch"

    def __init__(self):
        self.recipe = None  # the running case's recipes.Recipe, set by TorchBackend.run
        self.fusions = ()  # the running path's fusions (fusion_scope)
        self.tensor_checks = None  # the path's quantized tensors' checks (fusion_scope)
        self.quantizer_ops = {}  # id(fp8 quantizer) -> spec op index, for the path's ops

    @contextlib.contextmanager
    def fusion_scope(self, fusions):
        previous, self.fusions = self.fusions, tuple(f for f in fusions if f in FUSIONS)
        # Every quantized tensor the emulation makes while the path runs is checked as it is
        # made (invariants.py: check_emulated; take_tensor_checks hands them over).
        self.tensor_checks = {"checked": 0, "violations": []}
        self.quantizer_ops = {}
        try:
            with fp8.recording(self._check_tensor if fp8_checks_on() else None):
                yield
        finally:
            self.fusions = previous

    def _check_tensor(self, quantizer, x, result):
        try:
            with torch.no_grad():
                found = check_emulated(quantizer, x, result)
        except Exception:  # noqa: BLE001 - a failing check is no finding of the emulation's
            return
        if found is None:
            return
        self.tensor_checks["checked"] += 1
        op = self.quantizer_ops.get(id(quantizer), -1)
        for what, note in found:
            self.tensor_checks["violations"].append(
                {
                    "op": op,
                    "quantizer": f"quantized_tensor[{getattr(quantizer, 'role', '?')}]",
                    "what": what,
                    "note": f"{type(quantizer).__name__}: {note}",
                }
            )

    def take_tensor_checks(self):
        # None where the call quantized nothing, so that a case without a recipe keeps its
        # verdict as it was.
        verdict = getattr(self, "tensor_checks", None)
        if verdict is None or not (verdict["checked"] or verdict["violations"]):
            return None
        self.tensor_checks = {"checked": 0, "violations": []}
        return verdict

    def device(self, case):
        if self.recipe is not None and not recipes.RECIPES[self.recipe.name].emulated:
            raise NotImplementedError(f"the torch backend does not emulate {self.recipe.name}")
        if case.device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("the case runs on cuda, which this machine does not have")
        return torch.device(case.device)

    def create_op(self, op_case, case, device):
        if parallel.needs_parallel_op(op_case.name, op_case.attrs):
            # A rank of a distributed case (ranks.py): this rank's slices, its collectives.
            op = parallel.ParallelOp(
                op_case.name,
                op_case.attrs,
                op_case.input_shape,
                op_case.global_input_shape,
                op_case.param_shapes,
                dtype=case.dtype,
                device=device,
                output_style=op_case.output_style,
            )
        else:
            op = BasicOp(
                op_case.name,
                op_case.attrs,
                op_case.input_shape,
                dtype=case.dtype,
                device="meta" if case.deferred_init else device,
                output_style=op_case.output_style,
            )
            if case.deferred_init:
                op.materialize(device)
        with torch.no_grad():
            for p, value in zip(op.params, op_case.params):
                p.copy_(value)
        for p, rg in zip(op.params, op_case.param_requires_grad):
            p.requires_grad_(rg)
        quantization = fp8.OpQuantization(op_case.name, op_case.attrs, self.recipe)
        if quantization.active:
            op.quantization = quantization
        for lq in quantization.linear:
            for q in (lq.input, lq.weight, lq.grad_output):
                self.quantizer_ops[id(q)] = op_case.index
        if case.quantized_params and op_case.name == "Linear" and quantization.linear:
            # quantized_model_init: the weight a quantized parameter from the start.
            _write_quantized_weight(op, op.params[0])
        return op

    def make_boundary(self):
        return Boundary()

    def call_standalone(self, op, x, extras):
        op(x, *extras)

    def bind_input(self, op, slot, channel):
        op.set_extra_input_channel(slot, channel)

    def bind_output(self, op, slot, channel, output_to_caller):
        op.set_extra_output_channel(slot, channel, output_to_caller)

    def is_locked(self, op):
        return op.locked

    def make_sequential(self, modules):
        return Sequential(*modules, fusions=self.fusions)

    def forward(self, seq, x, extras):
        out = seq(x, *extras)
        # The end of TE's autocast region: the forward delayed-scaling update (none for a
        # call with the recipe off: no autocast).
        if not fp8.recipe_is_off():
            fp8.update_after_forward(_quantizations(seq.modules))
        return list(out) if isinstance(out, tuple) else [out]

    @contextlib.contextmanager
    def recipe_off_scope(self):
        with fp8.recipe_off():
            yield

    def set_amax_history_len(self, ops, case, length):
        for op in ops:
            quantization = getattr(op, "quantization", None)
            if quantization is not None:
                quantization.set_history_len(length)

    def set_params(self, op, op_case, values):
        super().set_params(op, op_case, values)
        if _quantized_weight(op) is not None:
            # Written through the quantized parameter: both copies made from the new values.
            _write_quantized_weight(op, values[0])

    def save_state(self, op):
        state = super().save_state(op)
        q = _quantized_weight(op)
        if q is not None:
            # The quantized weight itself, both copies (TE's state_dict holds the quantized
            # parameter): loading it quantizes nothing again.
            state["quantized_weight"] = (q.data.clone(), q.data_t.clone())
        return state

    def load_state(self, op, state):
        super().load_state(op, state)
        if _quantized_weight(op) is not None and "quantized_weight" in state:
            data, data_t = state["quantized_weight"]
            op.quantization.quantized_weight = fp8.QuantizedTensor(data.clone(), data_t.clone())
            with torch.no_grad():
                op.params[0].copy_(data.to(op.params[0].dtype))

    def held_weights(self, ops, case):
        out = []
        for op_case in case.catalog_ops:
            op = ops[op_case.index]
            q = _quantized_weight(op)
            if q is None:
                continue
            held = fp8.HeldQuantizedWeight(op.params[0], q)
            # The column-wise copy is the row-wise one's transpose for per-tensor scaling and
            # 2D blocks (BlockQuantizer makes the 1D copies apart).
            lq = op.quantization.linear[0].weight
            exact = not isinstance(lq, fp8.BlockQuantizer) or lq.block_dim == 2
            copies = [q.data, q.data_t.t()] if exact else None
            out.append(HeldWeight(op=op_case.index, tensor=held, copies=copies))
        return out

    def after_backward(self, ops):
        fp8.update_after_backward(_quantizations(ops))

    def param_leaves(self, op, op_case):
        return [p for p in op.params if p.requires_grad]

    def param_tensors(self, op, op_case):
        return op.params

    def delayed_states(self, ops, case):
        out = {}
        for op_case in case.catalog_ops:
            quantization = getattr(ops[op_case.index], "quantization", None)
            for group, lq in enumerate(quantization.linear if quantization is not None else []):
                for pass_, role, q in (
                    ("forward", "input", lq.input),
                    ("forward", "weight", lq.weight),
                    ("backward", "grad_output", lq.grad_output),
                ):
                    if not q.delayed:
                        continue
                    out[(op_case.index, pass_, role, group)] = state_entry(
                        op_case.index,
                        pass_,
                        role,
                        group,
                        q.history,
                        q.scale,
                        fp8_max=FP8_MAX[q.fmt],
                        margin=q.margin,
                        algo=q.algo,
                    )
        return out

    def param_grads(self, op, op_case, leaf_grads):
        grads = iter(leaf_grads)
        return [next(grads) if p.requires_grad else None for p in op.params]

    def channel_leaves(self, seq, case):
        return [
            (f, name, t)
            for f, fuser in enumerate(seq.fusers)
            for name, t in fuser.channels.items()
            if t is not None and t.is_floating_point()
        ]

    def writer_scope(self, seq, case, ops, watch):
        # driver.py: torch_writer_scope wraps each of the runtime's fusers' groups.
        return torch_writer_scope(seq, case, watch)

    def plans(self, seq, case, ops):
        out = []
        for fuser, members in zip(seq.fusers, case.fusers):
            groups = [
                {"name": op.name, "begin": index, "end": index + 1, "fused": False}
                for op, index in zip(fuser.ops, members)
            ]
            out.append({"forward": groups, "backward": fuser.backward_plan(members)})
        return out

    def classify(self, exc):
        if isinstance(exc, NotImplementedError):
            return "unsupported", "the torch backend declines this case"
        if isinstance(exc, GradfuzzError):
            return "error", exc.kind
        return "error", "unrecognized"

    def left_locked(self, seq, ops, locked_before, phase):
        if phase != "Sequential construction":
            return []
        return [
            i
            for i, op in enumerate(ops)
            if isinstance(op, BasicOp) and op.locked and not locked_before[i]
        ]


def _quantizations(ops):
    return [
        op.quantization for op in ops if isinstance(op, BasicOp) and op.quantization is not None
    ]


# Catalog attrs whose values change this backend's math and that the generator should draw
# (the catalog options added for TE: zero-centred gamma, interleaved SwiGLU,
# cache_quantized_input, emulated by fp8.cached_input_activation), and the in-place
# flags (math-neutral here, see catalog.add_extra_input).
_CACHED_INPUT = {"cache_quantized_input": [0, 1]}
OPTIONS = {
    "ReLU": dict(_CACHED_INPUT),
    "GELU": dict(_CACHED_INPUT),
    "SReLU": dict(_CACHED_INPUT),
    "SwiGLU": dict(_CACHED_INPUT, interleave=[0, 1, 2, 4]),
    "ScaledSwiGLU": {"interleave": [0, 1, 2, 4]},
    "RMSNorm": {"zero_centered_gamma": [0, 1]},
    "LayerNorm": {"zero_centered_gamma": [0, 1]},
    "MakeExtraOutput": {"in_place": [0, 1]},
    "AddExtraInput": {"in_place": [0, 1]},
}


class TorchBackend:
    name = "torch"

    def __init__(self):
        self.builder = TorchBuilder()

    def hello(self):
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        styles = ["vector", "generator"]
        ops = {
            name: {
                "implementation": f"gradfuzz_adapter.catalog.{_implementation(name)}",
                "options": OPTIONS.get(name, {}),
                "output_styles": styles,
            }
            for name in catalog.OP_NAMES
        }
        return {
            "backend": self.name,
            "protocol": 1,
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "capabilities": {
                "devices": devices,
                "dtypes": ["float64", "float32", "bfloat16", "float16"],
                "ops": ops,
                "fusions": [
                    {
                        "name": name,
                        "pass": pass_name,
                        "implementation": "gradfuzz_adapter.torch_backend.fp8.quantized_linear",
                    }
                    for name, pass_name in FUSIONS.items()
                ],
                "deviations": [],
                "recipes": recipe_capabilities(),
                # fp8.py casts and scales as the C++ reference does (ops/quantization.cc).
                "fp8_reference_exact": True,
                # Distributed cases (ranks.py, parallel.py): gloo ranks on the CPU (NCCL
                # ranks on CUDA need a GPU each: the coordinator declines more than it sees).
                "max_world_size": MAX_WORLD_SIZE,
                # The usage script's steps (driver.py runs them through the builder).
                "usage": list(USAGE),
                "faults": faults.capabilities(FAULTS),
            },
        }

    def run(self, case, paths, tensors, fault=None):
        """The paths' results; `fault`: one of capabilities.faults (torch_backend/faults.py),
        planted for this request only (an unknown name: ValueError, the request's error)."""
        # A recipe the generator could not have drawn from hello is the request's error
        # (ValueError: ok false); one the emulation lacks makes each path unsupported
        # (TorchBuilder.device).
        self.builder.recipe = recipes.parse_recipe(case.spec.get("recipe"))
        # One intra-op thread suits tiny cases (see __main__.configure_torch); a large case
        # (more elements in a tensor than the harness's on-device reference threshold, 2^16)
        # gets every core: a [4096, 4096] matmul takes seconds per thread.
        small = torch.get_num_threads()
        large = _largest_tensor(case) > LARGE_CASE_ELEMENTS
        if large:
            torch.set_num_threads(
                int(os.environ.get("GRADFUZZ_ADAPTER_THREADS_LARGE", "0")) or (os.cpu_count() or 1)
            )
        try:
            with faults.planted(FAULTS, fault):
                return run_paths(self.builder, case, paths, tensors)
        finally:
            if large:
                torch.set_num_threads(small)


LARGE_CASE_ELEMENTS = 1 << 16
# Rank processes a distributed case may have on this backend (any N works; more processes
# than cores only make them slow). GRADFUZZ_MAX_WORLD_SIZE overrides.
MAX_WORLD_SIZE = int(os.environ.get("GRADFUZZ_MAX_WORLD_SIZE", "8"))


def recipe_capabilities():
    """capabilities.recipes (docs/BACKENDS.md Protocol 2): every recipe of recipes.RECIPES,
    available where this backend emulates it (on any device it runs)."""
    out = []
    for name, info in recipes.RECIPES.items():
        out.append(
            {
                "name": name,
                "available": info.emulated,
                "reason": "" if info.emulated else f"the torch backend does not emulate {name}",
                "fp8_formats": list(info.fp8_formats),
                "options": {k: list(v) for k, v in info.options.items()},
            }
        )
    return out


def _largest_tensor(case):
    """Element count of the case's largest main-path tensor or parameter."""
    largest = 1
    for op in case.ops:
        for shape in [op.input_shape, op.output_shape, *op.param_shapes]:
            n = 1
            for d in shape:
                n *= int(d)
            largest = max(largest, n)
    return largest


def _implementation(name):
    fn = {
        "Linear": catalog.linear,
        "Bias": catalog.bias_add,
        "ConstantScale": catalog.constant_scale,
        "ReLU": catalog.relu,
        "GELU": catalog.gelu,
        "SReLU": catalog.srelu,
        "SwiGLU": catalog.swiglu,
        "ScaledSwiGLU": catalog.scaled_swiglu,
        "ScaledSReLU": catalog.scaled_srelu,
        "MakeExtraOutput": catalog.make_extra_output,
        "AddExtraInput": catalog.add_extra_input,
        "GroupedLinear": catalog.grouped_linear,
        "RMSNorm": catalog.rms_norm,
        "LayerNorm": catalog.layer_norm,
        "Dispatch": catalog.dispatch,
        "Combine": catalog.combine,
        "RowStat": catalog.row_stat,
        "DualExtraOutput": catalog.dual_extra_output,
        "Identity": catalog.identity,
        "Reshape": catalog.reshape,
        "AllGather": catalog.collective,
        "ReduceScatter": catalog.collective,
        "AllReduce": catalog.collective,
    }[name]
    return fn.__name__


def _quantized_weight(op):
    quantization = getattr(op, "quantization", None)
    return None if quantization is None else quantization.quantized_weight


def _write_quantized_weight(op, weight):
    """`weight` written into op's quantized parameter (OpQuantization.write_weight), the
    parameter holding the quantized values as a quantized tensor dequantizes."""
    q = op.quantization.write_weight(weight)
    with torch.no_grad():
        op.params[0].copy_(q.data.to(op.params[0].dtype))
