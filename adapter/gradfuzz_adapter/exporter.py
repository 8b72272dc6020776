"""`export`: a case as a pytest file that a TE maintainer can read and paste into TE's
tests/pytorch (../shared/spec/te-backend.md "Export", issue 15 item 4).

The compact form (the default) holds only what the case uses, laid out as TE's own tests
lay out a fusible-op test: the drawn values (script_values.py), a float64 plain-PyTorch
reference written out op by op with gradfuzz's catalog functions of those ops only, the
case built with te.ops as a user builds it (constructors, parameter copies, standalone
calls, channel bindings, Sequential; the adapter's custom ops' classes where used), and one
test per path that makes every check gradfuzz's oracle makes for such a case:

- every output and gradient against the reference, under the request's per-tensor bounds
  (`expect.tensors`: {"atol", "rtol", "allowance", "norm_bound"} by the oracle's tensor
  name; else `expect.tolerance` with the rounding baseline, the reference in the case dtype);
- no caller-owned tensor (input, extra inputs, cotangents) changed by the call;
- an expected error raised with TE's type and message (te/classify.py RAISES) or the
  runtime's kind (torch), and no op left locked by a failed construction;
- each repeat call (`spec.repeat_calls`): its values against the reference, and each
  fuser's plans equal to those of a fresh Sequential at its first call with that call's
  requires-grad pattern.

The script fails exactly where replay finds a defect (channel gradients excepted for te:
TE does not expose them to a user). `"full": true` in the request writes the full,
self-contained form instead (exporter_full.py). Generating a te script never imports TE.
"""

import keyword
import re

from . import catalog
from . import te as te_package
from .exporter_full import full_script
from .recipes import parse_recipe, te_kwargs
from .script_values import ScriptValues
from .source_picker import Picker

# Catalog ops whose TE parameters the script copies by name (te/params.py: param_groups);
# the others' (GroupedLinear) go through the embedded te/params.py helpers.
TE_PARAMS = {"Linear": ["weight"], "Bias": ["bias"], "RMSNorm": ["weight"]}
TE_PARAMS["LayerNorm"] = ["weight", "bias"]


def export_reply(case, request, default_backend, tensors=()):
    """The reply to an `export` request (docs/BACKENDS.md): {"ok", "script", "notes"}; writes
    the request's `data_file` when values do not fit the script (script_values.py)."""
    data_file = request.get("data_file") or None
    expect = request.get("expect") or {"kind": "pass"}
    allowances = _allowances(expect, tensors)
    expected = _shipped_expectation(expect, tensors)
    extra = dict(allowances)
    for k, call in enumerate(expected or []):
        extra.update({f"expected call[{k}] {name}": t for name, t in call.items()})
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
    )
    values.save()
    reply = {"ok": True, "script": script, "notes": values.notes}
    if values.data:
        reply["data_file"] = data_file
    return reply


def _shipped_expectation(expect, tensors):
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

    calls = [one(expect["expected"], "expect.expected")]
    repeats = expect.get("repeat_expected") or []
    if not isinstance(repeats, list):
        raise ValueError("expect.repeat_expected: expected a list, one object per repeat call")
    calls += [one(r, f"expect.repeat_expected[{k}]") for k, r in enumerate(repeats)]
    return calls


def _allowances(expect, tensors):
    """{tensor name: allowance tensor} from expect.tensors' "allowance" indices."""
    out = {}
    for name, bound in (expect.get("tensors") or {}).items():
        ref = bound.get("allowance")
        if ref is not None:
            if not isinstance(ref, int) or not 0 <= ref < len(tensors):
                raise ValueError(f"expect.tensors[{name!r}].allowance: no tensor {ref!r}")
            out[name] = tensors[ref]
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
):
    """The pytest file for `case` on `backend` ("te" or "torch"): the compact form, or with
    `full` the self-contained one. `expected` ([{name: tensor}] per call): values the
    script compares with instead of its own reference (a quantizing case's)."""
    if backend not in ("te", "torch"):
        raise ValueError(f"export writes te or torch scripts, got '{backend}'")
    if full and expected:
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
        case, backend, paths, expect or {}, case_file, values, allowances, expected
    ).script()


