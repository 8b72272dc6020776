"""`export`: a case as a pytest file that a TE maintainer can read and paste into TE's
tests/pytorch (../shared/spec/te-backend.md "Export", issue 15 item 4; docs/TE.md
"Exported scripts").

The compact form (the default) holds only what the case uses, laid out as TE's
test_fusible_ops.py lays out a test: the drawn values and the oracle's bounds, one line
each (script_values.py); reference(), the case in plain float64 PyTorch written out op by
op (reference_lines: the catalog's torch calls with the attrs filled in); build(), the case
with te.ops as a user builds it (constructors, parameters copied by name, standalone calls,
channel bindings, Sequential); run(), one call as the oracle makes it; and one test per
path that makes every check gradfuzz's oracle makes for such a case:

- every output and gradient against the reference (or, for a quantizing case, the shipped
  EXPECTED values), under the request's per-tensor bounds (`expect.tensors`: {"atol",
  "rtol", "allowance", "norm_bound"} by the oracle's tensor name; else `expect.tolerance`
  with the rounding baseline, the reference in the case dtype);
- no caller-owned tensor (input, extra inputs, cotangents) changed by the call;
- an expected error raised with TE's type and message (te/classify.py RAISES) or the
  runtime's kind (torch), and no op left locked by a failed construction;
- each repeat call (`spec.repeat_calls`): its values against the reference, and on te each
  fuser's plans equal to those of a fresh Sequential at its first call with that call's
  requires-grad pattern.

The comparison helpers follow the test; after EMBEDDED_MARK comes what the case's ops need
to run: on te the adapter's custom ops and FusedResidual (te/extensions.py, only where
used), on torch the runtime under test (torch_runtime.py and the catalog). The script fails
exactly where replay finds a defect (channel gradients excepted for te: TE does not expose
them to a user). `"full": true` in the request writes the full, self-contained form instead
(exporter_full.py). Generating a te script never imports TE.
"""

import keyword
import re

from . import catalog
from . import te as te_package
from .exporter_full import full_script
from .recipes import parse_recipe, te_kwargs
from .script_values import ScriptValues
from .source_picker import Picker
from .te.fusions import FUNCTION_OWNERS

# Catalog ops whose TE parameters the script copies by name (te/params.py: param_groups);
# the others' (GroupedLinear) go through the embedded te/params.py helpers.
TE_PARAMS = {"Linear": ["weight"], "Bias": ["bias"], "RMSNorm": ["weight"]}
TE_PARAMS["LayerNorm"] = ["weight", "bias"]


def export_reply(case, request, default_backend, tensors=()):
    """The reply to an `export` request (docs/BACKENDS.md): {"ok", "script", "notes"}; writes
    the request's `data_file` when values do not fit the script (script_values.py)."""
    if (request.get("expect") or {}).get("sharding"):
        # A distributed case: a torchrun script, one process per rank (exporter_dist.py).
        from .exporter_dist import export_distributed

        return export_distributed(case, request, tensors, default_backend)
    data_file = request.get("data_file") or None
    expect = request.get("expect") or {"kind": "pass"}
    allowances = _allowances(expect, tensors)
    expected = _shipped_expectation(expect, tensors)
    own = _path_expectations(expect, tensors)
    extra = dict(allowances)
    for k, call in enumerate(expected or []):
        extra.update({f"expected call[{k}] {name}": t for name, t in call.items()})
    for path, e in own.items():
        extra.update({f"{path} {name}": t for name, t in e["allowances"].items()})
        for k, call in enumerate(e["expected"]):
            extra.update({f"{path} expected call[{k}] {name}": t for name, t in call.items()})
    values = ScriptValues(case, data_file=data_file, extra=extra)
    script = export_script(
        case,
        backend=request.get("backend", default_backend),
        paths=request.get("paths") or [],
        expect=expect,
        case_file=request.get("case_file", ""),
        values=values,
        full=bool(request.get("full", False)),
        allowances=allowances,
        expected=expected,
        own=own,
    )
    values.save()
    reply = {"ok": True, "script": script, "notes": values.notes}
    if values.data:
        reply["data_file"] = data_file
    return reply


def _shipped_expectation(expect, tensors, where="expect"):
    """[{tensor name: expected value}] per call from expect.expected and
    expect.repeat_expected (the float64 FP8 reference's values of a quantizing case), or
    None when the request ships none (the script then recomputes its reference)."""
    if "expected" not in expect:
        return None

    def one(refs, where):
        if not isinstance(refs, dict):
            raise ValueError(f"{where}: expected an object of tensor names")
        out = {}
        for name, index in refs.items():  # frame indices, as the allowances'
            if not isinstance(index, int) or not 0 <= index < len(tensors):
                raise ValueError(f"{where}[{name!r}]: no tensor {index!r}")
            out[name] = tensors[index]
        return out

    calls = [one(expect["expected"], f"{where}.expected")]
    repeats = expect.get("repeat_expected") or []
    if not isinstance(repeats, list):
        raise ValueError(f"{where}.repeat_expected: expected a list, one object per repeat call")
    calls += [one(r, f"{where}.repeat_expected[{k}]") for k, r in enumerate(repeats)]
    return calls


def _allowances(expect, tensors, where="expect"):
    """{tensor name: allowance tensor} from expect.tensors' "allowance" indices."""
    out = {}
    for name, bound in (expect.get("tensors") or {}).items():
        ref = bound.get("allowance")
        if ref is not None:
            if not isinstance(ref, int) or not 0 <= ref < len(tensors):
                raise ValueError(f"{where}.tensors[{name!r}].allowance: no tensor {ref!r}")
            out[name] = tensors[ref]
    return out


def _path_expectations(expect, tensors):
    """{path name: {"points", "tensors", "allowances", "expected"}} from expect.paths: the
    paths whose fused ops quantize elsewhere than their basic ops (BackwardLinearScale under
    a recipe), each with its own reference's bounds and expected values per call, as
    expect.tensors and expect.expected are for the other paths (docs/BACKENDS.md "Per-path
    quantization points")."""
    paths = expect.get("paths") or {}
    if not isinstance(paths, dict):
        raise ValueError("expect.paths: expected an object of path names")
    out = {}
    for path, own in paths.items():
        where = f"expect.paths[{path!r}]"
        if not isinstance(own, dict) or "expected" not in own or "tensors" not in own:
            raise ValueError(f"{where}: expected an object with tensors and expected")
        out[path] = {
            "points": str(own.get("points", "")),
            "tensors": own["tensors"],
            "allowances": _allowances(own, tensors, where),
            "expected": _shipped_expectation(own, tensors, where),
        }
    return out


def export_script(
    case,
    *,
    backend,
    paths,
    expect,
    case_file="",
    values=None,
    full=False,
    allowances=None,
    expected=None,
    own=None,
):
    """The pytest file for `case` on `backend` ("te" or "torch"): the compact form, or with
    `full` the self-contained one. `expected` ([{name: tensor}] per call): values the
    script compares with instead of its own reference (a quantizing case's). `own`
    (_path_expectations): the paths judged against their own quantization points' reference,
    each tested against its own bounds and expected values."""
    if backend not in ("te", "torch"):
        raise ValueError(f"export writes te or torch scripts, got '{backend}'")
    if full and (expected or own):
        raise ValueError(
            "the self-contained form (--full) computes its reference from the catalog's "
            "high-precision math, which cannot judge an FP8-quantized case: export it "
            "without --full (that script ships the FP8 reference's values)"
        )
    paths = paths or [{"name": "fused", "fusions": list(case.spec.get("fusions") or [])}]
    if full:
        return full_script(
            case, backend=backend, paths=paths, expect=expect, case_file=case_file, values=values
        )
    allowances = allowances or {}
    values = values or ScriptValues(case, extra=allowances)
    return _Writer(
        case, backend, paths, expect or {}, case_file, values, allowances, expected, own
    ).script()


