"""The torch dialect: scripts that run a case on the torch backend's runtime (torch_runtime.py,
gradfuzz's own model of te.ops on PyTorch), the implementation under test there.

The compact, full and distributed forms embed the runtime, so the script stands alone; its
FP8 recipes are recipes.py's emulation, whose delayed-scaling updates the script makes where
TE's autocast would.
"""

from .. import catalog
from .dialect import Dialect
from .text import adapter_module_body

# run()'s recipe state per op, for the emulation's delayed-scaling updates.
QUANTIZATIONS = "[op.quantization for op in ops if getattr(op, 'quantization', None)]"


class TorchDialect(Dialect):
    name = "torch"
    implementation_words = "the runtime under test"
    sequential = "Sequential"
    output_to_caller_keyword = ""
    exposes_channel_gradients = True  # the runtime's fusers keep each channel's value
    fusions_at_construction = True  # Sequential(..., fusions=...): torch_runtime.FUSIONS
    validates_at_construction = True  # the runtime builds its fusers in Sequential()
    compares_plans = False  # one group per op whatever the call (torch_runtime: Fuser.plan)
    locked_helper = "locked_torch"
    compact_embedded_title = (
        "The runtime under test: gradfuzz's torch backend (gradfuzz_adapter/"
        "torch_runtime.py, catalog.py), embedded so that the script stands alone"
    )
    # A failed construction must leave its ops unlocked (torch_backend.py: left_locked): the
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
        w.picker.add("recipes.update_after_forward")
        w.picker.add("recipes.update_after_backward")
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
            w.picker.add(f"torch_runtime.{name}")
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
                w.picker.add("recipes.OpQuantization")
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
                "The torch backend's runtime (gradfuzz_adapter/torch_runtime.py)",
                adapter_module_body("torch_runtime"),
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
        body += w.call_then_bind()
        body += w.bindings()
        modules = ", ".join(f"op{op.index}" for op in case.ops)
        body.append(f"model = {self.sequential}({modules})")
        body += w.late_binds()
        body += [
            "x = on_device(INPUT, DTYPE, DEVICE, INPUT_REQUIRES_GRAD)",
            w.EXTRAS_LINE,
            f"ops = [{', '.join(refs)}]",
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
        """The runtime and its tensor parallelism (torch_parallel.py), embedded."""
        return [
            "# " + "-" * 88,
            "# The torch backend's runtime and its tensor parallelism",
            "# (gradfuzz_adapter/torch_runtime.py, torch_parallel.py)",
            adapter_module_body("torch_runtime"),
            adapter_module_body("torch_parallel"),
        ]

    def distributed_build_op(self, w, op, i):
        """build()'s lines making op `i` on a rank from its slices `mine`: torch_parallel's
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


def _splits(name, attrs):
    """Whether the torch emulation's op communicates or splits itself (torch_parallel.py:
    needs_parallel_op; not imported here: writing a script runs none of the runtime)."""
    if name in catalog.COLLECTIVES:
        return True
    if name == "Linear":
        return float(attrs.get("tensor_parallel_mode", 0)) != 0
    return name == "Bias" and float(attrs.get("tensor_parallel", 0)) == 1.0