def _identifier(text):
    name = re.sub(r"\W", "_", text)
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"_{name}"


def _channel_label(fuser, channel):
    """The oracle's name of a channel gradient (oracle/oracle.cc: channel_label)."""
    return f"grad_channel[{channel}{'' if fuser == 0 else f'@fuser{fuser}'}]"


class _Writer:
    """Writes one compact script; each method returns a list of source lines."""

    def __init__(self, case, backend, paths, expect, case_file, values, allowances, expected=None):
        self.case = case
        self.expected = expected  # [{name: tensor}] per call, or None
        self.te = backend == "te"
        self.backend = backend
        self.paths = paths
        self.expect = expect
        self.case_file = case_file or "<case file>"
        self.values = values
        self.allowances = allowances
        self.picker = Picker()
        self.expects_error = expect.get("kind") == "error"
        self.baseline = False
        self.tail = []  # module-level statements after every definition
        self.recipe = parse_recipe(case.spec.get("recipe"))
        self.repeats = [
            (bool(c.get("no_grad", False)), bool(c.get("input_requires_grad", True)))
            for c in case.spec.get("repeat_calls") or []
        ]
        self.helpers = set()  # script-local helpers (TEMPLATES) the script needs
        self.helper_ops = {
            op.index
            for op in case.catalog_ops
            if self.te
            and op.param_shapes
            and (
                op.name not in TE_PARAMS
                or float(op.attrs.get("accumulate_into_main_grad", 0)) == 1.0
            )
        }
        multi = {}
        for op in case.catalog_ops:
            for channel in [c for c in op.input_channels if c] + [
                c for c, _ in op.output_bindings if c
            ]:
                multi.setdefault(channel, set()).add(op.fuser)
        self.channel_fusers = multi

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

    # -- the script

    def script(self):
        body = []
        body += self.section_values()
        body += ["", ""] + self.section_reference() if not self.expects_error else []
        body += ["", ""] + (self.section_build_te() if self.te else self.section_build_torch())
        body += ["", ""] + self.section_call()
        body += ["", ""] + self.section_tests()
        self.need_library()
        for name in self.helpers:
            for dependency in TEMPLATE_NEEDS.get(name, ()):
                if "." in dependency:
                    self.picker.add(dependency)
                else:
                    self.picker.library.add(dependency)
        head = self.section_head()
        definitions = self.picker.source()
        helpers = [TEMPLATES[name].strip("\n") for name in HELPER_ORDER if name in self.helpers]
        # What the module's top level runs (value decoding, registering FusedResidual) comes
        # first; the case and its test next; the rest (the catalog functions, custom ops,
        # gradfuzz's comparison) at the end, where a reader looks last.
        early = set(self.values.helpers) | {"SCRIPT_DTYPES", "load_values"}
        first = [d for d, name in zip(definitions, self.picker.block_names()) if name & early]
        rest = [d for d, name in zip(definitions, self.picker.block_names()) if not name & early]
        parts = ["\n".join(head)]
        if first:
            parts.append("\n\n\n".join(first))
        parts.append("\n".join(body).strip("\n"))
        parts.append(
            "# "
            + "-" * 70
            + "\n# What the test uses: "
            + ("the adapter's te.ops extensions, " if self.te else "the runtime under test, ")
            + "gradfuzz's catalog functions and comparison\n\n\n"
            + "\n\n\n".join(rest + helpers)
        )
        parts += ["\n".join(self.tail)] if self.tail else []
        return "\n\n\n".join(parts) + "\n"

    def need_library(self):
        for name in self.values.helpers:
            self.picker.add(f"script_support.{name}")

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
                "reference with TE's quantize-dequantize (ops/quantization.cc), shipped with "
                "the script; reference() is the unquantized math, for reading."
            )
        elif self.recipe is not None:
            lines.append(
                f"Recipe {self.recipe.name} ({self.recipe.fp8_format}): the reference is "
                "unquantized; the bounds are the oracle's for the quantized path."
            )
        lines.append('"""')
        if self.te:
            lines += [
                "import os",
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
        imports = sorted(
            set(self.picker.imports()) - {"import torch.nn.functional as F"},
            key=lambda line: (line.startswith("from"), line),
        )
        third = ["import pytest", "import torch"]
        if "import torch.nn.functional as F" in self.picker.imports():
            third.append("import torch.nn.functional as F")
        tail = "  # noqa: E402" if self.te else ""
        lines += ["", *[f"{line}{tail}" for line in imports]]
        lines += ([""] if imports else []) + [f"{line}{tail}" for line in third]
        if self.te:
            lines += [
                "import transformer_engine.pytorch as te  # noqa: E402",
                "from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402",
            ]
            if self.recipe is not None:
                lines.append("from transformer_engine.common import recipe  # noqa: E402")
        lines += ["", "torch.backends.cuda.matmul.allow_tf32 = False"]
        return lines

    def section_values(self):
        case, one = self.case, self.values.expr
        device = "cuda" if self.te else case.device
        lines = ["# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype"]
        lines += self.values.prelude()
        lines += [
            f"DTYPE = torch.{case.dtype_name}",
            f'DEVICE = torch.device("{device}")',
            f"X = {one(case.input)}",
            f"INPUT_REQUIRES_GRAD = {case.input_requires_grad}",
        ]
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
        return lines

    def shipped_expected(self):
        """EXPECTED: per call, the tensors the quantized reference computed."""
        if not self.expected:
            return []
        lines = ["EXPECTED = [  # per call: tensor -> the float64 FP8 reference's value"]
        for call in self.expected:
            lines.append("    {")
            lines += [f"        {name!r}: {self.values.expr(t)}," for name, t in call.items()]
            lines.append("    },")
        return lines + ["]"]

    def bounds(self):
        """BOUNDS (expect.tensors: per tensor name atol, rtol, allowance, norm bound) and
        FALLBACK for the others (expect.tolerance); without expect.tensors and with a
        rounding-baseline factor, FALLBACK carries the factor and the cap."""
        tolerance = dict(self.expect.get("tolerance") or {})
        atol, rtol = float(tolerance.get("atol", 1e-7)), float(tolerance.get("rtol", 1e-7))
        factor = float(tolerance.get("baseline_factor", 0.0) or 0.0)
        tensors = self.expect.get("tensors") or {}
        self.helpers.add("check")
        self.baseline = factor > 0 and not tensors
        if self.baseline:
            cap = float(tolerance.get("baseline_cap", 0.0) or 0.0)
            self.helpers.add("check_all_baseline")
            return [f"FALLBACK = {(atol, rtol, factor, cap)!r}  # atol, rtol, baseline factor, cap"]
        self.helpers.add("check_all")
        lines = [f"FALLBACK = {(atol, rtol)!r}  # atol, rtol of the tensors BOUNDS does not name"]
        if not tensors:
            return lines + ["BOUNDS = {}"]
        lines.append("BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound")
        for name, bound in tensors.items():
            allowance = self.values.expr(self.allowances[name]) if name in self.allowances else None
            norm = bound.get("norm_bound")
            lines.append(
                f"    {name!r}: ({float(bound.get('atol', 0.0))!r}, "
                f"{float(bound.get('rtol', 0.0))!r}, {allowance}, "
                f"{None if norm is None else float(norm)!r}),"
            )
        return lines + ["}"]

    # -- the reference

    def section_reference(self):
        case = self.case
        lines = [
            "def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):",
            '    """The case in plain PyTorch with gradfuzz\'s catalog functions, on the CPU."""',
            "    x = X.to(dtype).requires_grad_(input_requires_grad)",
        ]
        leaves = ['("grad_input", x)']
        for op in case.catalog_ops:
            for j in range(len(op.params)):
                var = self.param_value(op, j).lower()
                rg = op.param_requires_grad[j]
                lines.append(
                    f"    {var} = {self.param_value(op, j)}.to(dtype).requires_grad_({rg})"
                )
                leaves.append(f'("grad_param[{op.index}].{op.name}[{j}]", {var})')
        for k, e in enumerate(case.extra_inputs):
            rg = case.extra_input_requires_grad[k] and e.is_floating_point()
            cast = ".to(dtype)" if e.is_floating_point() else ""
            lines.append(f"    e{k} = E{k}{cast}" + (".requires_grad_()" if rg else ""))
            if rg:
                leaves.append(f'("grad_extra_input[{k}]", e{k})')
        lines.append("    h = x")
        public, next_extra, channels = [], 0, []
        for op in case.ops:
            if op.boundary:
                lines.append("    # Boundary: a plain module ends the fuser (channels end with it)")
                continue
            extras = []
            for channel in op.input_channels:
                if channel is None:
                    extras.append(f"e{next_extra}")
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
            lines.append("    " + self.reference_call(op, extras, params, outs))
        lines.append(f"    outputs = [h{''.join(', ' + v for v in public)}]")
        cotangents = [
            self.cotangent_value(k) + ".to(dtype)" if c is not None else "None"
            for k, c in enumerate(case.cotangents)
        ]
        lines.append(f"    cotangents = [{', '.join(cotangents)}]")
        if not self.te:
            for fuser, channel, var, kind in channels:
                if kind == "float":
                    leaves.append(f'("{_channel_label(fuser, channel)}", {var})')
        lines += self.wrapped("    leaves = [", leaves, "]")
        lines.append("    return results(outputs, cotangents, leaves)")
        self.helpers.add("results")
        return lines

    def reference_call(self, op, extras, params, outs):
        """One op of the reference as a call of its catalog function (catalog.apply's)."""
        name, attrs = op.name, op.attrs
        real = lambda k, d: repr(catalog.attr_real(name, attrs, k, d))  # noqa: E731
        integer = lambda k, d, m=0: catalog.attr_int(name, attrs, k, d, m)  # noqa: E731
        flag = lambda k: catalog.attr_bool(name, attrs, k, 0)  # noqa: E731
        e = extras + ["None"] * 2
        p = params + ["None"] * 2
        calls = {
            "Linear": ("linear", f"h, {p[0]}"),
            "Bias": ("bias_add", f"h, {p[0]}"),
            "ConstantScale": ("constant_scale", f"h, {real('scale', 0.5)}"),
            "ReLU": ("relu", "h"),
            "GELU": ("gelu", "h"),
            "SReLU": ("srelu", "h"),
            "SwiGLU": ("swiglu", f"h, {integer('interleave', 0)}"),
            "ScaledSwiGLU": ("scaled_swiglu", f"h, {e[0]}, {integer('interleave', 0)}"),
            "ScaledSReLU": ("scaled_srelu", f"h, {e[0]}"),
            "MakeExtraOutput": ("make_extra_output", "h"),
            "AddExtraInput": ("add_extra_input", f"h, {e[0]}"),
            "GroupedLinear": (
                "grouped_linear",
                f"h, {e[0]}, {p[0]}, {p[1]}, {e[1] if flag('scale_bias') else None}, "
                f"{integer('groups', 2, 1)}",
            ),
            "RMSNorm": (
                "rms_norm",
                f"h, {p[0]}, {real('eps', 1e-5)}, {flag('zero_centered_gamma')}",
            ),
            "LayerNorm": (
                "layer_norm",
                f"h, {p[0]}, {p[1]}, {real('eps', 1e-5)}, {flag('zero_centered_gamma')}",
            ),
            "Dispatch": ("dispatch", f"h, {e[0]}, {integer('groups', 2, 1)}"),
            "Combine": ("combine", f"h, {e[0]}"),
            "RowStat": ("row_stat", "h"),
            "DualExtraOutput": ("dual_extra_output", f"h, {real('s0', 0.5)}, {real('s1', -1.5)}"),
            "Identity": ("identity", "h"),
            "Reshape": ("reshape", f"h, {integer('features', 0)}"),
        }
        inline = {
            "Linear": f"h = h @ {p[0]}.T  # Linear",
            "Bias": f"h = h + {p[0]}  # Bias",
            "ConstantScale": f"h = h * {real('scale', 0.5)}  # ConstantScale",
            "ReLU": "h = torch.relu(h)  # ReLU",
            "SReLU": "h = torch.relu(h) ** 2  # SReLU",
            "Identity": "h = h  # Identity",
            "AddExtraInput": f"h = h + {e[0]}  # AddExtraInput",
        }
        if name in inline and (name != "AddExtraInput" or e[0] != "None"):
            return inline[name]
        if name == "MakeExtraOutput":
            # Its own autograd node, so that the channel's gradient is the channel's.
            return f"{outs[0]} = h.view_as(h)  # MakeExtraOutput" if outs else "pass"
        function, args = calls[name]
        self.picker.add(f"catalog.{function}")
        if name in ("MakeExtraOutput", "Dispatch", "RowStat", "DualExtraOutput"):
            return f"h, ({', '.join(outs)}{',' if len(outs) == 1 else ''}) = {function}({args})"
        return f"h = {function}({args})  # {name}"

    # -- the case under test

    def section_build_te(self):
        case = self.case
        lines = [
            "def build(state):",
            '    """The case with te.ops as a user writes it (its ops go into state["ops"])."""',
        ]
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                self.picker.add("te.extensions.Boundary")
                lines.append(f"    {var} = Boundary()  # a plain module: ends the fuser")
            else:
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
                lines += self.te_params(op, var)
        lines.append(self.ops_line())
        lines += self.standalone_calls()
        lines += self.bindings(keyword="output_to_caller=")
        lines += self.lock_record()
        modules = ", ".join(f"op{op.index}" for op in case.ops)
        lines.append(f"    model = te.ops.Sequential({modules})")
        lines += self.late_binds()
        lines.append("    return model")
        self.helpers.add("only_fusions")
        if any(
            f.startswith("FusedResidual") for path in self.paths for f in path.get("fusions") or []
        ):
            self.picker.add("te.extensions.register_fusions")
            self.tail = ["register_fusions()  # the adapter's FusedResidual, in all three passes"]
        return lines

    def te_params(self, op, var):
        if not op.param_shapes:
            return []
        values = [self.param_value(op, j) for j in range(len(op.params))]
        if op.index in self.helper_ops:
            for helper in ("copy_param_values", "set_param_requires_grad", "attach_main_grads"):
                self.picker.add(f"te.params.{helper}")
            return [
                f'    copy_param_values({var}, "{op.name}", '
                f"[v.to(DEVICE, DTYPE) for v in ({', '.join(values)},)])",
                f'    set_param_requires_grad({var}, "{op.name}", {op.param_requires_grad!r})',
                f'    attach_main_grads({var}, "{op.name}")',
            ]
        lines = ["    with torch.no_grad():"]
        for attr, value in zip(TE_PARAMS[op.name], values):
            lines.append(f"        {var}.{attr}.copy_({value})")
        for attr, rg in zip(TE_PARAMS[op.name], op.param_requires_grad):
            if not rg:
                lines.append(f"    {var}.{attr}.requires_grad_(False)")
        return lines

    def section_build_torch(self):
        case = self.case
        for name in ("BasicOp", "Boundary", "Sequential"):
            self.picker.add(f"torch_runtime.{name}")
        lines = [
            "def build(state):",
            '    """The case with the torch backend\'s runtime (its ops go into state["ops"])."""',
        ]
        for op in case.ops:
            var = f"op{op.index}"
            if op.boundary:
                lines.append(f"    {var} = Boundary()")
            else:
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
                if op.params:
                    values = [self.param_value(op, j) for j in range(len(op.params))]
                    lines.append("    with torch.no_grad():")
                    for j, value in enumerate(values):
                        lines.append(f"        {var}.params[{j}].copy_({value})")
                    for j, rg in enumerate(op.param_requires_grad):
                        lines.append(f"    {var}.params[{j}].requires_grad_({rg})")
        lines.append(self.ops_line())
        lines += self.standalone_calls()
        lines += self.bindings(keyword="")
        lines += self.lock_record()
        modules = ", ".join(f"op{op.index}" for op in case.ops)
        lines.append(f"    model = Sequential({modules})")
        lines += self.late_binds()
        lines.append("    return model")
        return lines

    def ops_line(self):
        return f'    state["ops"] = ops = [{", ".join(f"op{op.index}" for op in self.case.ops)}]'

    def lock_record(self):
        """An error script records which ops were locked before the Sequential."""
        if not self.expects_error:
            return []
        self.helpers.add("locked_te" if self.te else "locked_torch")
        return ['    state["locked_before"] = [locked(op) for op in ops]']

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

    def section_call(self):
        """call(): one call of the model as the oracle runs it: what the oracle compares,
        and the caller tensors it changed."""
        case = self.case
        extras = []
        for k, e in enumerate(case.extra_inputs):
            rg = case.extra_input_requires_grad[k] and e.is_floating_point()
            extras.append(self.to_device(f"E{k}", e, rg))
        cotangents = [
            self.to_device(self.cotangent_value(k), c) if c is not None else "None"
            for k, c in enumerate(case.cotangents)
        ]
        lines = [
            "def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):",
            '    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors',
            '    the oracle compares by name, and the caller tensors the call changed."""',
            "    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)",
            f"    extras = [{', '.join(extras)}]",
            f"    cotangents = [{', '.join(cotangents)}]",
            '    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},',
            '              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) '
            "if c is not None}}",
            "    pristine = {n: t.detach().clone() for n, t in caller.items()}",
        ]
        if self.recipe is not None and self.te:
            lines.append(
                "    with torch.set_grad_enabled(not no_grad), te.autocast(recipe=RECIPE):"
            )
        else:
            lines.append("    with torch.set_grad_enabled(not no_grad):")
        # DelayedScaling's updates, as TE's autocast exit and first-module backward do them.
        delayed = self.recipe is not None and not self.te
        if delayed:
            self.picker.add("recipes.update_after_forward")
            self.picker.add("recipes.update_after_backward")
        quantizations = "[op.quantization for op in ops if getattr(op, 'quantization', None)]"
        lines += [
            "        out = model(x, *extras)",
            *([f"        update_after_forward({quantizations})"] if delayed else []),
            "    outputs = list(out) if isinstance(out, tuple) else [out]",
            "    leaves = []",
            "    if not no_grad:",
        ]
        leaves = ['("grad_input", x)']
        finish = []
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
                    f"        finish_weight_gradients({var})",
                    f'        by_id = {{id(t): grads.get(f"op{op.index}.{{k}}") for k, t in '
                    f'enumerate(param_leaves({var}, "{op.name}"))}}',
                    f'        for j, g in enumerate(model_param_grads({var}, "{op.name}", by_id)):',
                    f'            grads[f"grad_param[{op.index}].{op.name}[{{j}}]"] = g',
                ]
            elif op.params:
                attrs = (
                    TE_PARAMS[op.name]
                    if self.te
                    else [f"params[{j}]" for j in range(len(op.params))]
                )
                for j, attr in enumerate(attrs):
                    leaves.append(f'("grad_param[{op.index}].{op.name}[{j}]", {var}.{attr})')
        if case.extra_inputs:
            leaves.append('*[(f"grad_extra_input[{k}]", e) for k, e in enumerate(extras)]')
        if not self.te:
            leaves.append("*channel_leaves(model)")
            self.helpers.add("channel_leaves")
        lines += self.wrapped("        leaves = [", leaves, "]")
        lines.append(
            "    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)"
        )
        if delayed:
            lines.append(f"    update_after_backward({quantizations})")
        if finish:
            lines.append("    if not no_grad:")
            lines += [line.replace("grads", "got") for line in finish]
        lines.append(
            "    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]"
        )
        self.helpers.add("results")
        return lines

    @staticmethod
    def to_device(name, t, requires_grad=False):
        """A fresh copy of value `name` on DEVICE, floating ones in DTYPE."""
        if not t.is_floating_point():
            return f"{name}.to(DEVICE, copy=True)"
        return f"{name}.to(DEVICE, DTYPE, copy=True)" + (
            ".requires_grad_()" if requires_grad else ""
        )

    @staticmethod
    def wrapped(opening, items, closing, width=96):
        """`opening` + items + `closing` on one line, or one item per line."""
        line = opening + ", ".join(items) + closing
        if len(line) <= width:
            return [line]
        indent = " " * (len(opening) - len(opening.lstrip()) + 4)
        return [
            opening,
            *[f"{indent}{item}," for item in items],
            opening[: -len(opening.lstrip())] + closing,
        ]

    def section_tests(self):
        ids = [p["name"] for p in self.paths]
        fusions = [list(p.get("fusions") or []) for p in self.paths]
        lines = [f"PATHS = {fusions!r}", f"PATH_NAMES = {ids!r}", "", ""]
        scope = "only_fusions(fusions)" if self.te else "contextlib.nullcontext()"
        if not self.te:
            self.picker.library.add("contextlib")
        if self.expects_error:
            return lines + self.error_test(scope)
        lines += [
            '@pytest.mark.parametrize("fusions", PATHS, ids=PATH_NAMES)',
            "def test_case(fusions):",
            "    expected = EXPECTED[0]" if self.expected else "    expected = reference()",
            *(
                ["    baseline = reference(DTYPE)  # the rounding baseline"]
                if self.baseline
                else []
            ),
            "    state = {}",
            f"    with {scope}:",
            "        model = build(state)",
            '        got, modified = call(model, state["ops"])',
            f"    problems = check_all(got, expected{', baseline' if self.baseline else ''})",
            '    problems += [f"{name}: changed by the call (a caller tensor)" '
            "for name in modified]",
        ]
        if self.repeats:
            lines += self.repeat_lines(scope)
        lines.append('    assert not problems, "\\n".join(problems)')
        return lines

    def repeat_lines(self, scope):
        self.helpers.update({"plans", "before_repeat_call"})
        return [
            "    # Repeat calls of the same Sequential (same values), against the reference and",
            "    # against the plans a fresh Sequential makes at its first call with that pattern.",
            f"    for k, (no_grad, input_requires_grad) in enumerate({self.repeats!r}, start=1):",
            (
                "        wanted = EXPECTED[k]"
                if self.expected
                else "        wanted = reference(input_requires_grad=input_requires_grad)"
            ),
            *(
                ["        baseline = reference(DTYPE, input_requires_grad)"]
                if self.baseline
                else []
            ),
            '        skip = ("grad",) if no_grad else ("grad_channel",)  # no channels in repeats',
            "        wanted = {n: t for n, t in wanted.items() if not n.startswith(skip)}",
            f"        with {scope}:",
            '            before_repeat_call(state["ops"])',
            '            got, modified = call(model, state["ops"], input_requires_grad, no_grad)',
            "            fresh_state = {}",
            "            fresh = build(fresh_state)",
            '            call(fresh, fresh_state["ops"], input_requires_grad, no_grad)',
            '        got = {n: t for n, t in got.items() if not n.startswith("grad_channel")}',
            f'        problems += [f"call[{{k}}] {{p}}" for p in check_all(got, wanted'
            f"{', baseline' if self.baseline else ''})]",
            '        problems += [f"call[{k}] {n}: changed by the call" for n in modified]',
            "        if plans(model) != plans(fresh):",
            "            problems.append(f\"call[{k}] plans {plans(model)}, a fresh Sequential's "
            '{plans(fresh)}")',
        ]

    def error_test(self, scope):
        kind = self.expect.get("error_kind", "unrecognized")
        lines = [
            '@pytest.mark.parametrize("fusions", PATHS, ids=PATH_NAMES)',
            f"def test_case_raises_{kind.replace('-', '_')}(fusions):",
        ]
        if self.te:
            types_, pattern = te_package.RAISES.get(kind, (("Exception",), None))
            raises = "(" + ", ".join(types_) + ",)"
            match = f", match={pattern!r}" if pattern else ""
            lines += [
                f'    """gradfuzz\'s reference rejects this configuration ({kind}); TE must too,',
                '    and a failed construction must leave every op as it was (unlocked)."""',
                "    state = {}",
                f"    with pytest.raises({raises}{match}), {scope}:",
                '        call(build(state), state["ops"])',
            ]
        else:
            self.picker.add("errors.GradfuzzError")
            lines += [
                f'    """gradfuzz\'s reference rejects this configuration ({kind}), and a failed',
                '    construction must leave every op as it was (unlocked)."""',
                "    state = {}",
                f"    with pytest.raises(GradfuzzError) as raised, {scope}:",
                '        call(build(state), state["ops"])',
                f"    assert raised.value.kind == {kind!r}, raised.value",
            ]
        lines += [
            '    before = state.get("locked_before")  # None: it failed before the Sequential',
            "    if before is not None:",
            '        left = [i for i, op in enumerate(state["ops"]) '
            "if locked(op) and not before[i]]",
            '        assert not left, f"ops {left} left locked by the failed construction"',
        ]
        return lines


