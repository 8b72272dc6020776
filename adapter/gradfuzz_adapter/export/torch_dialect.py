"""The torch dialect: scripts that run a case on the torch backend's runtime
(torch_backend/runtime.py, gradfuzz's own model of te.ops on PyTorch), the implementation
under test there.

The compact, full and distributed forms embed the runtime, so the script stands alone; its
FP8 recipes are recipes.py's emulation, whose delayed-scaling updates the script makes where
TE's autocast would.
"""

import os

from .. import catalog
from .dialect import Dialect
from .text import Name, adapter_module_body, literal, wrap_call

# The adapter's folder: the torch dialect's upstream tests import the runtime from it.
ADAPTER = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# run()'s recipe state per op, for the emulation's delayed-scaling updates.
QUANTIZATIONS = "[op.quantization for op in ops if getattr(op, 'quantization', None)]"


# The catalog's defaults of its attrs other than 0 (catalog.py: validate, apply), and the attrs
# an upstream test always spells (the op's sizes): the others are written where they differ.
CATALOG_DEFAULTS = {"bias": 1.0, "scale": 0.5, "s0": 0.5, "s1": -1.5, "eps": 1e-5}
SHAPE_ATTRS = ("out", "groups", "features")


class TorchDialect(Dialect):
    name = "torch"
    implementation_words = "the runtime under test"
    sequential = "Sequential"
    output_to_caller_keyword = ""
    exposes_channel_gradients = True  # the runtime's fusers keep each channel's value
    fusions_at_construction = True  # Sequential(..., fusions=...): torch_backend.runtime.FUSIONS
    validates_at_construction = True  # the runtime builds its fusers in Sequential()
    documents_in_place_writes = False  # the runtime's in_place ops copy (catalog.py)
    compares_plans = False  # one group per op whatever the call (torch_backend.runtime: Fuser.plan)
    locked_helper = "locked_torch"
    compact_embedded_title = (
        "The runtime under test: gradfuzz's torch backend (gradfuzz_adapter/"
        "torch_backend/runtime.py, catalog.py), embedded so that the script stands alone"
    )
    # A failed construction must leave its ops unlocked (torch_backend/backend.py: left_locked): the
    # runtime builds its fusers in the Sequential's constructor. An error after that (a
    # late bind into a locked op) is no failed construction.
    failed_construction = [
        '    if "locked_before" in state and "model" not in state:  # in Sequential()'
    ]

    # -- every form

    def device(self, case):
        return case.device

    def recipe_imports(self, recipe):
        return []  # the emulation is embedded

    def tf32_lines(self, case):
        return [] if case.device == "cpu" else ["torch.backends.cuda.matmul.allow_tf32 = False"]

    @staticmethod
    def quantized(op, recipe):
        """Whether the runtime's op quantizes (recipes.OpQuantization): under a recipe, or
        an activation's cache_quantized_input."""
        if recipe is not None:
            return True
        return float(op.attrs.get("cache_quantized_input", 0)) == 1.0

    # -- the compact form

    def recipe_lines(self, recipe):
        return []

    def recipe_contexts(self, recipe):
        return []

    def after_forward(self, w):
        """The forward delayed-scaling update (recipes.py), as TE's autocast exit makes it."""
        if w.recipe is None:
            return []
        w.picker.add("torch_backend.fp8.update_after_forward")
        w.picker.add("torch_backend.fp8.update_after_backward")
        return [f"update_after_forward({QUANTIZATIONS})"]

    def after_backward(self, w):
        """The backward update, as TE's first module's backward makes it."""
        if w.recipe is None:
            return []
        return [f"update_after_backward({QUANTIZATIONS})"]

    def param_helper_ops(self, case):
        return set()

    def compact_build(self, w):
        """build(): the ops with the runtime's BasicOp, parameters copied, quantization set."""
        case = w.case
        for name in ("BasicOp", "Boundary", "Sequential"):
            w.picker.add(f"torch_backend.runtime.{name}")
        lines = w.build_head()
        copies, after = [], []
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                lines.append(f"    {var} = Boundary()")
                continue
            attrs = {k: float(v) for k, v in sorted(op.attrs.items())}
            style = f', output_style="{op.output_style}"' if op.output_style != "vector" else ""
            lines.append(
                f'    {var} = BasicOp("{op.name}", {attrs!r}, {list(op.input_shape)}, '
                f"dtype=DTYPE, device=DEVICE{style})"
            )
            if self.quantized(op, w.recipe):
                w.picker.add("torch_backend.fp8.OpQuantization")
                w.picker.add("recipes.parse_recipe")
                lines.append(
                    f'    {var}.quantization = OpQuantization("{op.name}", {attrs!r}, '
                    f"parse_recipe({case.spec.get('recipe')!r}))"
                )
            for j in range(len(op.params)):
                copies.append(f"        {var}.params[{j}].copy_({w.param_value(op, j)})")
                # BasicOp's parameters start as plain tensors (no requires_grad).
                after.append(f"    {var}.params[{j}].requires_grad_({op.param_requires_grad[j]})")
        if copies:
            lines += ["    with torch.no_grad():", *copies]
        lines += after
        return lines + w.build_tail()

    def run_param_leaves(self, w, op, var):
        leaves = [
            f'("grad_param[{op.index}].{op.name}[{j}]", {var}.params[{j}])'
            for j in range(len(op.params))
        ]
        return leaves, [], False

    def clears_gradients(self, w):
        return False  # autograd.grad accumulates nothing in the runtime's parameters

    def compact_raises(self, w, kind):
        """The error test's body: the runtime raises its GradfuzzError of the kind."""
        w.picker.add("errors.GradfuzzError")
        return [
            f'    """gradfuzz\'s reference rejects this configuration ({kind}), and a failed',
            '    construction must leave every op as it was (unlocked)."""',
            "    state = {}",
            "    with pytest.raises(GradfuzzError) as raised:",
            "        run(*build(state))",
            f"    assert raised.value.kind == {kind!r}, raised.value",
        ]

    # -- the full form

    full_docstring_note = None

    def full_environment(self, case):
        return []

    def full_sections(self):
        return [
            (
                "The torch backend's runtime (gradfuzz_adapter/torch_backend/runtime.py)",
                adapter_module_body("torch_backend.runtime"),
            )
        ]

    def full_build(self, w):
        """run_case(fusions): the case with the runtime's BasicOp (no fusions: unused)."""
        case = w.case
        body = []
        refs = []
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                body.append(f"{var} = Boundary()")
                refs.append("None")
                continue
            attrs = {k: float(v) for k, v in sorted(op.attrs.items())}
            style = f', output_style="{op.output_style}"' if op.output_style != "vector" else ""
            body.append(
                f'{var} = BasicOp("{op.name}", {attrs!r}, {list(op.input_shape)}, dtype=DTYPE, '
                f"device=DEVICE{style})"
            )
            if op.param_shapes:
                body += [
                    "with torch.no_grad():",
                    f"    for p, value in zip({var}.params, PARAMS[{op.index}]):",
                    "        p.copy_(value)",
                    f"for p, rg in zip({var}.params, PARAM_REQUIRES_GRAD[{op.index}]):",
                    "    p.requires_grad_(rg)",
                ]
            refs.append(f'({var}, "{op.name}")')
        body += w.assembly(refs)
        body += [
            "return forward_backward(",
            "    model, x, extras, COTANGENTS, ops, torch_param_leaves, torch_param_grads",
            ")",
        ]
        return (
            "def torch_param_leaves(op, name):\n"
            "    return [p for p in op.params if p.requires_grad]\n\n\n"
            "def torch_param_grads(op, name, grads):\n"
            "    return [grads.get(id(p)) if p.requires_grad else None for p in op.params]\n\n\n"
            "def run_case(fusions):\n"
            '    """Builds the case with the torch runtime as a user writes it and runs it '
            "(the torch\n"
            '    backend has no fusions); returns its outputs and gradients."""\n'
            f"{w.indented(body, 4)}\n"
        )

    def full_raises(self, kind):
        return (
            f'    """gradfuzz\'s reference rejects this configuration ({kind})."""\n'
            "    with pytest.raises(GradfuzzError) as raised:\n"
            "        run_case(fusions)\n"
            f"    assert raised.value.kind == {kind!r}, raised.value\n"
        )

    # -- the distributed form

    def distributed_sections(self):
        """The runtime and its tensor parallelism (torch_backend/parallel.py), embedded."""
        return [
            "# " + "-" * 88,
            "# The torch backend's runtime and its tensor parallelism",
            "# (gradfuzz_adapter/torch_backend/runtime.py, collectives.py, parallel.py)",
            adapter_module_body("torch_backend.runtime"),
            adapter_module_body("torch_backend.collectives"),
            adapter_module_body("torch_backend.parallel"),
        ]

    def distributed_build_op(self, w, op, i):
        """build()'s lines making op `i` on a rank from its slices `mine`: torch_backend.parallel's
        ParallelOp where the emulation communicates or splits the op itself."""
        attrs = dict(op.attrs)
        shape = w.local_shape(i)
        if _splits(op.name, attrs):
            out = [
                f"    op = ParallelOp({op.name!r}, {attrs!r}, {shape!r}, "
                f"{list(w.global_input_shape(i))!r}, [list(p.shape) for p in mine], "
                "dtype=DTYPE, device=device)"
            ]
        else:
            out = [
                f"    op = BasicOp({op.name!r}, {attrs!r}, {shape!r}, dtype=DTYPE, device=device)"
            ]
        return out + [
            "    with torch.no_grad():",
            "        for p, v in zip(op.params, mine):",
            "            p.copy_(v.to(device, DTYPE))",
            f"    for p, rg in zip(op.params, PARAM_REQUIRES_GRAD[{i}]):",
            "        p.requires_grad_(rg)",
        ]

    def distributed_test_fields(self):
        """The test template's per-dialect parts (distributed.py: TEST)."""
        return {
            "init": "    init(rank, world)  # the emulation's collectives over it\n",
            "sequential": self.sequential,
            "leaves": "[p for p in op.params if p.requires_grad]",
            "finish": "",
        }

    # -- the upstream form (upstream.py: UpstreamWriter `w`)

    upstream_tf32_note = "dtype_tols(torch.float32): TF32 off in this test"

    def upstream_float32_gemm_tols(self):
        return (1.3e-6, 1e-5)  # the runtime's GEMMs are torch's, TF32 off in the test

    def upstream_check(self, w):
        return None  # every catalog op is the runtime's

    def upstream_runnable_reason(self):
        return None  # the runtime is here

    def upstream_environment(self, fault):
        """The runtime importable from the adapter, its planted fault switched on (or off)."""
        paths = [ADAPTER, *filter(None, [os.environ.get("PYTHONPATH")])]
        return {"PYTHONPATH": os.pathsep.join(paths), "GRADFUZZ_FAULT": fault or ""}

    def upstream_imports(self, w):
        lines = ["import os", ""] if w.values_file else []
        lines += ["import pytest", "import torch", ""] if self._tf32(w) else ["import torch", ""]
        runtime = ["BasicOp", "Sequential"] + (
            ["Boundary"] if any(op.boundary for op in w.case.ops) else []
        )
        recipes = []
        if self._quantizations(w):  # a recipe, or a cached quantized input without one
            recipes = ["parse_recipe"] if w.recipe is not None else ["OpQuantization"]
        if self._current_scaling(w) and any(v.representable for v in w.values):
            recipes.append("current_scaling_qdq")
        if recipes and self._updates(w):
            recipes += ["update_after_backward", "update_after_forward"]
        if recipes:
            line = f"from gradfuzz_adapter.recipes import {', '.join(sorted(recipes))}"
            if len(line) > 100:  # as black explodes an import: a name a line
                names = [f"    {name}," for name in sorted(recipes)]
                lines += ["from gradfuzz_adapter.recipes import (", *names, ")"]
            else:
                lines.append(line)
        lines.append(
            f"from gradfuzz_adapter.torch_backend.runtime import {', '.join(sorted(runtime))}"
        )
        return lines

    @staticmethod
    def _tf32(w):
        return w.case.device == "cuda" and w.case.dtype_name == "float32" and w.has_gemm

    def upstream_parameters(self, w):
        params = f"dtype=torch.{w.case.dtype_name}"
        if self.upstream_has_device(w):
            params += f', device="{w.case.device}"'
        return f"monkeypatch, {params}" if self._tf32(w) else params

    def upstream_has_device(self, w):
        return w.case.device != "cpu"  # the runtime's ops and values are on the CPU by default

    def upstream_doc_lines(self, w):
        """How to run it: the runtime under test is the adapter's, the fault gradfuzz's."""
        if w.fault:  # the runtime under test is the one imported: the adapter's
            return [f"Fails with GRADFUZZ_FAULT={w.fault}, passes without."]
        return ["Runs gradfuzz's torch runtime (PYTHONPATH=<gradfuzz>/adapter)."]

    def _quantizations(self, w):
        """(op index, whether it quantizes) where the runtime's op gets an OpQuantization."""
        from ..torch_backend.fp8 import OpQuantization

        return [
            op.index
            for op in w.case.catalog_ops
            if OpQuantization(op.name, op.attrs, w.recipe).active
        ]

    def upstream_recipe_lines(self, w):
        lines = []
        if self._tf32(w):
            lines.append('monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)')
        if self._quantizations(w) and w.recipe is not None:
            spec = dict(w.case.spec.get("recipe") or {})
            options = spec.pop("options", None)
            if options:
                lines.append(f"options = {literal(options)}")
                spec["options"] = Name("options")
            fields = [f"{k}={literal(v)}" for k, v in spec.items()]
            lines += wrap_call("recipe = parse_recipe(dict(", fields, "))")
        return lines

    def upstream_context(self, w):
        return None

    def upstream_representable(self, w, names):
        """FP8-representable inputs and weights (TE's tests' make_reference_and_test_tensors):
        under current scaling through the runtime's own quantize-dequantize at the tensor's
        scale, else E4M3 at scale 1, as TE's Float8Quantizer(scale=1) makes them."""
        if w.recipe is None or not names:
            return []
        targets = ", ".join(names)
        if self._current_scaling(w):  # the recipe's own scale: amax at E4M3's largest value
            # With use_power_2_scales the recipe's grid is the power-of-2 scale's: values
            # representable at the exact scale are not at that one.
            pow2 = ", pow2=True" if w.recipe.options.get("use_power_2_scales") else ""
            value = f'current_scaling_qdq(t, "E4M3"{pow2})'
            one = f'current_scaling_qdq({names[0]}, "E4M3"{pow2})'
        else:  # DelayedScaling's first scale is 1
            value = "t.to(torch.float8_e4m3fn).to(dtype)"
            one = f"{names[0]}.to(torch.float8_e4m3fn).to(dtype)"
        line = (
            f"{targets} = {one}"
            if len(names) == 1
            else f"{targets} = ({value} for t in ({targets}))"
        )
        short = f"{line}  # FP8-representable (TE's tests)"
        if len(short) <= 96:  # the test body's width
            return [short]
        scale = "its current scale" if self._current_scaling(w) else "scale 1"
        return [f"# FP8-representable (E4M3 at {scale}), as TE's tests make them", line]

    @staticmethod
    def _current_scaling(w):
        """Whether the values are made representable at the current scale: where the test
        holds backward_override's gradients to the dtype's tolerance (the dequantized
        operands must be the values themselves); elsewhere at scale 1 in plain torch, as the
        FP8 tolerance allows, so that a defect of the runtime's quantize-dequantize cannot
        reach the test's own values."""
        return (
            w.recipe is not None
            and w.recipe.name == "Float8CurrentScaling"
            and w.gradient
            and bool(w._backward_override())
        )

    def upstream_constructor(self, w, op):
        var = w.names.ops[op.index]
        if op.boundary:
            return [f"{var} = Boundary()  # a plain module: ends the fuser"]
        attrs = {
            k: int(v) if float(v).is_integer() else float(v)
            for k, v in sorted(op.attrs.items())
            if k in SHAPE_ATTRS or float(v) != CATALOG_DEFAULTS.get(k, 0.0)
        }
        style = f', output_style="{op.output_style}"' if op.output_style != "vector" else ""
        shape = list(op.input_shape)
        lines = wrap_call(
            f"{var} = BasicOp(",
            [literal(op.name), literal(attrs), str(shape), "dtype=dtype"]
            + (["device=device"] if self.upstream_has_device(w) else [])
            + ([style.lstrip(", ")] if style else []),
            ")",
        )
        if op.index in self._quantizations(w) and w.recipe is None:  # Sequential's recipe else
            lines.append(
                f"{var}.quantization = OpQuantization({literal(op.name)}, {var}.attrs, None)"
            )
        return lines

    def upstream_sequential(self, w):
        from ..torch_backend.runtime import FUSIONS

        ops = ", ".join(w.names.ops[op.index] for op in w.case.ops)
        fusions = tuple(f for f in w.path_fusions() if f in FUSIONS)
        options = [f"fusions={literal(fusions)}"] if fusions else []
        if w.recipe is not None and self._quantizations(w):
            options.append("recipe=recipe")
        return f"Sequential({', '.join([ops, *options])})"

    @staticmethod
    def upstream_param_attr(op, j):
        names = {"Bias": ("bias",), "LayerNorm": ("weight", "bias")}
        names["GroupedLinear"] = ("weight", "bias")
        return names.get(op.name, ("weight",))[j]

    def upstream_param_copies(self, w, op, var, values):
        """BasicOp's parameters start as plain tensors (no requires_grad): copied, then
        marked, one line each."""
        lines = []
        for j, value in enumerate(values):
            mark = ".requires_grad_()" if op.param_requires_grad[j] else ""
            lines.append(f"{var}.params[{j}].copy_({value}){mark}")
        return [], lines

    def upstream_param_grad(self, w, op, var, j):
        return f"{var}.params[{j}].grad"

    def upstream_delayed_state(self, w, i, role, group):
        """(history, scale) expressions of op i's delayed-scaling quantizer (fp8.py)."""
        q = f"{w.names.ops[i]}.quantization.linear[{group}].{role}"
        return f"{q}.history", f"{q}.scale"

    def upstream_weight(self, w, i, group):
        weight = f"{w.names.ops[i]}.params[0]"
        return f"{weight}[{group}]" if w.case.ops[i].name == "GroupedLinear" else weight

    def _updates(self, w):
        quantized = self._quantizations(w)
        return (
            bool(quantized)
            and (w.finding.call or w.is_state)
            and w.recipe is not None
            and w.recipe.name == "DelayedScaling"
        )

    def upstream_zero_grads(self, w):
        params = [
            f"{w.names.ops[op.index]}.params[{j}]"
            for op in w.case.catalog_ops
            for j in range(len(op.params))
        ]
        return [f"{p}.grad = None" for p in ["x_test", *params]]

    def upstream_after_forward(self, w):
        """DelayedScaling's forward update, where TE's autocast makes it (between calls)."""
        if not self._updates(w):
            return []
        ops = ", ".join(f"{w.names.ops[i]}.quantization" for i in self._quantizations(w))
        return [f"update_after_forward([{ops}])"]

    def upstream_after_backward(self, w):
        if not self._updates(w):
            return []
        ops = ", ".join(f"{w.names.ops[i]}.quantization" for i in self._quantizations(w))
        return [f"update_after_backward([{ops}])"]


def _splits(name, attrs):
    """Whether the torch emulation's op communicates or splits itself (torch_backend/parallel.py:
    needs_parallel_op; not imported here: writing a script runs none of the runtime)."""
    if name in catalog.COLLECTIVES:
        return True
    if name == "Linear":
        return float(attrs.get("tensor_parallel_mode", 0)) != 0
    return name == "Bias" and float(attrs.get("tensor_parallel", 0)) == 1.0