def _identifier(text):
    name = re.sub(r"\W", "_", text)
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"_{name}"


def _channel_label(fuser, channel):
    """The oracle's name of a channel gradient (oracle/oracle.cc: channel_label)."""
    return f"grad_channel[{channel}{'' if fuser == 0 else f'@fuser{fuser}'}]"


# The line that starts what a torch script embeds of the runtime under test (and a te
# script of the adapter's te.ops extensions): what comes before it is the test itself.
EMBEDDED_MARK = "# " + "-" * 86


def reference_lines(op, h, extras, params, outs):
    """One catalog op of the reference in plain PyTorch: the torch calls of its catalog
    function (catalog.py) with its attrs filled in, on input variable `h`, extra input
    variables `extras` and parameter variables `params`, assigning extra output slot s to
    `outs[s]`. Returns (lines, the variable holding the op's main output)."""
    name, attrs = op.name, op.attrs
    real = lambda key, default: repr(catalog.attr_real(name, attrs, key, default))  # noqa: E731
    integer = lambda key, default, low=0: catalog.attr_int(name, attrs, key, default, low)  # noqa: E731
    flag = lambda key: catalog.attr_bool(name, attrs, key, 0)  # noqa: E731
    needed = {"ScaledSwiGLU": 1, "ScaledSReLU": 1, "AddExtraInput": 1, "GroupedLinear": 1}
    needed.update({"Dispatch": 1, "Combine": 1})
    if name == "GroupedLinear" and flag("scale_bias"):
        needed[name] = 2
    missing = [s for s in range(needed.get(name, 0)) if s >= len(extras) or extras[s] is None]
    if missing:
        raise ValueError(f"op {op.index} ({name}): extra input slot {missing[0]} has no value")
    e, p = extras, params
    if name in ("SwiGLU", "ScaledSwiGLU"):
        k = integer("interleave", 0)
        scaled = f" * {e[0]}.unsqueeze(-1)" if name == "ScaledSwiGLU" else ""
        halves = (
            f"a, b = {h}.chunk(2, dim=-1)"
            if k == 0
            else f"a, b = (t.flatten(-2) for t in {h}.unflatten(-1, (-1, 2, {k})).unbind(-2))"
        )
        return [f"{halves}  # {name}", f"h = F.silu(a) * b{scaled}"], "h"
    if name == "GroupedLinear":
        w, b = p[0], (p[1] if len(p) > 1 else None)
        lines = [
            f"sizes = {e[0]}.tolist()  # GroupedLinear: rows in {integer('groups', 2, 1)} groups"
        ]
        if flag("scale_bias"):
            lines += [
                f"parts = enumerate(zip({h}.split(sizes), {e[1]}.split(sizes)))",
                f"h = torch.cat([F.linear(xg, {w}[g]) + torch.outer(sg, {b}[g]) "
                "for g, (xg, sg) in parts])",
            ]
        else:
            bias = f", {b}[g]" if b else ""
            lines.append(
                f"h = torch.cat([F.linear(xg, {w}[g]{bias}) "
                f"for g, xg in enumerate({h}.split(sizes))])"
            )
        return lines, "h"
    if name == "Dispatch":
        sizes, probs, routing = outs[:3]
        return [
            f"group = torch.argmax({e[0]}.detach(), dim=1)  # Dispatch: row r to argmax(logits[r])",
            f"{routing} = torch.sort(group, stable=True).indices  # rows reordered by group",
            f"{sizes} = torch.bincount(group, minlength={integer('groups', 2, 1)}).to(torch.int64)",
            f"{probs} = torch.softmax({e[0]}, dim=1).gather(1, group.unsqueeze(1)).squeeze(1)"
            f".index_select(0, {routing})",
            f"h = {h}.index_select(0, {routing})",
        ], "h"
    if name in ("MakeExtraOutput", "RowStat", "DualExtraOutput", "Identity", *catalog.COLLECTIVES):
        # The collectives are identities on the unsharded tensors (catalog.collective).
        line = {
            **dict.fromkeys(catalog.COLLECTIVES),
            "MakeExtraOutput": f"{outs[0]} = {h}.view_as({h})" if outs else None,
            "RowStat": f"{outs[0]} = torch.mean(torch.square({h}), dim=-1)" if outs else None,
            "DualExtraOutput": f"{', '.join(outs[:2])} = {h} * {real('s0', 0.5)}, "
            f"{h} * {real('s1', -1.5)}",
            "Identity": None,
        }[name]
        return ([f"{line}  # {name}"] if line else []), h
    if name in ("RMSNorm", "LayerNorm"):
        features = op.param_shapes[0][0]
        gamma = f"1 + {p[0]}" if flag("zero_centered_gamma") else p[0]
        beta = f", {p[1]}" if name == "LayerNorm" else ""
        function = "F.rms_norm" if name == "RMSNorm" else "F.layer_norm"
        line = f"h = {function}({h}, ({features},), {gamma}{beta}, {real('eps', 1e-5)})"
        return [f"{line}  # {name}"], "h"
    expressions = {
        "Linear": f"F.linear({h}, {p[0] if p else None})",
        "Bias": f"{h} + {p[0] if p else None}",
        "ConstantScale": f"{h} * {real('scale', 0.5)}",
        "ReLU": f"torch.relu({h})",
        "GELU": f'F.gelu({h}, approximate="tanh")',
        "SReLU": f"torch.square(torch.relu({h}))",
        "ScaledSReLU": f"torch.square(torch.relu({h})) * {e[0] if e else None}.unsqueeze(-1)",
        "AddExtraInput": f"{h} + {e[0] if e else None}",
        "Combine": f"{h}.index_select(0, torch.argsort({e[0] if e else None}.to(torch.int64)))",
        "Reshape": f"{h}.reshape(-1, {integer('features', 0) or op.input_shape[-1]})",
    }
    if name not in expressions:
        raise ValueError(f"op {op.index}: no reference for catalog op '{name}'")
    return [f"h = {expressions[name]}  # {name}"], "h"


