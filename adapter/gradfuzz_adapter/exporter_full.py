"""The full form of an exported script (`"full": true` in the export request; exporter.py
writes the compact one): everything the case could need, embedded whole.

The script imports torch and pytest (and, for te, transformer_engine.pytorch) and nothing
of gradfuzz: it embeds the source of what it needs (the catalog functions and the float64
reference, the comparison helpers, and for te the adapter's custom ops, FusedResidual and
parameter helpers; for torch the torch backend's runtime). The case is built as a user
writes it: explicit constructor calls, parameter copies, the standalone calls, bindings and
the Sequential, with the drawn values inlined (script_values.py). One
test per path (pytest.mark.parametrize over the paths' fusion lists) compares every output
and gradient with the float64 reference under the request's tolerance, or, when the case
expects an error, asserts that building and running it raises that error.

Generating a te script does not import TE: te_backend.py imports it only in TEBackend().
"""

import ast
import inspect
import pprint
import textwrap

from . import catalog, errors, reference, script_support, torch_runtime
from . import te as te_backend
from .script_values import ScriptValues


def _module_body(module):
    """A module's source without its docstring and its top-level imports."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    lines = source.splitlines()
    drop = set()
    for i, node in enumerate(tree.body):
        is_docstring = (
            i == 0
            and isinstance(node, ast.Expr)
            and isinstance(getattr(node, "value", None), ast.Constant)
        )
        if is_docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(range(node.lineno - 1, node.end_lineno))
    kept = [line for n, line in enumerate(lines) if n not in drop]
    return "\n".join(kept).strip() + "\n"


def _section(title):
    bar = "# " + "-" * 88
    return f"\n\n{bar}\n# {title}\n{bar}\n\n"


def _docstring(case, backend, paths, expect, case_file):
    ops = " -> ".join(op.name for op in case.ops)
    file_text = case_file or "<case file>"
    lines = [
        f"gradfuzz case {file_text}, exported for the {backend} backend.",
        "",
        f"Reproduce with gradfuzz: gradfuzz replay {file_text} --backend {backend}",
        "Run this file:            pytest -q <this file>",
        "",
        f"Ops: {ops}",
        f"dtype {case.dtype_name}, input shape {case.spec.get('input_shape')}, "
        f"seed {case.spec.get('seed')}",
        "Paths: " + "; ".join(f"{p['name']} = fusions {p.get('fusions') or []}" for p in paths),
    ]
    if expect.get("kind") == "error":
        lines.append(
            f"Expected: an error of kind '{expect.get('error_kind')}' (gradfuzz's reference "
            "rejects this configuration); the test passes when building and running the case "
            "raises it."
        )
    else:
        lines.append(
            "Expected: every output and gradient (input, parameters, public extra inputs) "
            "within tolerance of a float64 plain-PyTorch reference on the same values, and no "
            "caller-owned tensor changed. The test fails on the defect and passes once it is "
            "fixed."
        )
    if backend == "te":
        lines += [
            "",
            "Written for TransformerEngine 2.20.2 te.ops (transformer_engine.pytorch.ops); "
            "needs a CUDA device.",
        ]
    return '"""' + "\n".join(lines) + '\n"""\n'


def _reference_ops_literal(case):
    from .case import reference_ops

    return pprint.pformat(reference_ops(case), width=96, sort_dicts=False)


EXTRAS_LINE = (
    "extras = [on_device(e, DTYPE, DEVICE, rg) "
    "for e, rg in zip(EXTRA_INPUTS, EXTRA_INPUT_REQUIRES_GRAD)]"
)


def _build_te(case):
    """Body of run_case() for te.ops."""
    body = []
    refs = []
    for op in case.ops:
        var = f"op{op.index}"
        if op.boundary:
            body.append(f"{var} = Boundary()  # a plain module: ends the fuser")
            refs.append("None")
            continue
        try:
            recipe = te_backend.op_recipe(op.name, op.attrs, op.input_shape, op.output_style)
        except NotImplementedError as e:
            # The adapter answers such a case "unsupported"; the script still shows it.
            body.append(f"# {e}: built with tuples")
            recipe = te_backend.op_recipe(op.name, op.attrs, op.input_shape, "vector")
        body.append(f"{var} = {te_backend.render_call(*recipe)}")
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
    body += _call_then_bind(case)
    body += _bindings(case, te=True)
    modules = ", ".join(f"op{op.index}" for op in case.ops)
    body.append(f"model = te.ops.Sequential({modules})")
    body += _late_binds(case)
    body += [
        "x = on_device(INPUT, DTYPE, DEVICE, INPUT_REQUIRES_GRAD)",
        EXTRAS_LINE,
        f"ops = [{', '.join(refs)}]",
        "",
        "def after_backward():",
        "    for entry in ops:",
        "        if entry is not None:",
        "            finish_weight_gradients(entry[0])",
        "",
        "return forward_backward(",
        "    model, x, extras, COTANGENTS, ops, param_leaves, model_param_grads, after_backward",
        ")",
    ]
    inner = textwrap.indent("\n".join(body), " " * 8)
    return (
        "def run_case(fusions):\n"
        '    """Builds the case with te.ops as a user writes it and runs it with only the\n'
        '    fusions named `fusions` registered; returns its outputs and gradients."""\n'
        "    with only_fusions(OperationFuser, fusions):\n"
        f"{inner}\n"
    )


