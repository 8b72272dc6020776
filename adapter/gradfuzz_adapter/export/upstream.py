"""The upstream form (`"form": "upstream"`; issue 25 item 2): the test a TE maintainer pastes
into TE's tests/pytorch/test_fusible_ops.py, for one finding.

One test function, laid out as TE's tests are: values from `torch.manual_seed` and
torch.rand in the test (uniform in [0, 1), as TE's make_reference_and_test_tensors draws:
no sum cancels below the tolerance); the case built with the dialect's public API (te:
te.ops; torch: the torch backend's runtime, imported from the adapter since it is what is
under test there); the reference written out in plain float64 torch for exactly the case's ops (a
channel's residual as the plain addition it is); TE's tolerance for the dtype (tests/pytorch/
utils.py: dtype_tols; FP8: quantization_tols, the reference's inputs and weights made
representable first, as make_reference_and_test_tensors does); and ONE assertion, on the
finding's tensor and for its reason: a mismatch asserts that tensor close to its reference,
a missing gradient that it is not None, an error or crash is just the calls that raise
(the test fails with the implementation's exception), a modified input that the caller's
tensor is unchanged. The tensor asserted is the one the cluster is signed by, the first
divergence's, where the test can read it (a parameter's gradient, the input's, an output) and
it fails there; where gradfuzz localised the first divergence to a tensor the test cannot read
(an op's input gradient inside the Sequential), the test asserts on the finding's tensor, the
earliest compared one it reaches, and its docstring names the first divergence (op, pass, TE's
class and method): that tensor is what te.ops' public API shows without splitting the fuser
whose fusion may be the defect. No gradfuzz bounds, values or
imports (te), no global TF32 change, no assertion on a write TE documents.

upstream_export() writes the seeded test and, where the dialect can run it here, runs it
(verify.py): where seeded values do not fail for the finding's reason but gradfuzz's do,
the test loads gradfuzz's values from a file beside it and says so.
"""

import os
import re
from dataclasses import dataclass, field, replace

import torch

from .. import catalog
from ..recipes import parse_recipe
from .text import literal, wrap_call
from .verify import runnable_here, verify_upstream

# The tensors a test reads through the public API (a first divergence elsewhere is inside
# the Sequential).
PUBLIC_TENSOR = re.compile(
    r"output|grad_input|extra_output\[\d+\]|grad_extra_input\[\d+\]|grad_param\[\d+\]\.\w+\[\d+\]"
)
# Marks the first line of the test's one assertion while the test is written (script()).
ASSERTION = "\0assertion"
# The formats' largest values (fp8_state.py's, TE's get_fp8_max).
FP8_MAX = {"E4M3": 448.0, "E5M2": 57344.0}

FINDING_KINDS = (
    "mismatch",
    "missing_gradient",
    "unexpected_error",
    "crash",
    "timeout",
    "sanitizer",
    "modified_input",
)
# The phases (driver.py) that come before the forward: an error there needs no call.
BEFORE_FORWARD = (
    "op creation",
    "call-then-bind call",
    "binding",
    "Sequential construction",
    "late binding",
)

# TE's tests/pytorch/utils.py: dtype_tols (torch.testing.assert_close's defaults per dtype).
DTYPE_TOLS = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
}
# quantization_tols for the FP8 recipes: dtype_tols(torch.float8_e4m3fn).
FP8_TOLS = (0.125, 0.0675)
# A HYBRID recipe's gradients are E5M2: dtype_tols(torch.float8_e5m2).
FP8_E5M2_TOLS = (0.25, 0.125)

# Op variable names, as TE's tests name their ops.
OP_VARS = {
    "Linear": "linear",
    "Bias": "bias",
    "ConstantScale": "scale",
    "ReLU": "relu",
    "GELU": "gelu",
    "SReLU": "srelu",
    "SwiGLU": "swiglu",
    "ScaledSwiGLU": "swiglu",
    "ScaledSReLU": "srelu",
    "MakeExtraOutput": "make_extra",
    "AddExtraInput": "add_extra",
    "GroupedLinear": "grouped_linear",
    "RMSNorm": "norm",
    "LayerNorm": "norm",
    "Reshape": "reshape",
    "Identity": "identity",
    "Dispatch": "dispatch",
    "Combine": "combine",
    "RowStat": "row_stat",
    "DualExtraOutput": "dual",
    "Boundary": "boundary",
}
# Parameter value names per op (model layout), and extra-input names per slot kind.
PARAM_VALUES = {
    "Linear": ("w",),
    "Bias": ("b",),
    "RMSNorm": ("gamma",),
    "LayerNorm": ("gamma", "beta"),
    "GroupedLinear": ("w", "b"),
}
# Ops that run a GEMM (TE: cuBLASLt, TF32 for float32) and ops an FP8 recipe quantizes.
GEMM_OPS = ("Linear", "GroupedLinear")


@dataclass
class Finding:
    """The cluster the test is for (the export request's `finding`)."""

    kind: str
    tensor: str = ""
    signature: str = ""
    path_pair: str = "fused~reference"
    role: str = ""
    op: str = ""
    message: str = ""
    error_type: str = ""
    phase: str = ""
    first_divergence: dict | None = None
    diagnosis: str = ""

    @classmethod
    def from_request(cls, obj):
        if not isinstance(obj, dict):
            raise ValueError('export --upstream: the request carries no "finding" object')
        kind = obj.get("kind", "")
        if kind not in FINDING_KINDS:
            raise ValueError(
                f"export --upstream: finding kind {kind!r}; known: {', '.join(FINDING_KINDS)}"
            )
        known = {k: obj[k] for k in cls.__dataclass_fields__ if k in obj and obj[k] is not None}
        return cls(**known)

    def on_first_divergence(self):
        """This finding with the tensor its cluster is signed by, the first divergence's,
        where that is one a test can read (an output, the input's or a parameter's gradient)
        and another than the finding's; None where there is none such."""
        first = self.first_divergence or {}
        tensor = first.get("tensor", "")
        parts = self.signature.split("|")
        signed_by = len(parts) >= 3 and (
            parts[2] == first.get("role") and parts[1] in (first.get("op"), first.get("group"))
        )
        if (
            self.op.startswith("in_place:")  # signed by the in-place write, not by where it shows
            or (self.signature and not signed_by)  # a divergence the cluster is not signed by
            or self.kind != "mismatch"
            or first.get("kind") != "mismatch"
            or first.get("path", self.path) != self.path
            or tensor == self.tensor
            or not PUBLIC_TENSOR.fullmatch(tensor)
        ):
            return None
        return replace(self, tensor=tensor, role=first.get("role", self.role))

    @property
    def path(self):
        """The path that failed: "fused", "unfused", ... (the pair's first that is not the
        reference)."""
        first = self.path_pair.split("~")[0] or "fused"
        return first.split(".")[0]

    @property
    def call(self):
        """Which call of the Sequential failed: 0, or k of "<path>.call[k]"."""
        match = re.search(r"\.call\[(\d+)\]", self.path_pair.split("~")[0])
        return int(match.group(1)) if match else 0

    @property
    def is_error(self):
        """Whether the finding is the calls failing (an exception, a dead or hung process)."""
        return self.kind in ("unexpected_error", "crash", "timeout", "sanitizer")