# What a helper needs besides torch: library modules.
TEMPLATE_NEEDS = {"only_fusions": ("contextlib",)}

# Script-local helpers, emitted when used (in this order).
HELPER_ORDER = (
    "locked_te",
    "locked_torch",
    "only_fusions",
    "channel_leaves",
    "results",
    "check",
    "check_all",
    "check_all_baseline",
    "before_repeat_call",
    "plans",
)

TEMPLATES = {
    "locked_te": """
def locked(op):
    return bool(getattr(op, "_extra_tensor_channels_locked", False))  # op.py
""",
    "locked_torch": """
def locked(op):
    return bool(getattr(op, "locked", False))
""",
    "only_fusions": '''
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
''',
    "channel_leaves": '''
def channel_leaves(model):
    """The runtime's channel values of the last forward, named as the oracle names them."""
    return [(f"grad_channel[{name}{'' if f == 0 else f'@fuser{f}'}]", t)
            for f, fuser in enumerate(model.fusers) for name, t in fuser.channels.items()
            if t is not None and t.is_floating_point()]
''',
    "results": '''
def results(outputs, cotangents, leaves, zeros=True):
    """The outputs, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named leaves
    requiring grad (where nothing reached one: zeros, the reference's, or None), by name."""
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach() for k, o in enumerate(outputs)}
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
    "check": '''
def check(name, got, e, atol, rtol, allowance=None, norm_bound=None):
    """Why `got` is off gradfuzz's bound of `e` (oracle/oracle.h), or None: every element
    finite and |got - e| <= atol + rtol (rms(e) + |e|) + allowance (unjudged where that is
    infinite), and ||got - e|| <= norm_bound."""
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
def check_all(got, expected, baseline=None):
    """Every tensor either side has (channels: those the reference has), under BOUNDS or
    else FALLBACK."""
    names = [n for n in dict.fromkeys([*expected, *got])
             if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *BOUNDS.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]
''',
    "check_all_baseline": '''
def check_all(got, expected, baseline):
    """Every tensor either side has (channels: those the reference has), under FALLBACK:
    atol, rtol and the rounding allowance min(factor |b - e|, cap max(|e|, rms(e))) of the
    baseline b, the reference run in the case dtype."""
    atol, rtol, factor, cap = FALLBACK
    problems = []
    for n in dict.fromkeys([*expected, *got]):
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
    "before_repeat_call": '''
def before_repeat_call(ops):
    """Between two steps, as a training loop: accumulated parameter gradients cleared."""
    for op in ops:
        for p in op.parameters() if hasattr(op, "parameters") else getattr(op, "params", []):
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
