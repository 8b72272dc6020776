"""The full form of an exported script (`"full": true` in the export request; compact.py
writes the default one): everything the case could need, embedded whole.

The script imports torch and pytest (and what the dialect imports: transformer_engine for
te) and nothing of gradfuzz: it embeds the source of what it needs (the catalog functions
and the float64 reference, the comparison helpers, and the dialect's sections: for te the
adapter's custom ops, FusedResidual and parameter helpers; for torch the torch backend's
runtime). The case is built as a user writes it: explicit constructor calls, parameter
copies, the standalone calls, bindings and the Sequential, with the drawn values inlined
(values.py). One test per path (pytest.mark.parametrize over the paths' fusion lists)
compares every output and gradient with the float64 reference under the request's
tolerance, or, when the case expects an error, asserts that building and running it raises
that error.

Generating a te script does not import TE: te/backend.py imports it only in TEBackend().
"""

import pprint
import textwrap

from ..case import reference_ops
from .text import adapter_module_body
from .values import ScriptValues

EXTRAS_LINE = (
    "extras = [on_device(e, DTYPE, DEVICE, rg) "
    "for e, rg in zip(EXTRA_INPUTS, EXTRA_INPUT_REQUIRES_GRAD)]"
)

# What every full script embeds, in order: (module, section title).
EMBEDDED = (
    ("errors", "gradfuzz's error kinds (gradfuzz_adapter/errors.py)"),
    ("catalog", "The op catalog in plain PyTorch (gradfuzz_adapter/catalog.py)"),
    ("reference", "The float64 reference (gradfuzz_adapter/reference.py)"),
    ("export.support", "Values and comparison (gradfuzz_adapter/export/support.py)"),
)


def _section(title):
    bar = "# " + "-" * 88
    return f"\n\n{bar}\n# {title}\n{bar}\n\n"


class FullWriter:
    """The dialect's full-form build reads the case's standalone calls, bindings and late
    binds from here."""

    EXTRAS_LINE = EXTRAS_LINE

    def __init__(self, case, dialect):
        self.case = case
        self.dialect = dialect

    @staticmethod
    def indented(lines, spaces):
        return textwrap.indent("\n".join(lines), " " * spaces)

    def call_then_bind(self):
        out = []
        for k, (index, grad_mode) in enumerate(self.case.call_then_bind):
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

    def bindings(self):
        keyword = self.dialect.output_to_caller_keyword
        out = []
        for op in self.case.catalog_ops:
            for slot, channel in op.bound_inputs:
                out.append(f"op{op.index}.set_extra_input_channel({slot}, {channel!r})")
            for slot, channel, to_caller in op.bound_outputs:
                out.append(
                    f"op{op.index}.set_extra_output_channel({slot}, {channel!r}, "
                    f"{keyword}{to_caller})"
                )
        return out

    def late_binds(self):
        return [
            f"op{index}.set_extra_input_channel({slot}, {channel!r})  # after the Sequential"
            for index, slot, channel in self.case.late_binds
        ]

    def assembly(self, refs):
        """What follows the ops' construction in build(), for every dialect: the standalone
        calls, the bindings, the Sequential, the late binds, the input and extra inputs, and
        `ops` (the (variable, op name) items `refs`)."""
        modules = ", ".join(f"op{op.index}" for op in self.case.ops)
        return [
            *self.call_then_bind(),
            *self.bindings(),
            f"model = {self.dialect.sequential}({modules})",
            *self.late_binds(),
            "x = on_device(INPUT, DTYPE, DEVICE, INPUT_REQUIRES_GRAD)",
            self.EXTRAS_LINE,
            f"ops = [{', '.join(refs)}]",
        ]


def _docstring(case, dialect, paths, expect, case_file):
    ops = " -> ".join(op.name for op in case.ops)
    file_text = case_file or "<case file>"
    backend = dialect.name
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
    if dialect.full_docstring_note:
        lines += ["", dialect.full_docstring_note]
    return '"""' + "\n".join(lines) + '\n"""\n'


def full_script(case, request, dialect, values=None):
    """The full pytest file for `case` (an ExportRequest `request`, the backend's `dialect`).
    `values`: how the case's tensors are spelled (a ScriptValues; by default all in the
    script)."""
    if request.expected or request.own:
        raise ValueError(
            "the self-contained form (--full) computes its reference from the catalog's "
            "high-precision math, which cannot judge an FP8-quantized case: export it "
            "without --full (that script ships the FP8 reference's values)"
        )
    values = values or ScriptValues(case)
    expect = request.expect or {}
    tolerance = dict(expect.get("tolerance") or {})
    for key, default in (
        ("atol", 1e-7),
        ("rtol", 1e-7),
        ("baseline_factor", 0.0),
        ("baseline_cap", 0.0),
    ):
        tolerance.setdefault(key, default)
    expects_error = expect.get("kind") == "error"
    paths = request.default_paths(case)

    parts = [_docstring(case, dialect, paths, expect, request.case_file)]
    header = dialect.full_environment(case)
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
    header += [f"{line}  # noqa: E402" for line in dialect.imports()]
    header += [
        "",
        "torch.backends.cuda.matmul.allow_tf32 = False",
        "torch.backends.cudnn.allow_tf32 = False",
    ]
    parts.append("\n".join(header) + "\n")

    for module, title in EMBEDDED:
        parts.append(_section(title))
        parts.append(adapter_module_body(module))
    for title, source in dialect.full_sections():
        parts.append(_section(title) if title else "\n\n")
        parts.append(source)

    one = values.expr

    def many(ts, indent="    "):
        if not ts:
            return "[]"
        return "[\n" + "".join(f"{indent}{one(t)},\n" for t in ts) + "]"

    lines = values.prelude() + [
        f"DTYPE = torch.{str(case.dtype).replace('torch.', '')}",
        f'DEVICE = torch.device("{dialect.device(case)}")',
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
        f"OPS = {pprint.pformat(reference_ops(case), width=96, sort_dicts=False)}",
        f"TOLERANCE = {tolerance!r}",
    ]
    parts.append(_section("The case's values, rounded to the case dtype (export/values.py)"))
    if values.notes:
        parts.append("".join(f"# NOTE: {note}\n" for note in values.notes))
    parts.append("\n".join(lines) + "\n")

    parts.append(_section("The case, built as a user writes it"))
    parts.append(dialect.full_build(FullWriter(case, dialect)))

    param_list = ",\n".join(
        f"    pytest.param({list(p.get('fusions') or [])!r}, id={p['name']!r})" for p in paths
    )
    parts.append(_section("The tests: one per path"))
    parts.append(f"PATHS = [\n{param_list},\n]\n")
    if expects_error:
        kind = expect.get("error_kind", "unrecognized")
        parts.append(
            f'\n\n@pytest.mark.parametrize("fusions", PATHS)\n'
            f"def test_case_raises_{kind.replace('-', '_')}(fusions):\n" + dialect.full_raises(kind)
        )
    else:
        parts.append(FULL_TEST)
    return "".join(parts)


FULL_TEST = '''

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
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    got = run_case(fusions)
    problems = compare_results(expected, got, TOLERANCE, baseline)
    problems += [f"{name}: changed by the run (a caller-owned tensor)" for name in got["modified"]]
    assert not problems, "\\n".join(problems)
'''