@dataclass
class Value:
    """A tensor the test makes: its name, how it is drawn, whether the reference takes it."""

    name: str
    expression: str
    floating: bool = True
    reference: bool = True
    representable: bool = False  # quantized by the recipe where TE's tests make it so


@dataclass
class Names:
    """The test's names for the case's ops, values, inputs and outputs."""

    ops: dict = field(default_factory=dict)  # op index -> variable
    params: dict = field(default_factory=dict)  # (op index, j) -> value name
    extras: list = field(default_factory=list)  # public extra input k -> value name
    outputs: list = field(default_factory=list)  # public output k -> variable stem
    cotangents: list = field(default_factory=list)  # public output k -> value name or None


def _numbered(bases):
    """Each base name, numbered 1.. where it occurs more than once."""
    counts, seen, out = {}, {}, []
    for base in bases:
        counts[base] = counts.get(base, 0) + 1
    for base in bases:
        if counts[base] == 1:
            out.append(base)
            continue
        seen[base] = seen.get(base, 0) + 1
        out.append(f"{base}{seen[base]}")
    return out


def _shape(shape):
    return ", ".join(str(int(d)) for d in shape)


class UpstreamWriter:
    """Writes the upstream test of `finding` for `case` with `dialect`. `values_file`: the
    file name (beside the test) the test loads gradfuzz's values from, or None (seeded)."""

    def __init__(self, case, finding, dialect, *, fault=None, case_file="", values_file=None):
        if case.world_size > 1:
            raise ValueError(
                "export --upstream: a distributed case's test is the torchrun script of "
                "export --python"
            )
        self.case = case
        self.finding = finding
        self.dialect = dialect
        self.fault = fault
        self.case_file = case_file
        self.values_file = values_file
        self.recipe = parse_recipe(case.spec.get("recipe"))
        self.seed = int(case.spec.get("seed", 0)) % 2**31
        self.names = self._names()
        self.values = []  # Value, in drawing order
        self._check_tensor()
        if finding.kind == "modified_input" and dialect.documents_in_place_writes:
            in_place = [op.name for op in case.catalog_ops if float(op.attrs.get("in_place", 0))]
            if in_place:
                raise ValueError(
                    f"export --upstream: {', '.join(in_place)} with in_place=True write into the "
                    "caller's tensors as TE documents: no test asserts against that"
                )
        self.assert_line = None  # the line number (1-based) of the one assertion
        self.inline_refs = False  # the reference reads x.double() where it needs no x_ref
        dialect.upstream_check(self)

    # -- names

    def _names(self):
        case = self.case
        names = Names()
        ops = [op for op in case.ops]
        for op, var in zip(ops, _numbered([OP_VARS.get(op.name, "op") for op in ops])):
            names.ops[op.index] = var
        params = [(op.index, j, PARAM_VALUES.get(op.name, ("p",))[j]) for op in case.catalog_ops
                  for j in range(len(op.params))]  # fmt: skip
        for (i, j, _), name in zip(params, _numbered([base for _, _, base in params])):
            names.params[(i, j)] = name
        bases = []
        for k in range(len(case.extra_inputs)):
            op_index, slot = case.public_inputs[k] if k < len(case.public_inputs) else (-1, 0)
            op = case.ops[op_index] if op_index >= 0 else None
            kind = op.extra_input_kinds[slot] if op is not None else "float"
            bases.append(self._extra_base(op, slot, kind))
        names.extras = _numbered(bases)
        outputs = 1 + sum(1 for op in case.catalog_ops for _, to_caller in op.output_bindings
                          if to_caller)  # fmt: skip
        names.outputs = ["y"] if outputs == 1 else [f"y{k + 1}" for k in range(outputs)]
        names.cotangents = [
            None if c is None else ("dy" if outputs == 1 else f"dy{k + 1}")
            for k, c in enumerate(case.cotangents[:outputs])
        ]
        return names

    def _check_tensor(self):
        """ValueError where the finding names a tensor the case does not have."""
        tensor, names = self.finding.tensor, self.names
        indexed = {
            r"grad_param\[(\d+)\]\.\w+\[(\d+)\]": lambda i, j: (int(i), int(j)) in names.params,
            r"extra_output\[(\d+)\]": lambda k: int(k) + 1 < len(names.outputs),
            r"(?:grad_)?extra_input\[(\d+)\]": lambda k: int(k) < len(names.extras),
        }
        for pattern, has in indexed.items():
            match = re.fullmatch(pattern, tensor)
            if match and not has(*match.groups()):
                raise ValueError(f"export --upstream: the case has no tensor {tensor!r}")

    @staticmethod
    def _extra_base(op, slot, kind):
        if kind == "split_sizes":
            return "split_sizes"
        if kind == "routing_map":
            return "routing_map"
        if op is not None and op.name in ("ScaledSwiGLU", "ScaledSReLU", "GroupedLinear"):
            return "scales"
        if op is not None and op.name == "Dispatch":
            return "logits"
        return "extra"

    # -- what the case is

    @property
    def quantized(self):
        """Whether anything of the case runs quantized (a recipe, a cached quantized input)."""
        if self.recipe is not None:
            return True
        return any(
            float(op.attrs.get("cache_quantized_input", 0)) == 1.0 for op in self.case.catalog_ops
        )

    @property
    def has_gemm(self):
        return any(op.name in GEMM_OPS for op in self.case.catalog_ops)

    @property
    def gradient(self):
        """Whether the finding's tensor is a gradient (so the test runs backward); a
        delayed-scaling state is judged after a whole training step."""
        return (
            self.finding.tensor.startswith("grad")
            or self.finding.kind == "missing_gradient"
            or self.is_state
        )

    @property
    def is_state(self):
        """Whether the finding is a delayed-scaling state against TE's rule (fp8_state.py)."""
        return self.finding.tensor.startswith("fp8_state[")

    def state(self):
        """(op, role, group, part) of an fp8_state finding's tensor."""
        tensor = self.finding.tensor
        if re.match(r"fp8_state\[\d+\]\.(quantized_tensor|held_weight)\[", tensor):
            raise ValueError(
                "export --upstream: a quantized tensor's own check (its FP8 codes, column-wise "
                "copy or dequantize, or a quantized weight the caller reads) is not written "
                f"into exported tests yet ({tensor}; replay runs it)"
            )
        match = re.fullmatch(r"fp8_state\[(\d+)\]\.(\w+)\[(\d+)\]\.(\w+)", tensor)
        if not match:
            raise ValueError(f"export --upstream: no delayed-scaling state {self.finding.tensor!r}")
        op, role, group, part = match.groups()
        if part.startswith("checkpoint"):
            raise ValueError(
                "export --upstream: a state lost in a checkpoint round trip needs the usage "
                "script's steps, which exported tests do not write yet (replay runs it)"
            )
        return int(op), role, int(group), part

    @property
    def runs_backward(self):
        finding = self.finding
        if finding.is_error:
            return finding.phase not in ("forward", *BEFORE_FORWARD)
        if finding.kind == "modified_input":
            return True
        return self.gradient

    @property
    def runs_forward(self):
        return not (self.finding.is_error and self.finding.phase in BEFORE_FORWARD)

    def tolerance(self):
        """(rtol, atol, comment): TE's tolerance convention for the case's dtype."""
        dtype = self.case.dtype_name
        if self.quantized and not (self.gradient and self._backward_override()):
            if self.gradient and self.recipe is not None and self.recipe.fp8_format == "HYBRID":
                return (
                    *FP8_E5M2_TOLS,
                    "dtype_tols(torch.float8_e5m2): HYBRID's gradients are E5M2",
                )
            return (*FP8_TOLS, "quantization_tols: FP8 (E4M3)")
        rtol, atol = DTYPE_TOLS[dtype]
        comment = f"dtype_tols(torch.{dtype})"
        if self.quantized:
            comment += f": backward_override={self._backward_override()}'s gradients"
        elif dtype == "float32" and self.has_gemm:
            return (*self.dialect.upstream_float32_gemm_tols(), self.dialect.upstream_tf32_note)
        return rtol, atol, comment

    def path_fusions(self):
        """The fusions of the finding's path: the case's on the fused path, none unfused."""
        if self.finding.path == "unfused":
            return []
        return list(self.case.spec.get("fusions") or [])

    def _backward_override(self):
        return None if self.recipe is None else self.recipe.backward_override

    # -- the test

    def script(self):
        body = self.test_function()  # first: the imports follow what the body uses
        lines = list(self.dialect.upstream_imports(self))
        lines += ["", ""]
        lines += body
        for n, line in enumerate(lines, 1):
            if ASSERTION in line:
                self.assert_line = n
                lines[n - 1] = line.replace(ASSERTION, "")
        return "\n".join(lines) + "\n"

    def test_name(self):
        ops = "_".join(OP_VARS.get(op.name, "op") for op in self.case.catalog_ops)
        finding = self.finding
        if finding.is_error:
            what = {"unexpected_error": "raises", "timeout": "hangs"}.get(finding.kind, "crashes")
        elif finding.kind == "modified_input":
            what = "keeps_" + re.sub(r"\W+", "_", finding.tensor or "input").strip("_")
        else:
            what = self.tensor_words(short=True)
        return re.sub(r"_+", "_", f"test_{ops}_{what}").strip("_")

    def tensor_words(self, short=False):
        """The finding's tensor as TE's tests name it: y (y1, y2, ... with extra outputs), dx,
        dw (the gradient of parameter value w), d<extra input>; `short`: as a name stem."""
        tensor, names = self.finding.tensor, self.names
        if tensor == "output":
            return names.outputs[0]
        if tensor == "grad_input":
            return "dx"
        match = re.fullmatch(r"extra_output\[(\d+)\]", tensor)
        if match:
            return names.outputs[1 + int(match.group(1))]
        match = re.fullmatch(r"grad_extra_input\[(\d+)\]", tensor)
        if match:
            return f"d{names.extras[int(match.group(1))]}"
        match = re.fullmatch(r"grad_param\[(\d+)\]\.(\w+)\[(\d+)\]", tensor)
        if match:
            i, j = int(match.group(1)), int(match.group(3))
            return f"d{names.params[(i, j)]}"
        return re.sub(r"\W+", "_", tensor) if short else tensor

    def docstring(self):
        case, finding = self.case, self.finding
        ops = " -> ".join(op.name for op in case.ops)
        what = f"{case.dtype_name}"
        if self.recipe is not None:
            # E4M3, TE's tests' format, goes without saying.
            fp8 = "" if self.recipe.fp8_format == "E4M3" else f" {self.recipe.fp8_format}"
            what += f", {self.recipe.name}{fp8}"
            if self.recipe.backward_override:
                what += f", backward_override={self.recipe.backward_override}"
        claim = {
            "mismatch": f"wrong {self.tensor_words()}",
            "missing_gradient": f"no {self.tensor_words()}",
            "unexpected_error": f"raises {finding.error_type or 'an error'}"
            + (f" in {finding.phase}" if finding.phase else ""),
            "crash": "crashes the process" + (f" in {finding.phase}" if finding.phase else ""),
            "timeout": "hangs" + (f" in {finding.phase}" if finding.phase else ""),
            "sanitizer": "trips the sanitizer" + (f" in {finding.phase}" if finding.phase else ""),
            "modified_input": f"changes the caller's {finding.tensor or 'input'}",
        }[finding.kind]
        first = f"{ops} ({what}): {claim}."
        pair = "" if finding.path_pair == "fused~reference" else f" ({finding.path_pair})"
        about = [f"gradfuzz: {finding.signature or finding.kind}{pair}"]
        divergence = finding.first_divergence
        if divergence:
            where = divergence.get("class") or divergence.get("group") or ""
            method = divergence.get("method")
            where += f".{method}" if where and method else ""
            if divergence.get("tensor") == finding.tensor:  # the tensor asserted: where only
                about[-1] += f" ({where})" if where else ""
            else:
                about.append(
                    f"first diverges at op {divergence.get('op_index')}'s "
                    f"{divergence.get('role')} in {divergence.get('pass', '')}"
                    + (f" ({where})" if where else "")
                )
        paragraph = " ".join(
            [first, "; ".join(about) + ".", *self.dialect.upstream_doc_lines(self)]
        )
        # One paragraph: the first line's quotes take 3 of the 100 columns, the indent 4.
        wrapped = _wrap_text(paragraph, 93)
        wrapped = [wrapped[0], *_wrap_text(" ".join(wrapped[1:]), 96)] if wrapped[1:] else wrapped
        out = ['    """' + wrapped[0]]
        out += [f"    {line}" if line else "" for line in wrapped[1:]]
        out[-1] += '"""'
        return out

    def test_function(self):
        params = self.dialect.upstream_parameters(self)
        lines = [f"def {self.test_name()}({params}):"]
        lines += self.docstring()
        body = self.values_lines()
        body += self.dialect.upstream_recipe_lines(self)
        body += [""]
        if self.runs_forward:
            body += self.build_lines()
            body += self.run_lines()
        else:  # the error comes while the case is built
            body += [*self.error_comment(), *self.build_lines()]
        if not self.finding.is_error:
            body += [""]
            body += self.check_lines()
        return lines + [f"    {line}" if line else "" for line in body]

    # -- values

    def values_lines(self):
        """Every tensor the test makes, drawn as TE's tests draw them (torch.rand: uniform in
        [0, 1), so that no sum cancels below the tolerance), or loaded from the values
        file."""
        case, names = self.case, self.names
        values = [Value("x", f"torch.rand({_shape(case.input.shape)}, dtype=dtype)")]
        for op in case.catalog_ops:
            for j, p in enumerate(op.params):
                name = names.params[(op.index, j)]
                expression = f"torch.rand({_shape(p.shape)}, dtype=dtype)"
                quantized_param = op.name in GEMM_OPS and j == 0
                values.append(Value(name, expression, representable=quantized_param))
        first = next(iter(case.catalog_ops), None)
        values[0].representable = first is not None and first.name in GEMM_OPS
        for k, e in enumerate(case.extra_inputs):
            name = names.extras[k]
            if not e.is_floating_point():
                if name == "routing_map":
                    expression = f"torch.randperm({int(e.shape[0])})"
                else:  # split sizes: the case's own composition of the rows
                    expression = f"torch.tensor({[int(v) for v in e.tolist()]!r})"
                values.append(Value(name, expression, floating=False, reference=False))
            else:
                values.append(Value(name, f"torch.rand({_shape(e.shape)}, dtype=dtype)"))
        for k, (x_call, extras) in enumerate(case.call_inputs):
            values.append(Value(f"x_call{k}", f"torch.rand({_shape(x_call.shape)}, dtype=dtype)"))
            for j, e in enumerate(extras):
                if e.is_floating_point():
                    expression = f"torch.rand({_shape(e.shape)}, dtype=dtype)"
                else:
                    expression = f"torch.tensor({[int(v) for v in e.tolist()]!r})"
                values.append(Value(f"extra_call{k}_{j}", expression, e.is_floating_point(), False))
        if self.runs_backward or self.finding.call:
            for k, name in enumerate(names.cotangents):
                c = case.cotangents[k]
                if name is not None:
                    values.append(
                        Value(name, f"torch.rand({_shape(c.shape)}, dtype=dtype)", reference=False)
                    )
        self.values = values
        if self.values_file is not None:
            lines = [
                "# Seeded values did not reproduce this finding; gradfuzz's, beside this file, do.",
                *wrap_call(
                    "values = torch.load(",
                    [f"os.path.join(os.path.dirname(__file__), {literal(self.values_file)})"],
                    ")",
                ),
            ]
            lines += [
                f"{v.name} = values[{literal(v.name)}]" + (".to(dtype)" if v.floating else "")
                for v in values
            ]
        else:
            lines = [f"torch.manual_seed({self.seed})"]
            lines += [f"{v.name} = {v.expression}" for v in values]
        lines += self.dialect.upstream_representable(
            self, [v.name for v in values if v.representable]
        )
        return lines

    def value_tensors(self):
        """{value name: gradfuzz's tensor} (the values file's content)."""
        case, names = self.case, self.names
        out = {"x": case.input}
        for k, (x_call, extras) in enumerate(case.call_inputs):
            out[f"x_call{k}"] = x_call
            out.update({f"extra_call{k}_{j}": e for j, e in enumerate(extras)})
        for op in case.catalog_ops:
            for j, p in enumerate(op.params):
                out[names.params[(op.index, j)]] = p
        for k, e in enumerate(case.extra_inputs):
            out[names.extras[k]] = e
        for k, name in enumerate(names.cotangents):
            if name is not None:
                out[name] = case.cotangents[k]
        return {k: v.detach().cpu() for k, v in out.items() if v is not None}

    # -- the case under test

    def on_device(self, value, copy=False):
        """`value` on the test's device (a copy of it where `copy`)."""
        if self.dialect.upstream_has_device(self):
            return f"{value}.to(device, copy=True)" if copy else f"{value}.to(device)"
        return f"{value}.clone()" if copy else value

    def build_lines(self):
        case, names, dialect = self.case, self.names, self.dialect
        lines = []
        for op in case.ops:
            lines += dialect.upstream_constructor(self, op)
        for k, (index, grad_mode) in enumerate(case.call_then_bind):
            given = [f"x_call{k}"] + [
                f"extra_call{k}_{j}" for j in range(len(case.call_inputs[k][1]))
            ]
            call = f"{names.ops[index]}({', '.join(self.on_device(v) for v in given)})"
            if grad_mode:
                lines.append(f"{call}  # called on its own, before any binding")
            else:
                lines += [
                    "with torch.no_grad():  # called on its own, before any binding",
                    f"    {call}",
                ]
        for op in case.catalog_ops:
            var = names.ops[op.index]
            for slot, channel in op.bound_inputs:
                lines.append(f"{var}.set_extra_input_channel({slot}, {literal(channel)})")
            for slot, channel, to_caller in op.bound_outputs:
                keyword = dialect.output_to_caller_keyword
                channel = literal(channel)
                lines.append(
                    f"{var}.set_extra_output_channel({slot}, {channel}, {keyword}{to_caller})"
                )
        lines.append(f"model = {dialect.upstream_sequential(self)}")
        for index, slot, channel in case.late_binds:
            lines.append(f"{names.ops[index]}.set_extra_input_channel({slot}, {literal(channel)})")
        copies, after = [], []
        for op in case.catalog_ops:
            if not op.params:
                continue
            values = [names.params[(op.index, j)] for j in range(len(op.params))]
            op_copies, op_after = dialect.upstream_param_copies(
                self, op, names.ops[op.index], values
            )
            copies += op_copies
            after += op_after
        if copies:
            lines += ["with torch.no_grad():", *[f"    {c}" for c in copies]]
        return lines + after

    def run_lines(self):
        case, names, dialect = self.case, self.names, self.dialect
        lines = []
        calls = self.finding.call
        backward = self.runs_backward or calls > 0
        rg = case.input_requires_grad and backward
        lines.append(
            f"x_test = {self.on_device('x', copy=True)}{'.requires_grad_()' if rg else ''}"
        )
        test_inputs = ["x_test"]
        asserted = self.finding.tensor
        for k, e in enumerate(case.extra_inputs):
            name = names.extras[k]
            e_rg = case.extra_input_requires_grad[k] and e.is_floating_point() and backward
            value = self.on_device(name, copy=True) + (".requires_grad_()" if e_rg else "")
            if asserted in (f"grad_extra_input[{k}]", f"extra_input[{k}]"):
                lines.append(f"{name}_test = {value}")
                value = f"{name}_test"
            test_inputs.append(value)
        outputs = [f"{stem}_test" for stem in names.outputs]
        target = outputs[0] if len(outputs) == 1 else ", ".join(outputs)
        context = dialect.upstream_context(self)
        call = wrap_call(f"{target} = model(", test_inputs, ")", width=92 if context else 96)
        forward = [f"with {context}:", *[f"    {line}" for line in call]] if context else call
        if calls:
            # gradfuzz's earlier calls of the same Sequential, each a training step: the
            # finding is the call after them (call[k]).
            earlier = [*forward, *dialect.upstream_after_forward(self)]
            earlier += self.backward_lines(outputs) + dialect.upstream_after_backward(self)
            if self.runs_backward:
                earlier += dialect.upstream_zero_grads(self)
            if calls == 1:
                lines.append("# gradfuzz's first call of the model; the finding is the second's")
                lines += earlier
            else:
                lines.append(f"for _ in range({calls}):  # the finding is call {calls + 1}'s")
                lines += [f"    {line}" for line in earlier]
        if self.finding.is_error:
            lines += self.error_comment()
        if self.finding.kind == "modified_input":
            lines += self.pristine_lines()
        if self.is_state and calls:
            i, role, group, _ = self.state()
            history, _ = dialect.upstream_delayed_state(self, i, role, group)
            lines.append(f"history_before = {history}.clone()")
        lines += forward
        if self.is_state:
            lines += dialect.upstream_after_forward(self)
        if self.runs_backward:
            lines += self.backward_lines(outputs)
            lines += dialect.upstream_after_backward(self)
        return lines

    def error_comment(self):
        """Comment lines above the calls that fail: what gradfuzz saw them raise."""
        finding = self.finding
        what = {"crash": "the process crash", "timeout": "the calls hang"}.get(finding.kind)
        what = what or finding.error_type or "an error"
        lines = [f"# gradfuzz saw {what}" + (f" in {finding.phase}" if finding.phase else "")]
        message = " ".join(finding.message.split())
        if message:
            lines[0] += ":"
            lines.append("# " + (message if len(message) <= 90 else message[:87] + "..."))
        return lines

    def differentiable(self):
        """Per public output, whether it can require grad: a leaf requiring grad (the input,
        a parameter of an earlier op, an extra input of an op up to its producer) reaches
        it. Outputs that cannot take no part in backward, as in gradfuzz's run."""
        case = self.case
        producers = [case.ops[-1].index] + [op for op, _ in case.public_outputs]
        out = []
        for k, producer in enumerate(producers):
            last = producer if k else producer + 1  # the main output: every op's
            leaves = case.input_requires_grad or any(
                any(op.param_requires_grad) for op in case.catalog_ops if op.index < last
            )
            for j in range(len(case.extra_inputs)):
                op_index = case.public_inputs[j][0] if j < len(case.public_inputs) else -1
                leaves |= op_index <= producer and case.extra_input_requires_grad[j]
            out.append(bool(leaves))
        return out

    def backward_lines(self, outputs):
        pairs = [
            (o, c)
            for o, c, d in zip(outputs, self.names.cotangents, self.differentiable())
            if c is not None and d
        ]
        watched = self.caller_tensor() if self.finding.kind == "modified_input" else None
        given = [f"{c}_test" if f"{c}_test" == watched else self.on_device(c) for _, c in pairs]
        if len(pairs) == 1:
            return [f"{pairs[0][0]}.backward({given[0]})"]
        outs = ", ".join(o for o, _ in pairs)
        return [f"torch.autograd.backward(({outs}), ({', '.join(given)}))"]

    def pristine_lines(self):
        """The watched caller tensor's copy before the call (a cotangent made for it)."""
        watched = self.caller_tensor()
        lines = []
        for c in self.names.cotangents:
            if c is not None and watched == f"{c}_test":
                lines.append(f"{watched} = {self.on_device(c, copy=True)}")
        return lines + [f"before = {watched}.detach().clone()"]

    def caller_tensor(self):
        tensor = self.finding.tensor or "input"
        if tensor == "input":
            return "x_test"
        match = re.fullmatch(r"extra_input\[(\d+)\]", tensor)
        if match:
            return f"{self.names.extras[int(match.group(1))]}_test"
        match = re.fullmatch(r"cotangent\[(\d+)\]", tensor)
        if match and self.names.cotangents[int(match.group(1))]:
            return f"{self.names.cotangents[int(match.group(1))]}_test"
        raise ValueError(
            f"export --upstream: the caller tensor {tensor!r} changed; only the input and the "
            "extra inputs are the test's own tensors"
        )

    # -- the reference and the one assertion

    def state_lines(self):
        """The finding's delayed-scaling quantizer after the step against TE's documented rule
        (quantization.py: _default_get_amax_and_update_history, _default_sf_compute)."""
        i, role, group, part = self.state()
        history, scale = self.dialect.upstream_delayed_state(self, i, role, group)
        lines = [f"history, scale = {history}, {scale}  # the {role} quantizer's delayed scaling"]
        if part == "update":
            return lines + [
                "# The update at the end of the pass consumes the amax the step recorded (slot 0)",
                f"{ASSERTION}assert history[0] == 0, history",
            ]
        recipe = self.recipe
        options = recipe.options
        fp8_max = FP8_MAX[recipe.format_for(role == "grad_output")]
        before = "history_before" if self.finding.call else "torch.zeros_like(history)"
        if int(options["amax_history_len"]) > 1:
            recorded = "history[-1]  # the amax this step recorded, rolled to the last slot"
        elif role == "weight":
            weight = self.dialect.upstream_weight(self, i, group)
            recorded = f"{weight}.detach().abs().max().float()  # what the step recorded"
        else:
            raise ValueError(
                "export --upstream: a one-slot amax history keeps no trace of the amax it consumed"
            )
        amax = "pre.max()" if options["amax_compute_algo"] == "max" else "pre[0]"
        margin = int(options["margin"])
        cpu = ".cpu()" if self.dialect.upstream_has_device(self) else ""
        return lines + [
            f"pre = {before}.clone()",
            f"pre[0] = {recorded}",
            f"expected = (torch.tensor({fp8_max!r}, device=pre.device) / {amax}) / 2**{margin}",
            "# TE's rule: scale = fp8_max / amax / 2**margin, amax from the history",
            f"{ASSERTION}torch.testing.assert_close(scale.float(){cpu}.reshape(()), "
            f"expected.float(){cpu}, rtol=0, atol=0)",
        ]

    def check_lines(self):
        finding = self.finding
        if self.is_state:
            return self.state_lines()
        if finding.kind == "modified_input":
            return [
                f"# the finding: {self.finding.tensor or 'the input'} unchanged by the call",
                f"{ASSERTION}torch.testing.assert_close("
                f"{self.caller_tensor()}, before, rtol=0, atol=0)",
            ]
        got = self.test_tensor()
        if finding.kind == "missing_gradient":
            return [f"{ASSERTION}assert {got} is not None  # the finding: a gradient"]
        lines = self.reference_lines()
        rtol, atol, comment = self.tolerance()
        lines.append(f"# The finding, at TE's {comment}")
        ref = self.reference_tensor()
        cpu = ".cpu()" if self.dialect.upstream_has_device(self) else ""
        lines += wrap_call(
            f"{ASSERTION}torch.testing.assert_close(",
            [f"{got}.double(){cpu}", ref, f"rtol={rtol!r}", f"atol={atol!r}"],
            ")",
            width=96 + len(ASSERTION),
        )
        return lines

    def test_tensor(self):
        tensor, names = self.finding.tensor, self.names
        if tensor == "output":
            return f"{names.outputs[0]}_test"
        if tensor == "grad_input":
            return "x_test.grad"
        match = re.fullmatch(r"extra_output\[(\d+)\]", tensor)
        if match:
            return f"{names.outputs[1 + int(match.group(1))]}_test"
        match = re.fullmatch(r"grad_extra_input\[(\d+)\]", tensor)
        if match:
            return f"{names.extras[int(match.group(1))]}_test.grad"
        match = re.fullmatch(r"grad_param\[(\d+)\]\.(\w+)\[(\d+)\]", tensor)
        if match:
            i, j = int(match.group(1)), int(match.group(3))
            if (i, j) not in names.params:
                raise ValueError(f"export --upstream: the case has no parameter {tensor!r}")
            return self.dialect.upstream_param_grad(self, self.case.ops[i], names.ops[i], j)
        raise ValueError(
            f"export --upstream: {tensor!r} is not observable through the "
            f"{self.dialect.name} backend's public API (a channel's gradient)"
        )

    def reference_tensor(self):
        tensor, names = self.finding.tensor, self.names
        if tensor == "output":
            return f"{names.outputs[0]}_ref"
        if tensor == "grad_input":
            return "x_ref.grad"
        match = re.fullmatch(r"extra_output\[(\d+)\]", tensor)
        if match:
            return f"{names.outputs[1 + int(match.group(1))]}_ref"
        match = re.fullmatch(r"grad_extra_input\[(\d+)\]", tensor)
        if match:
            return f"{names.extras[int(match.group(1))]}_ref.grad"
        match = re.fullmatch(r"grad_param\[(\d+)\]\.(\w+)\[(\d+)\]", tensor)
        i, j = int(match.group(1)), int(match.group(3))
        return f"{names.params[(i, j)]}_ref.grad"

    def ref(self, name):
        """The reference's float64 leaf of test value `name`."""
        return f"{name}.double()" if self.inline_refs else f"{name}_ref"

    def reference_lines(self):
        """The case in plain float64 torch: leaves, one expression per output (intermediates
        named where a channel or a long line needs them), backward where a gradient is
        asserted."""
        leaves = [v.name for v in self.values if v.reference and v.floating]
        leaves = [n for n in leaves if n not in self.names.cotangents]
        refs = [f"{n}_ref" for n in leaves]
        self.inline_refs = not self.gradient and len(leaves) <= 3
        if self.inline_refs:  # no gradient wanted: the float64 values where they are used
            lines = []
        elif not self.gradient:
            lines = [f"{', '.join(refs)} = {', '.join(f'{n}.double()' for n in leaves)}"]
        elif len(leaves) == 1:
            lines = [f"{refs[0]} = {leaves[0]}.double().requires_grad_()"]
        else:
            lines = wrap_call(
                f"{', '.join(refs)} = (t.double().requires_grad_() for t in (",
                leaves,
                "))",
            )
        reference = _Reference(self)
        outs = [f"{stem}_ref" for stem in self.names.outputs]
        pairs = [
            (o, c)
            for o, c, d in zip(outs, self.names.cotangents, self.differentiable())
            if c is not None and d
        ]
        wanted = {self.reference_tensor().split(".")[0]}
        if self.gradient:
            wanted |= {o for o, _ in pairs}
        lines += _live(reference.lines(), wanted)
        if self.gradient:
            if len(pairs) == 1:
                lines.append(f"{pairs[0][0]}.backward({pairs[0][1]}.double())")
            else:
                lines += wrap_call(
                    "torch.autograd.backward(",
                    [
                        f"({', '.join(o for o, _ in pairs)})",
                        f"({', '.join(f'{c}.double()' for _, c in pairs)})",
                    ],
                    ")",
                )
        return lines


