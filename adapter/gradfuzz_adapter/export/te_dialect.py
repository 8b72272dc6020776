"""The te dialect: scripts that run a case on TransformerEngine's te.ops.

TE is imported by the script, never here: the op table (te/op_table.py), the error table
(te/classify.py) and the embedded modules' text (te/embed.py) are TE-free. What the case
needs that TE lacks (the adapter's custom ops, Boundary, FusedResidual: te/extensions.py)
goes after the test, as TE users write it.
"""

from .. import catalog
from ..recipes import parse_recipe, te_kwargs
from ..te.classify import KINDS, RAISES
from ..te.embed import script_sections
from ..te.fusions import FUNCTION_OWNERS
from ..te.op_table import CONSTRUCTOR_DEFAULTS, CUSTOM_OPS, DEVICE, DTYPE, op_recipe, render_call
from .dialect import Dialect
from .text import literal, wrap_call, wrapped

# Catalog ops whose TE parameters the script copies by name (te/params.py: param_groups);
# the others' (GroupedLinear) go through the embedded te/params.py helpers.
TE_PARAMS = {"Linear": ["weight"], "Bias": ["bias"], "RMSNorm": ["weight"]}
TE_PARAMS["LayerNorm"] = ["weight", "bias"]

# GroupedLinear options under which TE keeps a parameter as one GroupedTensor, whose values
# live in its packed data: te/params.py's helpers read and write those.
PARAM_HELPER_ATTRS = ("single_grouped_weight", "single_grouped_bias")

# The adapter's fusion per name: its function and TE's list of that pass (fuser.py, as
# ops/__init__.py: register_*_fusion append to it).
RESIDUAL_FUSIONS = {
    "FusedResidual.forward": ("fuse_residual_forward", "forward_fusion_functions"),
    "FusedResidual.backward": ("fuse_residual_backward", "backward_fusion_functions"),
    "FusedResidual.joint": ("fuse_residual_joint", "forward_backward_fusion_functions"),
}

# The distributed form's fusion filter: a context manager around the rank's call.
DISTRIBUTED_ONLY_FUSIONS = '''
@contextlib.contextmanager
def only_fusions(names):
    """Only the fusions called `names` in TE's registry (fuser.py: OperationFuser's lists)."""
    saved = {a: getattr(OperationFuser, a) for a in dir(OperationFuser) if a.endswith("_functions")}
    name = lambda f: getattr(f, "gradfuzz_fusion_name", None) or f.__qualname__.split(".")[0]
    try:
        for attr, funcs in saved.items():
            setattr(OperationFuser, attr, [f for f in funcs if name(f) in names])
        yield
    finally:
        for attr, funcs in saved.items():
            setattr(OperationFuser, attr, funcs)
'''

# The distributed form: delayed weight gradients handed over after autograd (te/params.py).
DISTRIBUTED_FINISH = """        for op in ops:
            if hasattr(op, "need_backward_dw"):
                finish_weight_gradients(op)
"""


def _flag(op, attr):
    return float(op.attrs.get(attr, 0)) == 1.0


def _single_grouped(case):
    return any(_flag(op, k) for op in case.catalog_ops for k in PARAM_HELPER_ATTRS)