class _Writer:
    """Writes one compact script; each method returns a list of source lines."""

    def __init__(
        self, case, backend, paths, expect, case_file, values, allowances, expected=None, own=None
    ):
        self.case = case
        self.te = backend == "te"
        self.backend = backend
        self.paths = paths
        self.expect = expect
        self.case_file = case_file or "<case file>"
        self.values = values
        self.allowances = allowances
        self.picker = Picker()
        self.expects_error = expect.get("kind") == "error"
        # TE exposes no channel gradient to a user: a te script compares none.
        self.expected = expected and [self.exposed(call) for call in expected]
        # The paths with their own expectation (their fused ops' quantization points), among
        # those the script tests; the script then tests each path against its own
        # (EXPECTATIONS), the others against EXPECTED and BOUNDS.
        names = [p["name"] for p in self.paths]
        self.own = {
            name: dict(e, expected=[self.exposed(call) for call in e["expected"]])
            for name, e in (own or {}).items()
            if name in names and self.expected and not self.expects_error
        }
        self.baseline = False
        self.tail = []  # module-level statements after every definition
        self.recipe = parse_recipe(case.spec.get("recipe"))
        self.repeats = [
            (bool(c.get("no_grad", False)), bool(c.get("input_requires_grad", True)))
            for c in case.spec.get("repeat_calls") or []
        ]
        self.helpers = set()  # script-local helpers (TEMPLATES) the script needs
        self.own_fusions = False  # whether OWN_FUSIONS adds the adapter's to TE's
        self.tail_constants = []  # module-level constants the test reads (error kinds)
        # te ops whose parameters go through te/params.py's helpers: TE's grouped
        # parameters (single_grouped_*), main_grad buffers, delayed weight gradients.
        self.helper_ops = {
            op.index
            for op in case.catalog_ops
            if self.te and op.param_shapes and not self.plain_te_params(op)
        }
        multi = {}
        for op in case.catalog_ops:
            for channel in [c for c in op.input_channels if c] + [
                c for c, _ in op.output_bindings if c
            ]:
                multi.setdefault(channel, set()).add(op.fuser)
        self.channel_fusers = multi

    def exposed(self, tensors):
        """`tensors` ({name: t}) but channel gradients on te: TE exposes none to a user."""
        return {n: t for n, t in tensors.items() if not (self.te and n.startswith("grad_channel"))}

    @staticmethod
    def flag(op, attr):
        return float(op.attrs.get(attr, 0)) == 1.0

    @staticmethod
    def plain_te_params(op):
        """Whether TE's parameters of `op` are plain tensors the script copies by name."""
        if any(float(op.attrs.get(k, 0)) == 1.0 for k in PARAM_HELPER_ATTRS):
            return False
        return op.name in TE_PARAMS or op.name == "GroupedLinear"

    # -- names

    def param_value(self, op, j):
        kind = {"Linear": "W", "Bias": "B", "RMSNorm": "GAMMA", "GroupedLinear": "WB"}
        if op.name == "LayerNorm":
            return ("GAMMA", "BETA")[j] + str(op.index)
        if op.name == "GroupedLinear":
            return ("W", "B")[j] + str(op.index)
        return f"{kind.get(op.name, 'P')}{op.index}" + (f"_{j}" if j else "")

    def cotangent_value(self, k):
        return "DY" if k == 0 else f"DY{k}"

    def channel_var(self, fuser, channel):
        suffix = f"_f{fuser}" if len(self.channel_fusers.get(channel, ())) > 1 else ""
        return "c_" + _identifier(channel) + suffix

    def te_param_tensors(self, op, j, var):
        """TE's tensors of model parameter j of `op` (a plain-params op): one, or one per
        group (GroupedLinear's weight0.. / bias0.., grouped_linear.py)."""
        if op.name == "GroupedLinear":
            groups = catalog.attr_int(op.name, op.attrs, "groups", 2, 1)
            return [f"{var}.{('weight', 'bias')[j]}{g}" for g in range(groups)]
        return [f"{var}.{TE_PARAMS[op.name][j]}"]

    # -- the script

    def script(self):
        values = self.section_values()
        body = []
        if not self.expects_error and not self.expected:
            body += ["", ""] + self.section_reference()
        body += ["", ""] + (self.section_build_te() if self.te else self.section_build_torch())
        body += ["", ""] + self.section_run()
        body += ["", ""] + self.section_tests()
        body = values + self.tail_constants + body
        for name in self.values.helpers:
            self.picker.add(f"script_support.{name}")
        head = self.section_head()
        definitions = self.picker.source()
        blocks = self.picker.block_names()
        helpers = [self.template(name) for name in HELPER_ORDER if name in self.helpers]
        # What the module's top level runs (value decoding) comes first; the case and its
        # test next; gradfuzz's comparison after them, and last what the case's ops need
        # (the adapter's te.ops extensions, or the torch backend's runtime under test).
        early = set(self.values.helpers) | {"SCRIPT_DTYPES", "load_values"}
        first = [d for d, names in zip(definitions, blocks) if names & early]
        rest = [d for d, names in zip(definitions, blocks) if not names & early]
        parts = ["\n".join(head)]
        if first:
            parts.append("\n\n\n".join(first))
        parts.append("\n".join(body).strip("\n"))
        parts.append("\n\n\n".join(helpers))
        if rest:
            what = (
                "What the case's ops need that TE lacks, as TE users write it (gradfuzz_adapter/te)"
                if self.te
                else "The runtime under test: gradfuzz's torch backend (gradfuzz_adapter/"
                "torch_runtime.py, catalog.py), embedded so that the script stands alone"
            )
            parts.append(f"{EMBEDDED_MARK}\n# {what}\n\n\n" + "\n\n\n".join(rest))
        parts += ["\n".join(self.tail)] if self.tail else []
        return "\n\n\n".join(parts) + "\n"

    def template(self, name):
        """The source of script-local helper `name`. only_fusions names a fusion function
        after its class, or (grouped_mlp.py's module-level ones) after their owner where a
        path names one (te/fusions.py: fusion_name)."""
        text = TEMPLATES[name].strip("\n")
        if name != "only_fusions":
            return text
        if self.own_fusions:
            text = text.replace("OWN.get(", "OWN_FUSIONS.get(")
        else:
            text = text.replace(" + OWN.get(attr, [])", "")
        named = {f for path in self.paths for f in path.get("fusions") or []}
        owners = {k: v for k, v in FUNCTION_OWNERS.items() if v in named}
        if not owners:
            return text.replace("OWNERS.get(parts[-1], parts[-1])", "parts[-1]")
        line = f"    OWNERS = {owners!r}  # fusion functions outside a class"
        head, _, rest = text.partition("    def name(f):")
        return f"{head}{line}\n    def name(f):{rest}"

    def section_head(self):
        case = self.case
        ops = " -> ".join(op.name for op in case.ops)
        lines = [
            f'"""gradfuzz case {self.case_file} ({self.backend}, {case.dtype_name}, input '
            f"{list(case.input.shape)}): {ops}.",
            "",
            f"Reproduce: gradfuzz replay {self.case_file} --backend {self.backend}",
        ]
        if self.expects_error:
            lines.append(
                f"Expected: the case is invalid ({self.expect.get('error_kind')}); every path "
                "raises it and leaves no op locked."
            )
        else:
            lines.append(
                "Expected: outputs and gradients within gradfuzz's bounds of the float64 "
                "reference, no caller tensor changed"
                + ("; repeat calls plan as a fresh Sequential" if self.repeats else "")
                + "."
            )
        lines += [f"NOTE: {note}" for note in self.values.notes]
        if self.expected:
            what = (
                f"recipe {self.recipe.name} ({self.recipe.fp8_format})"
                if self.recipe is not None
                else "an activation's cache_quantized_input"
            )
            lines.append(
                f"Quantized by {what}: the expected values (EXPECTED) are gradfuzz's float64 "
                "reference with TE's quantize-dequantize (ops/quantization.cc)."
            )
        elif self.recipe is not None:
            lines.append(
                f"Recipe {self.recipe.name} ({self.recipe.fp8_format}): the reference is "
                "unquantized; the bounds are the oracle's for the quantized path."
            )
        lines[-1] += '"""'
        library = set(self.picker.imports()) - {"import torch.nn.functional as F"}
        library = sorted(library | ({"import os"} if self.te else set()))
        library.sort(key=lambda line: line.startswith("from"))
        lines += library
        third = ["import pytest", "import torch"]
        if "import torch.nn.functional as F" in self.picker.imports():
            third.append("import torch.nn.functional as F")
        if self.te:
            third += [
                "import transformer_engine.pytorch as te",
                "from transformer_engine.pytorch.ops.fuser import OperationFuser",
            ]
            if self.recipe is not None:
                third.append("from transformer_engine.common import recipe")
            lines += [
                "",
                'os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32',
            ]
            if any(
                float(op.attrs.get(k, 0)) == 1.0
                for op in case.catalog_ops
                for k in ("single_grouped_weight", "single_grouped_bias")
            ):
                lines.append(
                    'os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")'
                    "  # GroupedLinear's single_grouped_*"
                )
            third = [f"{line}  # noqa: E402" for line in third]
        lines += ([""] if library else []) + third + [""]
        if not self.te and case.device != "cpu":  # te: NVIDIA_TF32_OVERRIDE covers cuBLAS
            lines.append("torch.backends.cuda.matmul.allow_tf32 = False")
        device = "cuda" if self.te else case.device
        lines.append(f'DTYPE, DEVICE = torch.{case.dtype_name}, torch.device("{device}")')
        return lines

    def section_values(self):
        case, one = self.case, self.values.expr
        lines = ["# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype"]
        lines += self.values.prelude()
        lines.append(f"X = {one(case.input)}")
        for op in case.catalog_ops:
            for j, p in enumerate(op.params):
                lines.append(f"{self.param_value(op, j)} = {one(p)}")
        for k, e in enumerate(case.extra_inputs):
            lines.append(f"E{k} = {one(e)}")
        for k, c in enumerate(case.cotangents):
            if c is not None:
                lines.append(f"{self.cotangent_value(k)} = {one(c)}")
        for k, (x, extras) in enumerate(case.call_inputs):
            lines.append(f"CALL{k}_X = {one(x)}")
            lines += [f"CALL{k}_E{j} = {one(e)}" for j, e in enumerate(extras)]
        if self.recipe is not None and self.te:
            kwargs = ", ".join(f"{k}={v!r}" for k, v in te_kwargs(self.recipe).items())
            lines.append(
                f"RECIPE = recipe.{self.recipe.name}("
                f"fp8_format=recipe.Format.{self.recipe.fp8_format}"
                + (f", {kwargs}" if kwargs else "")
                + ")"
            )
        if not self.expects_error:
            lines += self.bounds()
            lines += self.shipped_expected()
            lines += self.path_expectations()
        return lines

    def shipped_expected(self, var="EXPECTED", calls=None):
        """EXPECTED: per call, the tensors the quantized reference computed."""
        calls = self.expected if calls is None else calls
        if not calls:
            return []
        lines = [f"{var} = [  # per call: tensor -> the float64 FP8 reference's value"]
        for call in calls:
            lines.append("    {")
            lines += [f"        {name!r}: {self.values.expr(t)}," for name, t in call.items()]
            lines.append("    },")
        return lines + ["]"]

    def path_expectations(self):
        """Each path's own bounds and expected values where its fused ops quantize elsewhere
        than its basic ops (<PATH>_BOUNDS, <PATH>_EXPECTED), and EXPECTATIONS: per path what
        its test holds it to, as replay judges each path against the reference of its own
        quantization points (docs/BACKENDS.md "Per-path quantization points")."""
        if not self.own:
            return []
        lines = []
        for name, e in self.own.items():
            var = _identifier(name).upper()
            lines += [
                f"# The {name} path's own reference: its fused ops quantize elsewhere than its "
                "basic ops",
                f"# (quantization points: {e['points']})",
            ]
            lines += self.bound_lines(f"{var}_BOUNDS", e["tensors"], e["allowances"])
            lines += self.shipped_expected(f"{var}_EXPECTED", e["expected"])
        pairs = [
            f"{p['name']!r}: "
            + (
                f"({_identifier(p['name']).upper()}_EXPECTED, {_identifier(p['name']).upper()}"
                "_BOUNDS)"
                if p["name"] in self.own
                else "(EXPECTED, BOUNDS)"
            )
            for p in self.paths
        ]
        return lines + self.wrapped("EXPECTATIONS = {", pairs, "}  # path: expected, bounds")

    def bounds(self):
        """BOUNDS (expect.tensors: per tensor name atol, rtol, allowance, norm bound) and
        FALLBACK for the others (expect.tolerance); without expect.tensors and with a
        rounding-baseline factor, FALLBACK carries the factor and the cap."""
        tolerance = dict(self.expect.get("tolerance") or {})
        atol, rtol = float(tolerance.get("atol", 1e-7)), float(tolerance.get("rtol", 1e-7))
        factor = float(tolerance.get("baseline_factor", 0.0) or 0.0)
        tensors = {
            name: bound
            for name, bound in (self.expect.get("tensors") or {}).items()
            if not (self.te and name.startswith("grad_channel"))  # TE exposes none
        }
        self.helpers.add("check")
        self.baseline = factor > 0 and not self.expect.get("tensors")
        if self.baseline:
            cap = float(tolerance.get("baseline_cap", 0.0) or 0.0)
            self.helpers.add("check_all_baseline")
            self.own = {}  # a rounding baseline, no bounds per tensor: one expectation
            return [f"FALLBACK = {(atol, rtol, factor, cap)!r}  # atol, rtol, baseline factor, cap"]
        self.helpers.add("check_all_paths" if self.own else "check_all")
        if not tensors:
            return [f"BOUNDS, FALLBACK = {{}}, {(atol, rtol)!r}  # no bound per tensor: atol, rtol"]
        lines = [f"FALLBACK = {(atol, rtol)!r}  # atol, rtol of the tensors BOUNDS does not name"]
        return lines + self.bound_lines("BOUNDS", tensors, self.allowances)

    def bound_lines(self, var, tensors, allowances):
        """`var` = {tensor: (atol, rtol, allowance, norm bound)} of expect.tensors-like
        `tensors` (te: no channel gradient), the allowances' values from `allowances`."""
        lines = [f"{var} = {{  # tensor: atol, rtol, per-element allowance, norm bound"]
        for name, bound in tensors.items():
            if self.te and name.startswith("grad_channel"):
                continue  # TE exposes none
            allowance = self.values.expr(allowances[name]) if name in allowances else None
            norm = bound.get("norm_bound")
            lines.append(
                f"    {name!r}: ({float(bound.get('atol', 0.0))!r}, "
                f"{float(bound.get('rtol', 0.0))!r}, {allowance}, "
                f"{None if norm is None else float(norm)!r}),"
            )
        return lines + ["}"]

    # -- the reference

    def leaf(self, value, floating=True, requires_grad="True"):
        """A fresh reference leaf of script value `value`, float64 (or the baseline dtype)."""
        if not floating:
            return value
        copy = f"{value}.to(dtype, copy=True)" if self.baseline else f"{value}.clone()"
        if requires_grad == "True":
            return f"{copy}.requires_grad_()"
        return copy if requires_grad == "False" else f"{copy}.requires_grad_({requires_grad})"

    def section_reference(self):
        case = self.case
        params = ["dtype=torch.float64"] if self.baseline else []
        x_grad = "input_requires_grad" if self.repeats else str(case.input_requires_grad)
        if self.repeats:
            params.append(f"input_requires_grad={case.input_requires_grad}")
        lines = [
            f"def reference({', '.join(params)}):",
            '    """The case in plain PyTorch on the CPU: what gradfuzz compares, by name."""',
            f"    x = {self.leaf('X', True, x_grad)}",
        ]
        leaves = ['("grad_input", x)']
        for op in case.catalog_ops:
            for j in range(len(op.params)):
                var = self.param_value(op, j).lower()
                rg = op.param_requires_grad[j]
                lines.append(f"    {var} = {self.leaf(self.param_value(op, j), True, str(rg))}")
                leaves.append(f'("grad_param[{op.index}].{op.name}[{j}]", {var})')
        for k, e in enumerate(case.extra_inputs):
            rg = case.extra_input_requires_grad[k] and e.is_floating_point()
            if e.is_floating_point():  # integers (split sizes, maps): E{k} itself
                lines.append(f"    e{k} = {self.leaf(f'E{k}', True, str(rg))}")
            if rg:
                leaves.append(f'("grad_extra_input[{k}]", e{k})')
        h, public, next_extra, channels = "x", [], 0, []
        for op in case.ops:
            if op.boundary:
                lines.append("    # Boundary: a plain module ends the fuser (channels end with it)")
                continue
            extras = []
            for channel in op.input_channels:
                if channel is None:
                    given = (case.extra_inputs + [None])[min(next_extra, len(case.extra_inputs))]
                    prefix = "e" if given is not None and given.is_floating_point() else "E"
                    extras.append(None if given is None else f"{prefix}{next_extra}")
                    next_extra += 1
                else:
                    extras.append(self.channel_var(op.fuser, channel))
            outs = []
            for s, (channel, to_caller) in enumerate(op.output_bindings):
                var = self.channel_var(op.fuser, channel) if channel else f"o{op.index}_{s}"
                outs.append(var)
                if channel:
                    channels.append((op.fuser, channel, var, op.extra_output_kinds[s]))
                if to_caller or channel is None:
                    public.append(var)
            params = [self.param_value(op, j).lower() for j in range(len(op.params))]
            op_lines, h = reference_lines(op, h, extras, params, outs)
            lines += [f"    {line}" for line in op_lines]
        if any("F." in line for line in lines):
            self.picker.library.add("F")
        cotangents = [
            self.cotangent_value(k) if c is not None else "None"
            for k, c in enumerate(case.cotangents)
        ]
        if not self.te:
            for fuser, channel, var, kind in channels:
                if kind == "float":
                    leaves.append(f'("{_channel_label(fuser, channel)}", {var})')
        call = f"results([{', '.join([h, *public])}], [{', '.join(cotangents)}], {{}})"
        lines += self.leaves_then("    return " + call, leaves)
        self.helpers.add("results")
        return lines

    # -- the case under test

    def build_head(self):
        # A torch script testing paths of their own builds each path's Sequential with its
        # fusions (torch_runtime.py: FUSIONS); a te script's paths pick TE's (only_fusions).
        arg = "state" if self.expects_error else "fusions=()" if self.own and not self.te else ""
        return [
            f"def build({arg}):",
            f'    """The case with {"te.ops" if self.te else "the runtime under test"}, '
            'as a user writes it: its Sequential and ops."""',
        ]

    def build_tail(self, sequential):
        """From the op list on: standalone calls, bindings, the Sequential, late binds."""
        ops = ", ".join(f"op{op.index}" for op in self.case.ops)
        lines = [
            f'    state["ops"] = ops = [{ops}]' if self.expects_error else f"    ops = [{ops}]"
        ]
        lines += self.standalone_calls()
        lines += self.bindings(keyword="output_to_caller=" if self.te else "")
        if self.expects_error:
            self.helpers.add("locked_te" if self.te else "locked_torch")
            lines.append('    state["locked_before"] = [locked(op) for op in ops]')
        # An error script records how far construction got (see error_test).
        built = '    state["model"] = ' if self.expects_error else "    "
        fusions = ", fusions=fusions" if self.own and not self.te else ""
        lines.append(f"{'    ' if self.te else built}model = {sequential}({ops}{fusions})")
        lines += self.late_binds()
        lines += ['    state["model"] = model'] if self.te and self.expects_error else []
        lines.append("    return model, ops")
        return lines

    def section_build_te(self):
        case = self.case
        lines = self.build_head()
        copies, after = [], []
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                self.picker.add("te.extensions.Boundary")
                lines.append(f"    {var} = Boundary()  # a plain module: ends the fuser")
                continue
            try:
                callee, args, kwargs = te_package.op_recipe(
                    op.name, op.attrs, op.input_shape, op.output_style
                )
                prefix = ""
            except NotImplementedError as e:
                callee, args, kwargs = te_package.op_recipe(
                    op.name, op.attrs, op.input_shape, "vector"
                )
                prefix = f"    # {e}: built with tuples\n"
            if not callee.startswith("te."):
                self.picker.add(f"te.extensions.{callee}")
            lines.append(f"{prefix}    {var} = {te_package.render_call(callee, args, kwargs)}")
            if not op.param_shapes:
                continue
            values = [self.param_value(op, j) for j in range(len(op.params))]
            if op.index in self.helper_ops:
                for helper in ("copy_param_values", "set_param_requires_grad", "attach_main_grads"):
                    self.picker.add(f"te.params.{helper}")
                after += [
                    f'    copy_param_values({var}, "{op.name}", '
                    f"[v.to(DEVICE, DTYPE) for v in ({', '.join(values)},)])",
                    f'    set_param_requires_grad({var}, "{op.name}", {op.param_requires_grad!r})',
                    f'    attach_main_grads({var}, "{op.name}")',
                ]
                continue
            for j, value in enumerate(values):
                tensors = self.te_param_tensors(op, j, var)
                for g, t in enumerate(tensors):
                    index = f"[{g}]" if op.name == "GroupedLinear" else ""
                    copies.append(f"        {t}.copy_({value}{index})")
                    if not op.param_requires_grad[j]:
                        after.append(f"    {t}.requires_grad_(False)")
                    if j == 0 and self.flag(op, "accumulate_into_main_grad"):
                        # What a Megatron-LM user attaches before backward (te/params.py:
                        # attach_main_grads): TE's wgrad GEMM accumulates into it.
                        after.append(
                            f"    {t}.main_grad = torch.zeros({t}.shape, dtype=torch.float32, "
                            "device=DEVICE)"
                        )
        if copies:
            lines += ["    with torch.no_grad():", *copies]
        lines += after
        lines += self.build_tail("te.ops.Sequential")
        # The adapter's FusedResidual, registered in the passes the paths name (as
        # te/extensions.py: register_fusions registers all three), where it can fire.
        named = {f for path in self.paths for f in path.get("fusions") or []}
        own = {}
        for fusion, (function, attr) in RESIDUAL_FUSIONS.items():
            if fusion in named and self.residual_window():
                self.picker.add(f"te.extensions.{function}")
                own[attr] = f"[{function}]"
        if own:
            entries = ", ".join(f'"{attr}": {functions}' for attr, functions in own.items())
            self.own_fusions = True
            self.tail = [
                "# The adapter's FusedResidual, added to TE's fusion lists for each test by",
                "# only_fusions (TE's register functions would add it for the whole process)",
                *self.wrapped("OWN_FUSIONS = {", [entries], "}"),
            ]
        return lines

    def residual_window(self):
        """Whether a fuser holds MakeExtraOutput, an op without extra tensors, AddExtraInput
        in a row: the only place FusedResidual can fire (te/extensions.py: residual_pattern,
        which also needs the two bound to one channel; other fusions only ever replace ops
        by fused ops, which it skips). Without one, registering it would change nothing."""
        ops = self.case.ops
        return any(
            a.name == "MakeExtraOutput"
            and c.name == "AddExtraInput"
            and a.fuser == b.fuser == c.fuser
            and not (b.extra_input_kinds or b.extra_output_kinds)
            for a, b, c in zip(ops, ops[1:], ops[2:])
            if not b.boundary
        )

    def section_build_torch(self):
        case = self.case
        for name in ("BasicOp", "Boundary", "Sequential"):
            self.picker.add(f"torch_runtime.{name}")
        lines = self.build_head()
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
            if self.quantized(op):
                self.picker.add("recipes.OpQuantization")
                self.picker.add("recipes.parse_recipe")
                lines.append(
                    f'    {var}.quantization = OpQuantization("{op.name}", {attrs!r}, '
                    f"parse_recipe({case.spec.get('recipe')!r}))"
                )
            for j in range(len(op.params)):
                copies.append(f"        {var}.params[{j}].copy_({self.param_value(op, j)})")
                # BasicOp's parameters start as plain tensors (no requires_grad).
                after.append(f"    {var}.params[{j}].requires_grad_({op.param_requires_grad[j]})")
        if copies:
            lines += ["    with torch.no_grad():", *copies]
        lines += after
        return lines + self.build_tail("Sequential")

    def quantized(self, op):
        if self.recipe is not None:
            return True
        return float(op.attrs.get("cache_quantized_input", 0)) == 1.0

    def standalone_calls(self):
        lines = []
        for k, (index, grad_mode) in enumerate(self.case.call_then_bind):
            x, given = self.case.call_inputs[k]
            extras = "".join(
                ", " + self.to_device(f"CALL{k}_E{j}", e, grad_mode) for j, e in enumerate(given)
            )
            lines += [
                f"    with torch.set_grad_enabled({grad_mode}):  # op {index} called on its own",
                f"        op{index}({self.to_device(f'CALL{k}_X', x, grad_mode)}{extras})",
            ]
        return lines

    def bindings(self, keyword):
        lines = []
        for op in self.case.catalog_ops:
            for slot, channel in op.bound_inputs:
                lines.append(f"    op{op.index}.set_extra_input_channel({slot}, {channel!r})")
            for slot, channel, to_caller in op.bound_outputs:
                lines.append(
                    f"    op{op.index}.set_extra_output_channel({slot}, {channel!r}, "
                    f"{keyword}{to_caller})"
                )
        return lines

    def late_binds(self):
        return [
            f"    op{index}.set_extra_input_channel({slot}, {channel!r})  # after the Sequential"
            for index, slot, channel in self.case.late_binds
        ]

    def section_run(self):
        """run(): one call of the model as the oracle makes it: what the oracle compares,
        and the caller tensors it changed."""
        case, repeats = self.case, bool(self.repeats)
        extras = []
        for k, e in enumerate(case.extra_inputs):
            rg = case.extra_input_requires_grad[k] and e.is_floating_point()
            extras.append(self.to_device(f"E{k}", e, rg))
        cotangents = [
            self.to_device(self.cotangent_value(k), c) if c is not None else "None"
            for k, c in enumerate(case.cotangents)
        ]
        caller = ['"input": x'] + [f'"extra_input[{k}]": extras[{k}]' for k in range(len(extras))]
        caller += [
            f'"cotangent[{k}]": dys[{k}]' for k, c in enumerate(case.cotangents) if c is not None
        ]
        x = "X.to(DEVICE, DTYPE, copy=True)"
        if repeats:
            x += ".requires_grad_(input_requires_grad)"
        elif case.input_requires_grad:
            x += ".requires_grad_()"
        signature = "model, ops" + (
            f", input_requires_grad={case.input_requires_grad}, no_grad=False" if repeats else ""
        )
        lines = [
            f"def run({signature}):",
            '    """One call as gradfuzz makes it: what the oracle compares, by name; caller '
            'tensors changed."""',
            f"    x = {x}",
        ]
        lines += self.wrapped("    extras = [", extras, "]") if extras else []
        lines += self.wrapped("    dys = [", cotangents, "]")
        if len(", ".join(caller)) <= 80:
            lines.append(f"    caller = {{{', '.join(caller)}}}")
        else:
            lines += CALLER_LINES if extras else [CALLER_LINE]
        lines.append("    pristine = {n: t.detach().clone() for n, t in caller.items()}")
        contexts = (["torch.set_grad_enabled(not no_grad)"] if repeats else []) + (
            ["te.autocast(recipe=RECIPE)"] if self.recipe is not None and self.te else []
        )
        # DelayedScaling's updates, as TE's autocast exit and first-module backward do them.
        delayed = self.recipe is not None and not self.te
        quantizations = "[op.quantization for op in ops if getattr(op, 'quantization', None)]"
        call = f"y = model(x{', *extras' if extras else ''})"
        if contexts:
            lines += [f"    with {', '.join(contexts)}:", f"        {call}"]
            if delayed:
                lines.append(f"        update_after_forward({quantizations})")
        else:
            lines.append(f"    {call}")
            if delayed:
                lines.append(f"    update_after_forward({quantizations})")
        if delayed:
            self.picker.add("recipes.update_after_forward")
            self.picker.add("recipes.update_after_backward")
        leaves = ['("grad_input", x)']
        finish = []
        groups = False
        for op in case.catalog_ops:
            var = f"ops[{op.index}]"
            if op.index in self.helper_ops:
                for helper in ("param_leaves", "model_param_grads", "finish_weight_gradients"):
                    self.picker.add(f"te.params.{helper}")
                leaves.append(
                    f'*[(f"op{op.index}.{{k}}", t) for k, t in '
                    f'enumerate(param_leaves({var}, "{op.name}"))]'
                )
                finish += [
                    f"finish_weight_gradients({var})",
                    f'by_id = {{id(t): got.pop(f"op{op.index}.{{k}}", None) for k, t in '
                    f'enumerate(param_leaves({var}, "{op.name}"))}}',
                    f'for j, g in enumerate(model_param_grads({var}, "{op.name}", by_id)):',
                    f'    got[f"grad_param[{op.index}].{op.name}[{{j}}]"] = g',
                ]
                continue
            for j in range(len(op.params)):
                if self.te:
                    tensors = self.te_param_tensors(op, j, var)
                    groups |= len(tensors) > 1 or op.name == "GroupedLinear"
                    leaf = f"[{', '.join(tensors)}]" if op.name == "GroupedLinear" else tensors[0]
                else:
                    leaf = f"{var}.params[{j}]"
                leaves.append(f'("grad_param[{op.index}].{op.name}[{j}]", {leaf})')
            if self.te and op.params and op.param_requires_grad[0]:
                finish += self.weight_gradient(op, var)
        for k, e in enumerate(case.extra_inputs):
            if case.extra_input_requires_grad[k] and e.is_floating_point():
                leaves.append(f'("grad_extra_input[{k}]", extras[{k}])')
        if not self.te:
            leaves.append("*channel_leaves(model)")
            self.helpers.add("channel_leaves")
        if repeats:
            lines += self.wrapped("    leaves = [] if no_grad else [", leaves, "]")
            lines.append("    got = results(y, [] if no_grad else dys, leaves, zeros=False)")
        else:
            lines += self.leaves_then("    got = results(y, dys, {}, zeros=False)", leaves)
        if delayed:
            lines.append(f"    update_after_backward({quantizations})")
        if finish:
            indent = "        " if repeats else "    "
            lines += ["    if not no_grad:"] if repeats else []
            lines += [indent + line for line in finish]
        # Changed by value, a NaN where there was one unchanged (as replay judges).
        lines += [
            "    changed = [n for n, t in caller.items() if t.shape != pristine[n].shape or not",
            "               torch.isclose(t, pristine[n], rtol=0, atol=0, equal_nan=True).all()]",
            "    return got, changed",
        ]
        self.helpers.add("results_groups" if groups else "results")
        if groups:
            self.helpers.discard("results")
        return lines

    @staticmethod
    def to_device(name, t, requires_grad=False):
        """A fresh copy of value `name` on DEVICE, floating ones in DTYPE."""
        if not t.is_floating_point():
            return f"{name}.to(DEVICE, copy=True)"
        return f"{name}.to(DEVICE, DTYPE, copy=True)" + (
            ".requires_grad_()" if requires_grad else ""
        )

    def weight_gradient(self, op, var):
        """run()'s lines that read a te op's weight gradient where TE puts it outside
        autograd's result (te/params.py: model_param_grads): in main_grad with
        accumulate_into_main_grad, in .grad after backward_dw with delay_wgrad_compute."""
        main, delay = (
            self.flag(op, k) for k in ("accumulate_into_main_grad", "delay_wgrad_compute")
        )
        if not (main or delay):
            return []
        lines = [f"if {var}.need_backward_dw():", f"    {var}.backward_dw()"] if delay else []
        attr = "main_grad" if main else "grad"
        tensors = [f"{t}.{attr}" for t in self.te_param_tensors(op, 0, var)]
        value = f"torch.stack([{', '.join(tensors)}])" if op.name == "GroupedLinear" else tensors[0]
        return lines + [f'got["grad_param[{op.index}].{op.name}[0]"] = {value}  # not autograd\'s']

    def grad_buffers(self):
        """Whether a repeat call must first clear gradients TE accumulated (driver.py:
        before_repeat_call): main_grad buffers, .grad of delayed weight gradients."""
        return bool(self.helper_ops) or any(
            self.flag(op, k)
            for op in self.case.catalog_ops
            for k in ("accumulate_into_main_grad", "delay_wgrad_compute")
            if self.te
        )

    def leaves_then(self, statement, leaves):
        """`statement` with the leaf list in place of {}, wrapped under its opening bracket."""
        before, _, after = statement.partition("{}")
        return self.wrapped(before + "[", leaves, "]" + after)

    @staticmethod
    def wrapped(opening, items, closing, width=100):
        """`opening` + items + `closing`, the items filling lines of `width` under the first
        (a visual indent), e.g. `leaves = [("grad_input", x), ...,` / `          (...)]`."""
        indent = " " * len(opening)
        lines, line = [], opening
        for k, item in enumerate(items):
            text = item + (closing if k == len(items) - 1 else ",")
            if line not in (opening, indent) and len(line) + 1 + len(text) > width:
                lines.append(line)
                line = indent
            line += ("" if line in (opening, indent) else " ") + text
        return lines + [line if items else opening + closing]

    def test_head(self, name):
        """The decorator and def line of the test: one test per path on te (its fusions);
        the torch runtime fuses only under a recipe (torch_runtime.py: FUSIONS), so its
        paths are one test unless a path has an expectation of its own. With such a path
        each test also gets its path's name (EXPECTATIONS)."""
        ids = [p["name"] for p in self.paths]
        if self.own:
            cases = [(p["name"], list(p.get("fusions") or [])) for p in self.paths]
            head = self.wrapped(
                '@pytest.mark.parametrize("path, fusions", [',
                [repr(c) for c in cases],
                f"], ids={ids!r})",
            )
            if not self.te:
                return head + [f"def {name}(path, fusions):"]
            self.helpers.add("only_fusions")
            return head + [f"def {name}(path, fusions, monkeypatch):"]
        if not self.te:
            return [f"def {name}():"]
        self.helpers.add("only_fusions")
        fusions = [list(p.get("fusions") or []) for p in self.paths]
        return [
            f'@pytest.mark.parametrize("fusions", {fusions!r}, ids={ids!r})',
            f"def {name}(fusions, monkeypatch):",
        ]

    def section_tests(self):
        if self.expects_error:
            return self.error_test()
        lines = self.test_head("test_case")
        lines += ["    only_fusions(monkeypatch, fusions)"] if self.te else []
        build = "build(fusions)" if self.own and not self.te else "build()"
        if self.own:
            lines.append("    expected, bounds = EXPECTATIONS[path]  # its quantization points'")
        wanted = (
            "expected[0], bounds" if self.own else "EXPECTED[0]" if self.expected else "reference()"
        )
        lines += [
            f"    model, ops = {build}" if self.repeats else f"    got, changed = run(*{build})",
            *(["    got, changed = run(model, ops)"] if self.repeats else []),
            f"    problems = check_all(got, {wanted}"
            + (", reference(DTYPE))  # and the rounding baseline" if self.baseline else ")"),
            '    problems += [f"{n}: changed by the call (a caller tensor)" for n in changed]',
        ]
        if self.repeats:
            lines += self.repeat_lines()
        lines.append('    assert not problems, "\\n".join(problems)')
        return lines

    def repeat_lines(self):
        """Each repeat call of the same Sequential: its values against the reference's (or the
        shipped EXPECTED), its caller tensors, and on te each fuser's plans against those of
        a fresh Sequential. Accumulated gradients are cleared before it (driver.py:
        before_repeat_call) where the script reads them (te/params.py: main_grad, delayed
        weight gradients); autograd.grad fills no other. The torch runtime plans one group
        per op whatever the call (torch_runtime.py: Fuser.plan), so its scripts compare no
        plans."""
        wanted = (
            "expected[k]"
            if self.own
            else "EXPECTED[k]"
            if self.expected
            else "reference(input_requires_grad=input_requires_grad)"
        )
        lines = [
            "    # Repeat calls of the same Sequential (same values): the reference's values"
            + (", the plans of a fresh one" if self.te else ""),
            f"    for k, (no_grad, input_requires_grad) in enumerate({self.repeats!r}, start=1):",
            f"        wanted = {wanted}",
        ]
        if self.baseline:
            lines.append("        baseline = reference(DTYPE, input_requires_grad)")
        if self.te:  # no channel gradient: TE exposes none
            lines.append(
                "        wanted = {n: t for n, t in wanted.items() "
                'if not (no_grad and n.startswith("grad"))}'
            )
        else:
            lines += [
                '        skip = ("grad",) if no_grad else ("grad_channel",)  '
                "# no channels in repeats",
                "        wanted = {n: t for n, t in wanted.items() if not n.startswith(skip)}",
            ]
        if self.grad_buffers():
            self.helpers.add("before_repeat_call")
            lines.append("        before_repeat_call(ops)")
        lines.append("        got, changed = run(model, ops, input_requires_grad, no_grad)")
        if self.te:
            lines += [
                "        fresh, fresh_ops = build()",
                "        run(fresh, fresh_ops, input_requires_grad, no_grad)",
            ]
        else:
            lines.append(
                '        got = {n: t for n, t in got.items() if not n.startswith("grad_channel")}'
            )
        lines += [
            f'        problems += [f"call[{{k}}] {{p}}" for p in check_all(got, wanted'
            f"{', baseline' if self.baseline else ', bounds' if self.own else ''})]",
            '        problems += [f"call[{k}] {n}: changed by the call" for n in changed]',
        ]
        if self.te:
            self.helpers.add("plans")
            lines += [
                "        if plans(model) != plans(fresh):",
                '            problems.append(f"call[{k}] plans {plans(model)}, '
                "a fresh Sequential's "
                '{plans(fresh)}")',
            ]
        return lines

    def error_test(self):
        kind = self.expect.get("error_kind", "unrecognized")
        lines = self.test_head(f"test_case_raises_{kind.replace('-', '_')}")
        if self.te:
            types_, pattern = te_package.RAISES.get(kind, (("Exception",), None))
            raises = "(" + ", ".join(types_) + ",)"
            match = f", match={pattern!r}" if pattern else ""
            lines += [
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
                self.picker.library.add("re")
                others = "|".join(p for p, k in te_package.KINDS if k != kind)
                self.tail_constants.append(f"OTHER_KINDS = {others!r}  # te/classify.py: KINDS")
                lines.append(
                    "    assert not re.search(OTHER_KINDS, str(raised.value)), raised.value"
                )
        else:
            self.picker.add("errors.GradfuzzError")
            lines += [
                f'    """gradfuzz\'s reference rejects this configuration ({kind}), and a failed',
                '    construction must leave every op as it was (unlocked)."""',
                "    state = {}",
                "    with pytest.raises(GradfuzzError) as raised:",
                "        run(*build(state))",
                f"    assert raised.value.kind == {kind!r}, raised.value",
            ]
        # A failed construction must leave its ops unlocked, where the backend checks it
        # (te/backend.py, torch_backend.py: left_locked): TE builds its fusers at the
        # first forward, and one that fails there leaves _module_groups unset; the torch
        # runtime builds them in the Sequential's constructor. An error after that (a
        # late bind into a locked op) is no failed construction.
        failed = (
            '    model = state.get("model")  # TE\'s fusers: built at the first forward\n'
            '    if model is not None and getattr(model, "_module_groups", None) is None:'
            if self.te
            else '    if "locked_before" in state and "model" not in state:  # in Sequential()'
        )
        lines += [
            *failed.split("\n"),
            '        before = state["locked_before"]',
            '        left = [i for i, op in enumerate(state["ops"]) '
            "if locked(op) and not before[i]]",
            '        assert not left, f"ops {left} left locked by the failed construction"',
        ]
        return lines


# run()'s caller tensors by name, where the literal dict does not fit a line.
CALLER_LINE = (
    '    caller = {"input": x, '
    '**{f"cotangent[{k}]": c for k, c in enumerate(dys) if c is not None}}'
)
CALLER_LINES = [
    '    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)}}',
    '    caller.update({f"cotangent[{k}]": c for k, c in enumerate(dys) if c is not None})',
]

# The adapter's fusion per name: its function and TE's list of that pass (fuser.py, as
# ops/__init__.py: register_*_fusion append to it).
RESIDUAL_FUSIONS = {
    "FusedResidual.forward": ("fuse_residual_forward", "forward_fusion_functions"),
    "FusedResidual.backward": ("fuse_residual_backward", "backward_fusion_functions"),
    "FusedResidual.joint": ("fuse_residual_joint", "forward_backward_fusion_functions"),
}

# GroupedLinear options under which TE keeps a parameter as one GroupedTensor, whose values
# live in its packed data: te/params.py's helpers read and write those.
PARAM_HELPER_ATTRS = ("single_grouped_weight", "single_grouped_bias")

# Script-local helpers, emitted when used (in this order).
HELPER_ORDER = (
    "results",
    "results_groups",
    "check",
    "check_all",
    "check_all_paths",
    "check_all_baseline",
    "only_fusions",
    "channel_leaves",
    "locked_te",
    "locked_torch",
    "before_repeat_call",
    "plans",
)

TEMPLATES = {
    "results": '''
def results(outputs, cotangents, leaves, zeros=True):
    """The outputs by name, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named
    leaves requiring grad; where nothing reached one: zeros, or None with zeros=False."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach()
           for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    leaves = [(n, t) for n, t in leaves if t is not None and t.requires_grad]
    if pairs and leaves:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in leaves],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(leaves, grads):
            got[n] = (torch.zeros_like(t) if zeros else None) if g is None else g
    return got
''',
    "results_groups": '''
def results(outputs, cotangents, leaves, zeros=True):
    """The outputs by name, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named
    leaves requiring grad (a list: one per group, stacked, None if one has none); where
    nothing reached one: zeros, or None with zeros=False."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach()
           for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    flat = [(n, t) for n, ts in leaves for t in (ts if isinstance(ts, list) else [ts])
            if t is not None and t.requires_grad]
    if pairs and flat:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in flat],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(flat, grads):
            zero = torch.zeros_like(t) if zeros else None
            got.setdefault(n, []).append(zero if g is None else g)
        for n, ts in [(n, ts) for n, ts in leaves if n in got]:
            stacked = torch.stack(got[n]) if all(g is not None for g in got[n]) else None
            got[n] = stacked if isinstance(ts, list) else got[n][0]
    return got
''',
    "check": '''
def check(name, got, e, atol, rtol, allowance=None, norm_bound=None):
    """Why `got` is off gradfuzz's bound of `e` (oracle/oracle.h), or None: all finite, |got - e|
    <= atol + rtol (rms(e) + |e|) + allowance (unjudged where inf), ||got - e|| <= norm_bound."""
    if got is None:
        fine = e is None or e.numel() == 0 or (name.startswith("grad") and not e.any())
        return None if fine else f"{name}: none returned"
    got = got.detach().to("cpu", torch.float64)
    e = torch.zeros_like(got) if e is None else e.detach().to(torch.float64)
    if got.shape != e.shape:
        return f"{name}: shape {list(got.shape)}, expected {list(e.shape)}"
    a = torch.zeros_like(e) if allowance is None else allowance.double()
    judged, finite, diff = ~a.isinf(), got.isfinite() & e.isfinite(), (got - e).abs()
    rms = torch.where(e.isfinite(), e, 0).square().mean().sqrt()
    bad = judged & (~finite | (diff > atol + rtol * (rms + e.abs()) + torch.where(judged, a, 0)))
    if bad.any():
        k = int(torch.where(bad, torch.nan_to_num(diff, nan=float("inf")), -1).argmax())
        return (f"{name}: {int(bad.sum())} of {e.numel()} off, worst at flat index {k}: got "
                f"{got.flatten()[k]:.9g}, expected {e.flatten()[k]:.9g}")
    error = torch.where(judged & finite, diff, 0).norm()
    if norm_bound is not None and error > norm_bound:
        return f"{name}: error norm {float(error):.3g} > {norm_bound:.3g}"
''',
    "check_all": '''
def check_all(got, expected):
    """What is off among the tensors either side has (channels: the reference's), by BOUNDS."""
    names = [n for n in {**expected, **got} if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *BOUNDS.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]
''',
    "check_all_paths": '''
def check_all(got, expected, bounds):
    """What is off among the tensors either side has (channels: the reference's), by `bounds`
    (the path's own, EXPECTATIONS; FALLBACK for the tensors it does not name)."""
    names = [n for n in {**expected, **got} if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *bounds.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]
''',
    "check_all_baseline": '''
def check_all(got, expected, baseline):
    """What is off among the tensors either side has (channels: those the reference has),
    under FALLBACK: atol, rtol and the rounding allowance min(factor |b - e|, cap max(|e|,
    rms(e))) of the baseline b, the reference run in the case dtype."""
    atol, rtol, factor, cap = FALLBACK
    problems = []
    for n in {**expected, **got}:
        e, b = expected.get(n), (baseline or {}).get(n)
        if n not in expected and n.startswith("grad_channel"):
            continue
        allowance = None
        if e is not None and b is not None and e.is_floating_point():  # integers: exact
            rms = torch.where(e.isfinite(), e, 0).square().mean().sqrt()
            rounding = torch.nan_to_num((b.double() - e).abs(), 0.0, 0.0, 0.0)
            allowance = torch.minimum(factor * rounding, cap * torch.clamp(e.abs(), min=rms))
        problems.append(check(n, got.get(n), e, atol, rtol, allowance))
    return [p for p in problems if p]
''',
    "only_fusions": '''
def only_fusions(monkeypatch, names):
    """Only the fusions called `names` in TE's registry (fuser.py: OperationFuser's lists)."""
    def name(f):
        parts = f.__qualname__.split(".")
        owner = parts[-2] if len(parts) > 1 and parts[-2] != "<locals>" else None
        return getattr(f, "gradfuzz_fusion_name", None) or owner or OWNERS.get(parts[-1], parts[-1])
    for attr in [a for a in dir(OperationFuser) if a.endswith("_fusion_functions")]:
        functions = getattr(OperationFuser, attr) + OWN.get(attr, [])
        monkeypatch.setattr(OperationFuser, attr, [f for f in functions if name(f) in names])
''',
    "channel_leaves": '''
def channel_leaves(model):
    """The runtime's channel values of the last forward, named as the oracle names them."""
    return [(f"grad_channel[{name}{'' if f == 0 else f'@fuser{f}'}]", t)
            for f, fuser in enumerate(model.fusers) for name, t in fuser.channels.items()
            if t is not None and t.is_floating_point()]
''',
    "locked_te": """
def locked(op):
    return bool(getattr(op, "_extra_tensor_channels_locked", False))  # op.py
""",
    "locked_torch": """
def locked(op):
    return bool(getattr(op, "locked", False))
""",
    "before_repeat_call": '''
def before_repeat_call(ops):
    """Between two steps, as a training loop: accumulated parameter gradients cleared."""
    for p in [p for op in ops if hasattr(op, "parameters") for p in op.parameters()]:
        p.grad = None
        if getattr(p, "main_grad", None) is not None:
            p.main_grad.zero_()
''',
    "plans": '''
def plans(model):
    """Each fuser's plans of its last call: (op, basic op indices) per pass."""
    fusers = [m for m in getattr(model, "_module_groups", None) or [] if hasattr(m, "_forward_ops")]
    return [[[(getattr(op, "fusion_name", type(op).__name__), idxs) for op, idxs in ops]
             for ops in (f._forward_ops, f._backward_ops)] for f in fusers]
''',
}