class _Reference:
    """The reference's statements, op by op: an expression grows while each value is used
    once; a channel's value, an op written as statements or a long line names it."""

    WIDTH = 76

    def __init__(self, writer):
        self.w = writer
        self.statements = []
        self.temps = 0

    def name(self, expr):
        """`expr` (text, precedence) as a name, assigning it to h<k> where it is not one."""
        text, prec = expr
        if re.fullmatch(r"\w+", text):
            return text
        self.temps += 1
        var = "h" if self.temps == 1 else f"h{self.temps}"
        self.statements.append(f"{var} = {text}")
        return var

    def lines(self):
        w = self.w
        case, names = w.case, w.names
        expr = (w.ref("x"), 100)
        channels = {}
        public = []
        next_extra = 0
        for op in case.ops:
            if op.boundary:
                continue
            extras = []
            for channel in op.input_channels:
                if channel is None:
                    name = names.extras[next_extra] if next_extra < len(names.extras) else None
                    next_extra += 1
                    if name is None:
                        extras.append("None")
                    elif case.extra_inputs[next_extra - 1].is_floating_point():
                        extras.append(w.ref(name))
                    else:
                        extras.append(name)
                else:
                    extras.append(channels[(op.fuser, channel)])
            params = [w.ref(names.params[(op.index, j)]) for j in range(len(op.params))]
            expr, outs = self.op(op, expr, extras, params)
            for s, (channel, to_caller) in enumerate(op.output_bindings):
                value = outs[s]
                if channel is not None:
                    channels[(op.fuser, channel)] = value
                if to_caller:
                    public.append(value)
            if len(expr[0]) > self.WIDTH:
                expr = (self.name(expr), 100)
        stems = names.outputs
        last = self.statements[-1] if self.statements else ""
        if last.startswith(f"{expr[0]} = ") and expr[0] not in public:
            # The last statement made the output: it names the output itself.
            self.statements[-1] = f"{stems[0]}_ref" + last[len(expr[0]) :]
            out = []
        else:
            out = [f"{stems[0]}_ref = {expr[0]}"]
        for stem, value in zip(stems[1:], public):
            out.append(f"{stem}_ref = {value}")
        return self.statements + out

    @staticmethod
    def wrap(expr, prec):
        text, own = expr
        return f"({text})" if own < prec else text

    def op(self, op, expr, extras, params):
        """(the op's main output expression, its extra outputs' names) on input `expr`."""
        name, attrs = op.name, op.attrs
        real = lambda key, default: repr(catalog.attr_real(name, attrs, key, default))  # noqa: E731
        integer = lambda key, default: catalog.attr_int(name, attrs, key, default, 0)  # noqa: E731
        flag = lambda key: catalog.attr_bool(name, attrs, key, 0)  # noqa: E731
        F = "torch.nn.functional"
        if name == "Linear":
            return (f"{self.wrap(expr, 80)} @ {params[0]}.T", 80), []
        if name == "Bias":
            return (f"{self.wrap(expr, 70)} + {params[0]}", 70), []
        if name == "ConstantScale":
            return (f"{self.wrap(expr, 80)} * {real('scale', 0.5)}", 80), []
        if name == "ReLU":
            return (f"torch.relu({expr[0]})", 100), []
        if name == "GELU":
            return (f'{F}.gelu({expr[0]}, approximate="tanh")', 100), []
        if name == "SReLU":
            return (f"torch.relu({expr[0]}) ** 2", 90), []
        if name == "ScaledSReLU":
            return (f"torch.relu({expr[0]}) ** 2 * {extras[0]}.unsqueeze(-1)", 80), []
        if name in ("SwiGLU", "ScaledSwiGLU"):
            h = self.name(expr)
            k = integer("interleave", 0)
            if k:
                self.statements.append(f"a, b = {h}.unflatten(-1, (-1, 2, {k})).unbind(-2)")
                gate, value = "a.flatten(-2)", "b.flatten(-2)"
            else:
                half = int(op.input_shape[-1]) // 2
                gate, value = f"{h}[:, :{half}]", f"{h}[:, {half}:]"
            scaled = f" * {extras[0]}.unsqueeze(-1)" if name == "ScaledSwiGLU" else ""
            return (f"{F}.silu({gate}) * {value}{scaled}", 80), []
        if name == "AddExtraInput":
            return (f"{self.wrap(expr, 70)} + {extras[0]}", 70), []
        if name in ("MakeExtraOutput", "Identity", *catalog.COLLECTIVES):
            if name == "MakeExtraOutput":
                h = self.name(expr)
                return (h, 100), [h]
            return expr, []
        if name == "Reshape":
            features = integer("features", 0) or op.input_shape[-1]
            return (f"{self.wrap(expr, 100)}.reshape(-1, {features})", 100), []
        if name in ("RMSNorm", "LayerNorm"):
            features = op.param_shapes[0][0]
            gamma = f"1 + {params[0]}" if flag("zero_centered_gamma") else params[0]
            function = "rms_norm" if name == "RMSNorm" else "layer_norm"
            beta = f", {params[1]}" if name == "LayerNorm" else ""
            eps = real("eps", 1e-5)
            return (f"{F}.{function}({expr[0]}, ({features},), {gamma}{beta}, eps={eps})", 100), []
        if name == "GroupedLinear":
            h = self.name(expr)
            w, b = params[0], (params[1] if len(params) > 1 else None)
            sizes = f"{extras[0]}.tolist()"
            self.statements.append(f"groups = {h}.split({sizes})  # GroupedLinear's rows per group")
            if flag("scale_bias"):
                self.statements.append(f"scales = {extras[1]}.split({sizes})")
                term = f"xg @ {w}[g].T + torch.outer(scales[g], {b}[g])"
            else:
                term = f"xg @ {w}[g].T" + (f" + {b}[g]" if b else "")
            return (f"torch.cat([{term} for g, xg in enumerate(groups)])", 100), []
        if name == "RowStat":
            h = self.name(expr)
            return (h, 100), [self.name((f"{h}.square().mean(-1)", 100))]
        if name == "DualExtraOutput":
            h = self.name(expr)
            s0, s1 = real("s0", 0.5), real("s1", -1.5)
            return (h, 100), [self.name((f"{h} * {s0}", 80)), self.name((f"{h} * {s1}", 80))]
        if name == "Combine":
            order = f"torch.argsort({extras[0]}.to(torch.int64))"
            return (f"{self.wrap(expr, 100)}.index_select(0, {order})", 100), []
        if name == "Dispatch":
            h = self.name(expr)
            groups = integer("groups", 2)
            self.statements += [
                f"group = {extras[0]}.detach().argmax(1)  # Dispatch: row r to its largest logit",
                "order = torch.sort(group, stable=True).indices",
                f"sizes = torch.bincount(group, minlength={groups})",
                f"probs = {extras[0]}.softmax(1).gather(1, group[:, None])[:, 0][order]",
            ]
            return (f"{h}[order]", 100), ["sizes", "probs", "order"]
        raise ValueError(f"export --upstream: no reference for catalog op {name!r}")