class TEDialect(Dialect):
    name = "te"
    implementation_words = "te.ops"
    sequential = "te.ops.Sequential"
    output_to_caller_keyword = "output_to_caller="
    exposes_channel_gradients = False  # TE exposes no channel gradient to a user
    fusions_at_construction = False  # OperationFuser's registry, narrowed per test
    validates_at_construction = False  # TE builds its fusers at the first forward
    documents_in_place_writes = True  # in_place ops write caller tensors (op.py docs)
    compares_plans = True
    locked_helper = "locked_te"
    compact_embedded_title = (
        "What the case's ops need that TE lacks, as TE users write it (gradfuzz_adapter/te)"
    )
    # A failed construction must leave its ops unlocked (te/backend.py: left_locked): TE
    # builds its fusers at the first forward, and one that fails there leaves _module_groups
    # unset. An error after that (a late bind into a locked op) is no failed construction.
    failed_construction = [
        '    model = state.get("model")  # TE\'s fusers: built at the first forward',
        '    if model is not None and getattr(model, "_module_groups", None) is None:',
    ]

    # -- every form

    def device(self, case):
        return "cuda"

    def imports(self):
        return [
            "import transformer_engine.pytorch as te",
            "from transformer_engine.pytorch.ops.fuser import OperationFuser",
        ]

    def recipe_imports(self, recipe):
        return [] if recipe is None else ["from transformer_engine.common import recipe"]

    def environment(self, case):
        lines = ['os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32']
        if _single_grouped(case):
            lines.append(
                'os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")'
                "  # GroupedLinear's single_grouped_*"
            )
        return lines

    def tf32_lines(self, case):
        return []  # NVIDIA_TF32_OVERRIDE covers cuBLAS, and TE's cuBLASLt GEMMs

    @staticmethod
    def constructor(op):
        """(callee, args, kwargs, comment) of the te.ops call that builds `op`; an output
        style TE cannot have is built with tuples, the comment says so (the adapter answers
        such a case "unsupported"; the script still shows it)."""
        try:
            return (*op_recipe(op.name, op.attrs, op.input_shape, op.output_style), None)
        except NotImplementedError as e:
            return (
                *op_recipe(op.name, op.attrs, op.input_shape, "vector"),
                f"{e}: built with tuples",
            )

    # -- the compact form

    def recipe_lines(self, recipe):
        if recipe is None:
            return []
        kwargs = ", ".join(f"{k}={v!r}" for k, v in te_kwargs(recipe).items())
        return [
            f"RECIPE = recipe.{recipe.name}(fp8_format=recipe.Format.{recipe.fp8_format}"
            + (f", {kwargs}" if kwargs else "")
            + ")"
        ]

    def recipe_contexts(self, recipe):
        return [] if recipe is None else ["te.autocast(recipe=RECIPE)"]

    def after_forward(self, w):
        return []  # TE's autocast updates the delayed-scaling state itself

    def after_backward(self, w):
        return []

    @staticmethod
    def plain_params(op):
        """Whether TE's parameters of `op` are plain tensors the script copies by name."""
        if any(_flag(op, k) for k in PARAM_HELPER_ATTRS):
            return False
        return op.name in TE_PARAMS or op.name == "GroupedLinear"

    def param_helper_ops(self, case):
        """Ops whose parameters go through te/params.py's helpers: TE's grouped parameters
        (single_grouped_*), main_grad buffers, delayed weight gradients."""
        return {
            op.index for op in case.catalog_ops if op.param_shapes and not self.plain_params(op)
        }

    @staticmethod
    def param_tensors(op, j, var):
        """TE's tensors of model parameter j of `op` (a plain-params op): one, or one per
        group (GroupedLinear's weight0.. / bias0.., grouped_linear.py)."""
        if op.name == "GroupedLinear":
            groups = catalog.attr_int(op.name, op.attrs, "groups", 2, 1)
            return [f"{var}.{('weight', 'bias')[j]}{g}" for g in range(groups)]
        return [f"{var}.{TE_PARAMS[op.name][j]}"]

    def compact_build(self, w):
        """build(): the ops with te.ops as a user writes them, parameters copied by name
        (GroupedLinear's weight0..; main_grad attached for accumulate_into_main_grad)."""
        case = w.case
        lines = w.build_head()
        copies, after = [], []
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                w.picker.add("te.extensions.Boundary")
                lines.append(f"    {var} = Boundary()  # a plain module: ends the fuser")
                continue
            callee, args, kwargs, comment = self.constructor(op)
            prefix = f"    # {comment}\n" if comment else ""
            if not callee.startswith("te."):
                w.picker.add(f"te.extensions.{callee}")
            lines.append(f"{prefix}    {var} = {render_call(callee, args, kwargs)}")
            if not op.param_shapes:
                continue
            values = [w.param_value(op, j) for j in range(len(op.params))]
            if op.index in w.helper_ops:
                for helper in ("copy_param_values", "set_param_requires_grad", "attach_main_grads"):
                    w.picker.add(f"te.params.{helper}")
                after += [
                    f'    copy_param_values({var}, "{op.name}", '
                    f"[v.to(DEVICE, DTYPE) for v in ({', '.join(values)},)])",
                    f'    set_param_requires_grad({var}, "{op.name}", {op.param_requires_grad!r})',
                    f'    attach_main_grads({var}, "{op.name}")',
                ]
                continue
            for j, value in enumerate(values):
                tensors = self.param_tensors(op, j, var)
                for g, t in enumerate(tensors):
                    index = f"[{g}]" if op.name == "GroupedLinear" else ""
                    copies.append(f"        {t}.copy_({value}{index})")
                    if not op.param_requires_grad[j]:
                        after.append(f"    {t}.requires_grad_(False)")
                    if j == 0 and _flag(op, "accumulate_into_main_grad"):
                        # What a Megatron-LM user attaches before backward (te/params.py:
                        # attach_main_grads): TE's wgrad GEMM accumulates into it.
                        after.append(
                            f"    {t}.main_grad = torch.zeros({t}.shape, dtype=torch.float32, "
                            "device=DEVICE)"
                        )
        if copies:
            lines += ["    with torch.no_grad():", *copies]
        lines += after
        lines += w.build_tail()
        # The adapter's FusedResidual, registered in the passes the paths name (as
        # te/extensions.py: register_fusions registers all three), where it can fire.
        named = {f for path in w.paths for f in path.get("fusions") or []}
        own = {}
        for fusion, (function, attr) in RESIDUAL_FUSIONS.items():
            if fusion in named and self.residual_window(case):
                w.picker.add(f"te.extensions.{function}")
                own[attr] = f"[{function}]"
        if own:
            entries = ", ".join(f'"{attr}": {functions}' for attr, functions in own.items())
            w.own_fusions = True
            w.tail = [
                "# The adapter's FusedResidual, added to TE's fusion lists for each test by",
                "# only_fusions (TE's register functions would add it for the whole process)",
                *wrapped("OWN_FUSIONS = {", [entries], "}"),
            ]
        return lines

    @staticmethod
    def residual_window(case):
        """Whether a fuser holds MakeExtraOutput, an op without extra tensors, AddExtraInput
        in a row: the only place FusedResidual can fire (te/extensions.py: residual_pattern,
        which also needs the two bound to one channel; other fusions only ever replace ops
        by fused ops, which it skips). Without one, registering it would change nothing."""
        ops = case.ops
        return any(
            a.name == "MakeExtraOutput"
            and c.name == "AddExtraInput"
            and a.fuser == b.fuser == c.fuser
            and not (b.extra_input_kinds or b.extra_output_kinds)
            for a, b, c in zip(ops, ops[1:], ops[2:])
            if not b.boundary
        )

    def only_fusions_template(self, w, text):
        """only_fusions names a fusion function after its class, or (grouped_mlp.py's
        module-level ones) after their owner where a path names one (te/fusions.py:
        fusion_name); the adapter's own fusions join TE's lists where the case needs them."""
        if w.own_fusions:
            text = text.replace("OWN.get(", "OWN_FUSIONS.get(")
        else:
            text = text.replace(" + OWN.get(attr, [])", "")
        named = {f for path in w.paths for f in path.get("fusions") or []}
        owners = {k: v for k, v in FUNCTION_OWNERS.items() if v in named}
        if not owners:
            return text.replace("OWNERS.get(parts[-1], parts[-1])", "parts[-1]")
        line = f"    OWNERS = {owners!r}  # fusion functions outside a class"
        head, _, rest = text.partition("    def name(f):")
        return f"{head}{line}\n    def name(f):{rest}"

    def run_param_leaves(self, w, op, var):
        """run()'s (leaves, lines after autograd, whether a leaf is a list of groups) for
        `op`'s parameters: TE's tensors by name, or te/params.py's helpers; a weight gradient
        read where TE puts it outside autograd's result."""
        if op.index in w.helper_ops:
            for helper in ("param_leaves", "model_param_grads", "finish_weight_gradients"):
                w.picker.add(f"te.params.{helper}")
            leaves = [
                f'*[(f"op{op.index}.{{k}}", t) for k, t in '
                f'enumerate(param_leaves({var}, "{op.name}"))]'
            ]
            finish = [
                f"finish_weight_gradients({var})",
                f'by_id = {{id(t): got.pop(f"op{op.index}.{{k}}", None) for k, t in '
                f'enumerate(param_leaves({var}, "{op.name}"))}}',
                f'for j, g in enumerate(model_param_grads({var}, "{op.name}", by_id)):',
                f'    got[f"grad_param[{op.index}].{op.name}[{{j}}]"] = g',
            ]
            return leaves, finish, False
        leaves, groups = [], False
        for j in range(len(op.params)):
            tensors = self.param_tensors(op, j, var)
            groups |= len(tensors) > 1 or op.name == "GroupedLinear"
            leaf = f"[{', '.join(tensors)}]" if op.name == "GroupedLinear" else tensors[0]
            leaves.append(f'("grad_param[{op.index}].{op.name}[{j}]", {leaf})')
        finish = []
        if op.params and op.param_requires_grad[0]:
            finish = self.weight_gradient(op, var)
        return leaves, finish, groups

    def weight_gradient(self, op, var):
        """run()'s lines that read a te op's weight gradient where TE puts it outside
        autograd's result (te/params.py: model_param_grads): in main_grad with
        accumulate_into_main_grad, in .grad after backward_dw with delay_wgrad_compute."""
        main, delay = (_flag(op, k) for k in ("accumulate_into_main_grad", "delay_wgrad_compute"))
        if not (main or delay):
            return []
        lines = [f"if {var}.need_backward_dw():", f"    {var}.backward_dw()"] if delay else []
        attr = "main_grad" if main else "grad"
        tensors = [f"{t}.{attr}" for t in self.param_tensors(op, 0, var)]
        value = f"torch.stack([{', '.join(tensors)}])" if op.name == "GroupedLinear" else tensors[0]
        return lines + [f'got["grad_param[{op.index}].{op.name}[0]"] = {value}  # not autograd\'s']

    def clears_gradients(self, w):
        """Whether a repeat call must first clear gradients TE accumulated (driver.py:
        before_repeat_call): main_grad buffers, .grad of delayed weight gradients."""
        return bool(w.helper_ops) or any(
            _flag(op, k)
            for op in w.case.catalog_ops
            for k in ("accumulate_into_main_grad", "delay_wgrad_compute")
        )

    def compact_raises(self, w, kind):
        """The error test's body: TE raises its exception for the kind (te/classify.py:
        RAISES), with its message where one is known."""
        types_, pattern = RAISES.get(kind, (("Exception",), None))
        raises = "(" + ", ".join(types_) + ",)"
        match = f", match={pattern!r}" if pattern else ""
        lines = [
            f'    """gradfuzz\'s reference rejects this configuration ({kind}); TE must too,',
            '    and a failed construction must leave every op as it was (unlocked)."""',
            "    only_fusions(monkeypatch, fusions)",
            "    state = {}",
            f"    with pytest.raises({raises}{match}){' as raised' if not pattern else ''}:",
            "        run(*build(state))",
        ]
        if not pattern:
            # Replay takes any message of these types but one it reads as another kind
            # (te/classify.py: KINDS, in order; a message it cannot read agrees with any).
            w.picker.library.add("re")
            others = "|".join(p for p, k in KINDS if k != kind)
            w.tail_constants.append(f"OTHER_KINDS = {others!r}  # te/classify.py: KINDS")
            lines.append("    assert not re.search(OTHER_KINDS, str(raised.value)), raised.value")
        return lines

    # -- the full form

    full_docstring_note = (
        "Written for TransformerEngine 2.20.2 te.ops (transformer_engine.pytorch.ops); "
        "needs a CUDA device."
    )

    def full_environment(self, case):
        lines = [
            "import os",
            "",
            "# fp32 GEMMs in full fp32: TE's cuBLASLt GEMMs do not read torch's allow_tf32 flags.",
            'os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")',
        ]
        if _single_grouped(case):
            lines += [
                "# GroupedLinear honours single_grouped_weight/bias only with this set",
                "# (transformer_engine/pytorch/utils.py: "
                "resolve_grouped_linear_single_param_flags).",
                'os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")',
            ]
        return lines

    def full_sections(self):
        """[(title or None, source)] embedded after the comparison helpers (te/embed.py)."""
        return script_sections()

    def full_build(self, w):
        """run_case(fusions): the case with te.ops as a user writes it, run with only the
        fusions named `fusions` registered."""
        case = w.case
        body = []
        refs = []
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                body.append(f"{var} = Boundary()  # a plain module: ends the fuser")
                refs.append("None")
                continue
            callee, args, kwargs, comment = self.constructor(op)
            if comment:
                body.append(f"# {comment}")
            body.append(f"{var} = {render_call(callee, args, kwargs)}")
            if op.param_shapes:
                body.append(
                    f'copy_param_values({var}, "{op.name}", '
                    f"[on_device(p, DTYPE, DEVICE) for p in PARAMS[{op.index}]])"
                )
                body.append(
                    f'set_param_requires_grad({var}, "{op.name}", PARAM_REQUIRES_GRAD[{op.index}])'
                )
                if float(op.attrs.get("accumulate_into_main_grad", 0)) == 1.0:
                    body.append(f'attach_main_grads({var}, "{op.name}")')
            refs.append(f'({var}, "{op.name}")')
        body += w.assembly(refs)
        body += [
            "",
            "def after_backward():",
            "    for entry in ops:",
            "        if entry is not None:",
            "            finish_weight_gradients(entry[0])",
            "",
            "return forward_backward(",
            "    model, x, extras, COTANGENTS, ops, param_leaves, model_param_grads, "
            "after_backward",
            ")",
        ]
        return (
            "def run_case(fusions):\n"
            '    """Builds the case with te.ops as a user writes it and runs it with only the\n'
            '    fusions named `fusions` registered; returns its outputs and gradients."""\n'
            "    with only_fusions(OperationFuser, fusions):\n"
            f"{w.indented(body, 8)}\n"
        )

    def full_raises(self, kind):
        types_, pattern = RAISES.get(kind, (("Exception",), None))
        raises = "(" + ", ".join(types_) + ",)"
        match = f", match={pattern!r}" if pattern else ""
        return (
            f'    """gradfuzz\'s reference rejects this configuration ({kind}); '
            'TE must too."""\n'
            f"    with pytest.raises({raises}{match}):\n"
            "        run_case(fusions)\n"
        )

    # -- the distributed form

    def distributed_sections(self):
        """What a distributed script embeds after the catalog: te/embed.py's modules and the
        rank's fusion filter."""
        lines = []
        for title, source in script_sections():
            if title:
                lines += ["# " + "-" * 88, "# " + title]
            lines.append(source)
        lines.append(DISTRIBUTED_ONLY_FUSIONS)
        return lines

    def distributed_build_op(self, w, op, i):
        """build()'s lines making op `i` on a rank from its slices `mine`: the te.ops call
        with the unsharded sizes where TE splits the op itself (op_table: splits_itself)."""
        callee, args, kwargs = op_recipe(
            op.name, op.attrs, w.local_shape(i), op.output_style, w.global_input_shape(i)
        )
        call = render_call(callee, args, kwargs).replace(repr(DEVICE), "device")
        call = call.replace(repr(DTYPE), "DTYPE")
        return [
            f"    op = {call}",
            f"    copy_param_values(op, {op.name!r}, [p.to(device, DTYPE) for p in mine])",
            f"    set_param_requires_grad(op, {op.name!r}, PARAM_REQUIRES_GRAD[{i}])",
            f"    attach_main_grads(op, {op.name!r})",
        ]

    def distributed_test_fields(self):
        """The test template's per-dialect parts (distributed.py: TEST)."""
        return {
            "init": "",
            "sequential": self.sequential,
            "leaves": "param_leaves(op, name)",
            "finish": DISTRIBUTED_FINISH,
        }

    # -- the upstream form (upstream.py: UpstreamWriter `w`)

    upstream_tf32_note = "dtype_tols(torch.float16): cuBLASLt runs float32 GEMMs in TF32"

    def upstream_float32_gemm_tols(self):
        return (1e-3, 1e-5)  # dtype_tols(torch.float16)

    def upstream_check(self, w):
        """What te.ops' public API cannot show: ops TE lacks, gradfuzz's own fusion, TE's
        grouped parameters (they need NVTE_GROUPED_LINEAR_SINGLE_PARAM at import)."""
        custom = sorted({op.name for op in w.case.catalog_ops if op.name in CUSTOM_OPS})
        if custom:
            raise ValueError(
                f"export --upstream --backend te: {', '.join(custom)} are gradfuzz's ops, not "
                "TE's; shrink the case without them or export it with --python"
            )
        fusions = w.path_fusions()
        if any(f.startswith("FusedResidual") for f in fusions):
            raise ValueError(
                "export --upstream --backend te: FusedResidual is gradfuzz's fusion, not TE's"
            )
        if any(_flag(op, k) for op in w.case.catalog_ops for k in PARAM_HELPER_ATTRS):
            raise ValueError(
                "export --upstream --backend te: GroupedLinear's single grouped parameters "
                "need NVTE_GROUPED_LINEAR_SINGLE_PARAM at import; export it with --python"
            )

    def upstream_runnable_reason(self):
        import importlib.util

        import torch

        try:
            installed = importlib.util.find_spec("transformer_engine") is not None
        except ValueError:  # imported already, without a spec (tests/te_stub.py's)
            installed = True
        if not installed:
            return "TransformerEngine is not installed here"
        if not torch.cuda.is_available():
            return "no CUDA device here"
        return None

    def upstream_environment(self, fault):
        return {}

    def upstream_imports(self, w):
        lines = ["import os", ""] if w.values_file else []
        lines += ["import torch", "import transformer_engine.pytorch as te"]
        if w.recipe is not None:
            lines.append(f"from transformer_engine.common.recipe import {w.recipe.name}, Format")
        return lines

    def upstream_parameters(self, w):
        return f'dtype=torch.{w.case.dtype_name}, device="cuda"'

    def upstream_doc_lines(self, w):
        return []  # te.ops as installed

    def upstream_recipe_lines(self, w):
        """The recipe as TE's tests make one: its class, the format, the options gradfuzz's
        case sets to other than TE's defaults."""
        if w.recipe is None:
            return []
        defaults = te_kwargs(parse_recipe({"name": w.recipe.name}))
        kwargs = [f"fp8_format=Format.{w.recipe.fp8_format}"] + [
            f"{k}={literal(v)}" for k, v in te_kwargs(w.recipe).items() if defaults.get(k) != v
        ]
        return [f"recipe = {w.recipe.name}({', '.join(kwargs)})"]

    def upstream_context(self, w):
        return None if w.recipe is None else "te.autocast(recipe=recipe)"

    def upstream_representable(self, w, names):
        """FP8-representable inputs and weights, as TE's make_reference_and_test_tensors
        makes them: quantized and dequantized by the recipe's quantizer."""
        if w.recipe is None or not names:
            return []
        targets = ", ".join(names)
        if w.recipe.name == "DelayedScaling":
            # Float8Quantizer at the recipe's first scale, 1: E4M3's own rounding.
            value = "t.to(torch.float8_e4m3fn).to(dtype)"
            return [
                "# FP8-representable (E4M3 at DelayedScaling's first scale, 1), as TE's tests "
                "make them",
                f"{targets} = {names[0]}.to(torch.float8_e4m3fn).to(dtype)"
                if len(names) == 1
                else f"{targets} = ({value} for t in ({targets}))",
            ]
        fp8 = "te.DType.kFloat8E4M3"
        # The recipe's scales: power-of-2 ones where it asks for them (its quantizers'
        # force_pow_2_scales: off by default for current scaling, on for blocks).
        options = w.recipe.options
        pow2 = ", force_pow_2_scales=True" if options.get("use_power_2_scales") else ""
        f32 = ", force_pow_2_scales=False" if options.get("use_f32_scales") else ""
        block = f"te.Float8BlockQuantizer({fp8}, rowwise=True, columnwise=True{f32})"
        quantizer = {
            "Float8CurrentScaling": f"te.Float8CurrentScalingQuantizer({fp8}, device=device{pow2})",
            "Float8BlockScaling": block,
        }.get(w.recipe.name)
        if quantizer is None:
            return []
        targets = ", ".join(names)
        value = "quantizer(t.to(device)).dequantize().cpu()"
        head, _, args = quantizer.partition("(")
        return [
            "# FP8-representable, as TE's make_reference_and_test_tensors makes them",
            *wrap_call(f"quantizer = {head}(", args[:-1].split(", "), ")"),
            f"{targets} = ({value} for t in ({targets}))"
            if len(names) > 1
            else f"{targets} = quantizer({targets}.to(device)).dequantize().cpu()",
        ]

    def upstream_constructor(self, w, op):
        var = w.names.ops[op.index]
        if op.boundary:
            return [f"{var} = torch.nn.Identity()  # a plain module: ends the fuser"]
        callee, args, kwargs = op_recipe(op.name, op.attrs, op.input_shape, op.output_style)
        parts = [repr(a) for a in args]
        for key, value in kwargs.items():
            if key in CONSTRUCTOR_DEFAULTS and CONSTRUCTOR_DEFAULTS[key] == value:
                continue
            text = (
                {DEVICE: "device", DTYPE: "dtype"}.get(value) if value in (DEVICE, DTYPE) else None
            )
            parts.append(f"{key}={text or repr(value)}")
        return [f"{var} = {callee}({', '.join(parts)})"]

    def upstream_sequential(self, w):
        return f"te.ops.Sequential({', '.join(w.names.ops[op.index] for op in w.case.ops)})"

    @staticmethod
    def upstream_param_attr(op, j):
        return TE_PARAMS.get(op.name, ["weight", "bias"])[j]

    def upstream_param_copies(self, w, op, var, values):
        copies, after = [], []
        for j, value in enumerate(values):
            tensors = self.param_tensors(op, j, var)
            for g, t in enumerate(tensors):
                copies.append(f"{t}.copy_({value}{f'[{g}]' if op.name == 'GroupedLinear' else ''})")
                if not op.param_requires_grad[j]:
                    after.append(f"{t}.requires_grad_(False)")
                if j == 0 and _flag(op, "accumulate_into_main_grad"):
                    after.append(f"{t}.main_grad = torch.zeros_like({t}, dtype=torch.float32)")
        return copies, after

    def upstream_param_grad(self, w, op, var, j):
        attr = "main_grad" if j == 0 and _flag(op, "accumulate_into_main_grad") else "grad"
        tensors = [f"{t}.{attr}" for t in self.param_tensors(op, j, var)]
        if op.name == "GroupedLinear":
            return f"torch.stack([{', '.join(tensors)}])"
        return tensors[0]

    def upstream_delayed_state(self, w, i, role, group):
        """(history, scale) expressions of op i's delayed-scaling quantizer: op.py's
        _fp8_metas, forward quantizers (input, weight) per group, backward grad_output."""
        mode, key = (
            ("backward", "scaling_bwd") if role == "grad_output" else ("forward", "scaling_fwd")
        )
        k = group if role == "grad_output" else 2 * group + (role == "weight")
        meta = f'{w.names.ops[i]}._fp8_metas["{mode}"]["{key}"]'
        return f"{meta}.amax_history[:, {k}]", f"{meta}.scale[{k}]"

    def upstream_weight(self, w, i, group):
        tensors = self.param_tensors(w.case.ops[i], 0, w.names.ops[i])
        return tensors[group] if len(tensors) > 1 else tensors[0]

    def upstream_after_forward(self, w):
        return []  # te.autocast updates the recipe's state

    def upstream_zero_grads(self, w):
        return ["model.zero_grad()", "x_test.grad = None"]

    def upstream_after_backward(self, w):
        """TE's delayed weight gradients, computed where a training loop asks for them."""
        return [
            f"{w.names.ops[op.index]}.backward_dw()  # delay_wgrad_compute"
            for op in w.case.catalog_ops
            if _flag(op, "delay_wgrad_compute")
        ]