def _build_torch(case):
    """Body of run_case() for the torch backend's runtime (no fusions: `fusions` unused)."""
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
    body += _call_then_bind(case)
    body += _bindings(case, te=False)
    modules = ", ".join(f"op{op.index}" for op in case.ops)
    body.append(f"model = Sequential({modules})")
    body += _late_binds(case)
    body += [
        "x = on_device(INPUT, DTYPE, DEVICE, INPUT_REQUIRES_GRAD)",
        EXTRAS_LINE,
        f"ops = [{', '.join(refs)}]",
        "return forward_backward(",
        "    model, x, extras, COTANGENTS, ops, torch_param_leaves, torch_param_grads",
        ")",
    ]
    inner = textwrap.indent("\n".join(body), " " * 4)
    return (
        "def torch_param_leaves(op, name):\n"
        "    return [p for p in op.params if p.requires_grad]\n\n\n"
        "def torch_param_grads(op, name, grads):\n"
        "    return [grads.get(id(p)) if p.requires_grad else None for p in op.params]\n\n\n"
        "def run_case(fusions):\n"
        '    """Builds the case with the torch runtime as a user writes it and runs it (the torch\n'
        '    backend has no fusions); returns its outputs and gradients."""\n'
        f"{inner}\n"
    )


def _call_then_bind(case):
    out = []
    for k, (index, grad_mode) in enumerate(case.call_then_bind):
        out += [
            f"# op {index} called on its own (grad mode {'on' if grad_mode else 'off'}), "
            "before any binding",
            f"with torch.set_grad_enabled({grad_mode}):",
            f"    call_x, call_extras = CALL_INPUTS[{k}]",
            f"    op{index}(",
            f"        on_device(call_x, DTYPE, DEVICE, {grad_mode}),",
            f"        *[on_device(e, DTYPE, DEVICE, {grad_mode}) for e in call_extras],",
            "    )",
        ]
    return out


def _bindings(case, te):
    out = []
    for op in case.catalog_ops:
        for slot, channel in op.bound_inputs:
            out.append(f"op{op.index}.set_extra_input_channel({slot}, {channel!r})")
        for slot, channel, to_caller in op.bound_outputs:
            keyword = "output_to_caller=" if te else ""
            out.append(
                f"op{op.index}.set_extra_output_channel({slot}, {channel!r}, {keyword}{to_caller})"
            )
    return out