def _live(lines, wanted):
    """The statements of `lines` that what `wanted` names needs (an output the test does not
    assert on, nor take a gradient through, left out with what only it used). A statement
    is a line and the indented or closing lines after it."""
    statements = []
    for line in lines:
        if statements and (line[:1].isspace() or line[:1] in ")]}"):
            statements[-1].append(line)
        else:
            statements.append([line])
    needed, kept = set(wanted), []
    for statement in reversed(statements):
        text = "\n".join(statement)
        target = re.match(r"([A-Za-z_][\w, ]*?)\s*=(?!=)", text)
        names = {t.strip() for t in target.group(1).split(",")} if target else set()
        if target and not names & needed:
            continue
        code = text.split("#")[0] if "#" in text and '"' not in text else text
        needed |= set(re.findall(r"[A-Za-z_]\w*", code[target.end() :] if target else code))
        kept.append(statement)
    return [line for statement in reversed(kept) for line in statement]


def _wrap_text(text, width):
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line]


def upstream_export(case, request, dialect):
    """The reply to an upstream export request: {"ok", "script", "notes"[, "data_file"]}.
    Where the dialect can run the test here, the seeded test is run (verify.py); where it
    does not fail for the finding's reason and gradfuzz's values do, those go to the
    request's data_file and the test loads them."""
    reported = Finding.from_request(request.finding)
    fault = request.fault
    notes = []
    reason = runnable_here(dialect) if request.verify else "the request asked not to"
    # The cluster's own tensor first; the finding's where the test cannot read that one or it
    # does not fail there.
    findings = [f for f in (reported.on_first_divergence(), reported) if f is not None]
    if reason:
        findings = findings[:1]
    for finding in findings:
        try:
            writer = UpstreamWriter(
                case, finding, dialect, fault=fault, case_file=request.case_file
            )
        except ValueError:
            if finding is reported:
                raise
            continue  # the writer declines that tensor (the dialect's public API lacks it)
        script = writer.script()
        reply = {"ok": True, "script": script, "notes": notes}
        if not finding.is_error and finding.kind != "modified_input":
            reply["asserted"] = finding.tensor
        lines = len(script.splitlines())
        notes.append(
            f"an upstream test of {lines} lines for {finding.signature or finding.kind}, "
            f"asserting on {finding.tensor or 'the calls'}"
        )
        if reason:
            notes.append(f"not run here: {reason}")
            return reply
        verdict = verify_upstream(script, writer, fault=fault)
        notes.append(verdict.summary())
        if verdict.reproduces:
            return reply
    if not request.data_file:
        notes.append("gradfuzz's values were not tried: no data file (export with -o FILE)")
        return reply
    values_file = os.path.basename(request.data_file)
    with_values = UpstreamWriter(
        case, finding, dialect, fault=fault, case_file=request.case_file, values_file=values_file
    )
    text = with_values.script()
    data = {k: v.to(torch.float64) if v.is_floating_point() else v
            for k, v in with_values.value_tensors().items()}  # fmt: skip
    verdict_values = verify_upstream(text, with_values, fault=fault, data=(values_file, data))
    notes.append("with gradfuzz's values: " + verdict_values.summary())
    if verdict_values.reproduces:
        torch.save(data, request.data_file)
        reply.update(script=text, data_file=request.data_file)
    return reply