def _late_binds(case):
    out = []
    for index, slot, channel in case.late_binds:
        out.append(
            f"op{index}.set_extra_input_channel({slot}, {channel!r})  # after the Sequential"
        )
    return out


def full_script(case, *, backend, paths, expect, case_file="", values=None):
    """The full pytest file for `case` on `backend` ("te" or "torch"). `values`: how the
    case's tensors are spelled (a ScriptValues; by default all in the script)."""
    values = values or ScriptValues(case)
    if backend not in ("te", "torch"):
        raise ValueError(f"export writes te or torch scripts, got '{backend}'")
    tolerance = dict((expect or {}).get("tolerance") or {})
    for key, default in (
        ("atol", 1e-7),
        ("rtol", 1e-7),
        ("baseline_factor", 0.0),
        ("baseline_cap", 0.0),
    ):
        tolerance.setdefault(key, default)
    expects_error = (expect or {}).get("kind") == "error"
    paths = paths or [{"name": "fused", "fusions": list(case.spec.get("fusions") or [])}]

    parts = [_docstring(case, backend, paths, expect or {}, case_file)]
    header = []
    if backend == "te":
        header += [
            "import os",
            "",
            "# fp32 GEMMs in full fp32: TE's cuBLASLt GEMMs do not read torch's allow_tf32 flags.",
            'os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")',
        ]
        if any(
            float(op.attrs.get(k, 0)) == 1.0
            for op in case.catalog_ops
            for k in ("single_grouped_weight", "single_grouped_bias")
        ):
            header += [
                "# GroupedLinear honours single_grouped_weight/bias only with this set",
                "# (transformer_engine/pytorch/utils.py: "
                "resolve_grouped_linear_single_param_flags).",
                'os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")',
            ]
    header += [
        "",
        "import base64  # noqa: E402",
        "import contextlib  # noqa: E402",
        "import math  # noqa: E402",
        "import os  # noqa: E402",
        "import types  # noqa: E402",
        "import zlib  # noqa: E402",
        "",
        "import pytest  # noqa: E402",
        "import torch  # noqa: E402",
        "import torch.nn.functional as F  # noqa: E402",
    ]
    if backend == "te":
        header += [
            "import transformer_engine.pytorch as te  # noqa: E402",
            "from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402",
        ]
    header += [
        "",
        "torch.backends.cuda.matmul.allow_tf32 = False",
        "torch.backends.cudnn.allow_tf32 = False",
    ]
    parts.append("\n".join(header) + "\n")

    parts.append(_section("gradfuzz's error kinds (gradfuzz_adapter/errors.py)"))
    parts.append(_module_body(errors))
    parts.append(_section("The op catalog in plain PyTorch (gradfuzz_adapter/catalog.py)"))
    parts.append(_module_body(catalog))
    parts.append(_section("The float64 reference (gradfuzz_adapter/reference.py)"))
    parts.append(_module_body(reference))
    parts.append(_section("Values and comparison (gradfuzz_adapter/script_support.py)"))
    parts.append(_module_body(script_support))
    if backend == "te":
        for title, source in te_backend.script_sections():  # te/embed.py
            parts.append(_section(title) if title else "\n\n")
            parts.append(source)
    else:
        parts.append(_section("The torch backend's runtime (gradfuzz_adapter/torch_runtime.py)"))
        parts.append(_module_body(torch_runtime))

    device = "cuda" if backend == "te" else case.device
    one = values.expr

    def many(ts, indent="    "):
        if not ts:
            return "[]"
        return "[\n" + "".join(f"{indent}{one(t)},\n" for t in ts) + "]"

    lines = values.prelude() + [
        f"DTYPE = torch.{str(case.dtype).replace('torch.', '')}",
        f'DEVICE = torch.device("{device}")',
        f"INPUT = {one(case.input)}",
        f"INPUT_REQUIRES_GRAD = {case.input_requires_grad}",
        "PARAMS = [\n" + "".join(f"    {many(op.params, ' ' * 8)},\n" for op in case.ops) + "]",
        f"PARAM_REQUIRES_GRAD = {[op.param_requires_grad for op in case.ops]!r}",
        f"EXTRA_INPUTS = {many(case.extra_inputs)}",
        f"EXTRA_INPUT_REQUIRES_GRAD = {case.extra_input_requires_grad!r}",
        f"COTANGENTS = {many(case.cotangents)}",
        "CALL_INPUTS = [\n"
        + "".join(f"    ({one(x)}, {many(es, ' ' * 8)}),\n" for x, es in case.call_inputs)
        + "]",
        f"OPS = {_reference_ops_literal(case)}",
        f"TOLERANCE = {tolerance!r}",
    ]
    parts.append(_section("The case's values, rounded to the case dtype (script_values.py)"))
    if values.notes:
        parts.append("".join(f"# NOTE: {note}\n" for note in values.notes))
    parts.append("\n".join(lines) + "\n")

    parts.append(_section("The case, built as a user writes it"))
    parts.append(_build_te(case) if backend == "te" else _build_torch(case))

    param_list = ",\n".join(
        f"    pytest.param({list(p.get('fusions') or [])!r}, id={p['name']!r})" for p in paths
    )
    parts.append(_section("The tests: one per path"))
    parts.append(f"PATHS = [\n{param_list},\n]\n")
    if expects_error:
        kind = expect.get("error_kind", "unrecognized")
        if backend == "te":
            types_, pattern = te_backend.RAISES.get(kind, (("Exception",), None))
            raises = "(" + ", ".join(types_) + ",)"
            match = f", match={pattern!r}" if pattern else ""
            parts.append(
                f'\n\n@pytest.mark.parametrize("fusions", PATHS)\n'
                f"def test_case_raises_{kind.replace('-', '_')}(fusions):\n"
                f'    """gradfuzz\'s reference rejects this configuration ({kind}); '
                'TE must too."""\n'
                f"    with pytest.raises({raises}{match}):\n"
                "        run_case(fusions)\n"
            )
        else:
            parts.append(
                f'\n\n@pytest.mark.parametrize("fusions", PATHS)\n'
                f"def test_case_raises_{kind.replace('-', '_')}(fusions):\n"
                f'    """gradfuzz\'s reference rejects this configuration ({kind})."""\n'
                "    with pytest.raises(GradfuzzError) as raised:\n"
                "        run_case(fusions)\n"
                f"    assert raised.value.kind == {kind!r}, raised.value\n"
            )
    else:
        parts.append(
            '''

def reference_results(dtype):
    return reference(
        OPS,
        INPUT,
        PARAMS,
        EXTRA_INPUTS,
        COTANGENTS,
        input_requires_grad=INPUT_REQUIRES_GRAD,
        param_requires_grad=PARAM_REQUIRES_GRAD,
        extra_input_requires_grad=EXTRA_INPUT_REQUIRES_GRAD,
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def expected():
    """The float64 plain-autograd reference on the CPU."""
    return reference_results(torch.float64)


@pytest.fixture(scope="module")
def baseline():
    """The same reference in the case's dtype: what rounding alone costs each element."""
    return reference_results(DTYPE) if TOLERANCE["baseline_factor"] > 0 else None


@pytest.mark.parametrize("fusions", PATHS)
def test_case(fusions, expected, baseline):
'''
            + (
                '    if DEVICE.type == "cuda" and not torch.cuda.is_available():\n'
                '        pytest.skip("needs a CUDA device")\n'
            )
            + """    got = run_case(fusions)
    problems = compare_results(expected, got, TOLERANCE, baseline)
    problems += [f"{name}: changed by the run (a caller-owned tensor)" for name in got["modified"]]
    assert not problems, "\\n".join(problems)
"""
        )
    return "".join(parts)
