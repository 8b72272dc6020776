"""The compact form (the default; ../shared/spec/te-backend.md "Export", issue 15 item 4;
docs/TE.md "Exported scripts"): a pytest file that holds only what the case uses, laid out
as TE's test_fusible_ops.py lays out a test: the drawn values and the oracle's bounds, one
line each (values.py); reference(), the case in plain float64 PyTorch written out op by op
(reference.py: the catalog's torch calls with the attrs filled in); build(), the case with
the backend's ops as a user builds it (constructors, parameters copied by name, standalone
calls, channel bindings, Sequential); run(), one call as the oracle makes it; and one test
per path that makes every check gradfuzz's oracle makes for such a case:

- every output and gradient against the reference (or, for a quantizing case, the shipped
  EXPECTED values), under the request's per-tensor bounds (`expect.tensors`: {"atol",
  "rtol", "allowance", "norm_bound"} by the oracle's tensor name; else `expect.tolerance`
  with the rounding baseline, the reference in the case dtype);
- no caller-owned tensor (input, extra inputs, cotangents) changed by the call;
- an expected error raised as the dialect spells it (TE's type and message, te/classify.py
  RAISES; the torch runtime's kind), and no op left locked by a failed construction;
- each repeat call (`spec.repeat_calls`): its values against the reference, and where the
  dialect compares plans each fuser's plans equal to those of a fresh Sequential at its
  first call with that call's requires-grad pattern.

The comparison helpers follow the test; after EMBEDDED_MARK comes what the case's ops need
to run (the dialect's: on te the adapter's custom ops and FusedResidual, only where used;
on torch the runtime under test). The script fails exactly where replay finds a defect
(channel gradients excepted where the implementation exposes none). Generating a te script
never imports TE.
"""

from ..recipes import parse_recipe
from .picker import Picker
from .reference import reference_lines
from .templates import CALLER_LINE, CALLER_LINES, HELPER_ORDER, TEMPLATES
from .text import EMBEDDED_MARK, channel_label, identifier, wrapped
from .values import ScriptValues


def compact_script(case, request, dialect, values=None):
    """The compact pytest file for `case` (an ExportRequest `request`, the backend's
    `dialect`). `values`: how the case's tensors are spelled (a ScriptValues; by default all
    in the script)."""
    values = values or ScriptValues(case, extra=request.allowances)
    return CompactWriter(case, request, dialect, values).script()


class CompactWriter:
    """Writes one compact script; each method returns a list of source lines. The dialect
    writes what differs per backend (build(), error tests, parameter leaves), reading the
    writer's names and adding to its helpers."""

    def __init__(self, case, request, dialect, values):
        self.case = case
        self.dialect = dialect
        self.backend = dialect.name
        self.paths = request.default_paths(case)
        self.expect = request.expect or {}
        self.case_file = request.case_file or "<case file>"
        self.values = values
        self.allowances = request.allowances or {}
        self.picker = Picker()
        self.expects_error = self.expect.get("kind") == "error"
        # An implementation that exposes no channel gradient (TE): its script compares none.
        expected = request.expected
        self.expected = expected and [self.exposed(call) for call in expected]
        # The paths with their own expectation (their fused ops' quantization points), among
        # those the script tests; the script then tests each path against its own
        # (EXPECTATIONS), the others against EXPECTED and BOUNDS.
        names = [p["name"] for p in self.paths]
        self.own = {
            name: dict(e, expected=[self.exposed(call) for call in e["expected"]])
            for name, e in (request.own or {}).items()
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
        # Ops whose parameters go through the implementation's helpers (te/params.py: TE's
        # grouped parameters, main_grad buffers, delayed weight gradients).
        self.helper_ops = dialect.param_helper_ops(case)
        multi = {}
        for op in case.catalog_ops:
            for channel in [c for c in op.input_channels if c] + [
                c for c, _ in op.output_bindings if c
            ]:
                multi.setdefault(channel, set()).add(op.fuser)
        self.channel_fusers = multi

    def exposed(self, tensors):
        """`tensors` ({name: t}) but channel gradients where the implementation exposes none."""
        if self.dialect.exposes_channel_gradients:
            return dict(tensors)
        return {n: t for n, t in tensors.items() if not n.startswith("grad_channel")}

    @staticmethod
    def flag(op, attr):
        return float(op.attrs.get(attr, 0)) == 1.0

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
        return "c_" + identifier(channel) + suffix

    # -- the script

    def script(self):
        values = self.section_values()
        body = []
        if not self.expects_error and not self.expected:
            body += ["", ""] + self.section_reference()
        body += ["", ""] + self.dialect.compact_build(self)
        body += ["", ""] + self.section_run()
        body += ["", ""] + self.section_tests()
        body = values + self.tail_constants + body
        for name in sorted(self.values.helpers):
            self.picker.add(f"export.support.{name}")
        head = self.section_head()
        definitions = self.picker.source()
        blocks = self.picker.block_names()
        helpers = [self.template(name) for name in HELPER_ORDER if name in self.helpers]
        # What the module's top level runs (value decoding) comes first; the case and its
        # test next; gradfuzz's comparison after them, and last what the case's ops need
        # (the dialect's: the adapter's te.ops extensions, or the runtime under test).
        early = set(self.values.helpers) | {"SCRIPT_DTYPES", "load_values"}
        first = [d for d, names in zip(definitions, blocks) if names & early]
        rest = [d for d, names in zip(definitions, blocks) if not names & early]
        parts = ["\n".join(head)]
        if first:
            parts.append("\n\n\n".join(first))
        parts.append("\n".join(body).strip("\n"))
        parts.append("\n\n\n".join(helpers))
        if rest:
            what = self.dialect.compact_embedded_title
            parts.append(f"{EMBEDDED_MARK}\n# {what}\n\n\n" + "\n\n\n".join(rest))
        parts += ["\n".join(self.tail)] if self.tail else []
        return "\n\n\n".join(parts) + "\n"

    def template(self, name):
        """The source of script-local helper `name`; the dialect fills in only_fusions."""
        text = TEMPLATES[name].strip("\n")
        if name != "only_fusions":
            return text
        return self.dialect.only_fusions_template(self, text)

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
        environment = self.dialect.environment(case)
        library = set(self.picker.imports()) - {"import torch.nn.functional as F"}
        library = sorted(library | ({"import os"} if environment else set()))
        library.sort(key=lambda line: line.startswith("from"))
        lines += library
        third = ["import pytest", "import torch"]
        if "import torch.nn.functional as F" in self.picker.imports():
            third.append("import torch.nn.functional as F")
        third += self.dialect.imports() + self.dialect.recipe_imports(self.recipe)
        if environment:
            # The environment is set before the implementation is imported.
            lines += ["", *environment]
            third = [f"{line}  # noqa: E402" for line in third]
        lines += ([""] if library else []) + third + [""]
        lines += self.dialect.tf32_lines(case)
        device = self.dialect.device(case)
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
        lines += self.dialect.recipe_lines(self.recipe)
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
            var = identifier(name).upper()
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
                f"({identifier(p['name']).upper()}_EXPECTED, {identifier(p['name']).upper()}"
                "_BOUNDS)"
                if p["name"] in self.own
                else "(EXPECTED, BOUNDS)"
            )
            for p in self.paths
        ]
        return lines + wrapped("EXPECTATIONS = {", pairs, "}  # path: expected, bounds")

    def bounds(self):
        """BOUNDS (expect.tensors: per tensor name atol, rtol, allowance, norm bound) and
        FALLBACK for the others (expect.tolerance); without expect.tensors and with a
        rounding-baseline factor, FALLBACK carries the factor and the cap."""
        tolerance = dict(self.expect.get("tolerance") or {})
        atol, rtol = float(tolerance.get("atol", 1e-7)), float(tolerance.get("rtol", 1e-7))
        factor = float(tolerance.get("baseline_factor", 0.0) or 0.0)
        tensors = self.exposed(self.expect.get("tensors") or {})
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
        `tensors` (the exposed ones), the allowances' values from `allowances`."""
        lines = [f"{var} = {{  # tensor: atol, rtol, per-element allowance, norm bound"]
        for name, bound in self.exposed(tensors).items():
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
        if self.dialect.exposes_channel_gradients:
            for fuser, channel, var, kind in channels:
                if kind == "float":
                    leaves.append(f'("{channel_label(fuser, channel)}", {var})')
        call = f"results([{', '.join([h, *public])}], [{', '.join(cotangents)}], {{}})"
        lines += self.leaves_then("    return " + call, leaves)
        self.helpers.add("results")
        return lines

    # -- the case under test (the dialect's compact_build writes build() with these)

    def build_head(self):
        # Where the implementation takes a path's fusions at construction, a script testing
        # paths of their own builds each path's Sequential with its fusions; else the test
        # narrows the implementation's registry (only_fusions).
        own_fusions = self.own and self.dialect.fusions_at_construction
        arg = "state" if self.expects_error else "fusions=()" if own_fusions else ""
        return [
            f"def build({arg}):",
            f'    """The case with {self.dialect.implementation_words}, '
            'as a user writes it: its Sequential and ops."""',
        ]

    def build_tail(self):
        """From the op list on: standalone calls, bindings, the Sequential, late binds."""
        dialect = self.dialect
        ops = ", ".join(f"op{op.index}" for op in self.case.ops)
        lines = [
            f'    state["ops"] = ops = [{ops}]' if self.expects_error else f"    ops = [{ops}]"
        ]
        lines += self.standalone_calls()
        lines += self.bindings(keyword=dialect.output_to_caller_keyword)
        if self.expects_error:
            self.helpers.add(dialect.locked_helper)
            lines.append('    state["locked_before"] = [locked(op) for op in ops]')
        # An error script records how far construction got (see error_test): the Sequential
        # once made where its constructor validates, else once the case is wired.
        at_construction = dialect.validates_at_construction
        built = '    state["model"] = ' if self.expects_error and at_construction else "    "
        fusions = ", fusions=fusions" if self.own and dialect.fusions_at_construction else ""
        lines.append(f"{built}model = {dialect.sequential}({ops}{fusions})")
        lines += self.late_binds()
        if self.expects_error and not at_construction:
            lines.append('    state["model"] = model')
        lines.append("    return model, ops")
        return lines

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
        case, repeats, dialect = self.case, bool(self.repeats), self.dialect
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
        lines += wrapped("    extras = [", extras, "]") if extras else []
        lines += wrapped("    dys = [", cotangents, "]")
        if len(", ".join(caller)) <= 80:
            lines.append(f"    caller = {{{', '.join(caller)}}}")
        else:
            lines += CALLER_LINES if extras else [CALLER_LINE]
        lines.append("    pristine = {n: t.detach().clone() for n, t in caller.items()}")
        contexts = (["torch.set_grad_enabled(not no_grad)"] if repeats else []) + (
            dialect.recipe_contexts(self.recipe)
        )
        # The recipe's state updates the implementation leaves to its caller (the torch
        # runtime's delayed scaling, as TE's autocast exit and first-module backward do).
        after_forward = dialect.after_forward(self)
        call = f"y = model(x{', *extras' if extras else ''})"
        if contexts:
            lines += [f"    with {', '.join(contexts)}:", f"        {call}"]
            lines += [f"        {line}" for line in after_forward]
        else:
            lines.append(f"    {call}")
            lines += [f"    {line}" for line in after_forward]
        leaves = ['("grad_input", x)']
        finish = []
        groups = False
        for op in case.catalog_ops:
            op_leaves, op_finish, op_groups = dialect.run_param_leaves(self, op, f"ops[{op.index}]")
            leaves += op_leaves
            finish += op_finish
            groups |= op_groups
        for k, e in enumerate(case.extra_inputs):
            if case.extra_input_requires_grad[k] and e.is_floating_point():
                leaves.append(f'("grad_extra_input[{k}]", extras[{k}])')
        if dialect.exposes_channel_gradients:
            leaves.append("*channel_leaves(model)")
            self.helpers.add("channel_leaves")
        if repeats:
            lines += wrapped("    leaves = [] if no_grad else [", leaves, "]")
            lines.append("    got = results(y, [] if no_grad else dys, leaves, zeros=False)")
        else:
            lines += self.leaves_then("    got = results(y, dys, {}, zeros=False)", leaves)
        lines += [f"    {line}" for line in dialect.after_backward(self)]
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

    def leaves_then(self, statement, leaves):
        """`statement` with the leaf list in place of {}, wrapped under its opening bracket."""
        before, _, after = statement.partition("{}")
        return wrapped(before + "[", leaves, "]" + after)

    def test_head(self, name):
        """The decorator and def line of the test: one test per path where the test picks
        the path's fusions in the implementation's registry (te); where the Sequential is
        given them (the torch runtime, which fuses only under a recipe), the paths are one
        test unless a path has an expectation of its own. With such a path each test also
        gets its path's name (EXPECTATIONS)."""
        ids = [p["name"] for p in self.paths]
        by_registry = not self.dialect.fusions_at_construction
        if self.own:
            cases = [(p["name"], list(p.get("fusions") or [])) for p in self.paths]
            head = wrapped(
                '@pytest.mark.parametrize("path, fusions", [',
                [repr(c) for c in cases],
                f"], ids={ids!r})",
            )
            if not by_registry:
                return head + [f"def {name}(path, fusions):"]
            self.helpers.add("only_fusions")
            return head + [f"def {name}(path, fusions, monkeypatch):"]
        if not by_registry:
            return [f"def {name}():"]
        self.helpers.add("only_fusions")
        fusions = [list(p.get("fusions") or []) for p in self.paths]
        return [
            f'@pytest.mark.parametrize("fusions", {fusions!r}, ids={ids!r})',
            f"def {name}(fusions, monkeypatch):",
        ]

    def select_fusions(self):
        """The test's first line where it narrows the registry to the path's fusions."""
        if self.dialect.fusions_at_construction:
            return []
        return ["    only_fusions(monkeypatch, fusions)"]

    def section_tests(self):
        if self.expects_error:
            return self.error_test()
        lines = self.test_head("test_case")
        lines += self.select_fusions()
        own_fusions = self.own and self.dialect.fusions_at_construction
        build = "build(fusions)" if own_fusions else "build()"
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
        shipped EXPECTED), its caller tensors, and where the dialect compares plans each
        fuser's plans against those of a fresh Sequential. Accumulated gradients are cleared
        before it (driver.py: before_repeat_call) where the script reads them (te/params.py:
        main_grad, delayed weight gradients); autograd.grad fills no other. The torch runtime
        plans one group per op whatever the call (torch_backend/runtime.py: Fuser.plan), so its
        scripts compare no plans."""
        plans = self.dialect.compares_plans
        wanted = (
            "expected[k]"
            if self.own
            else "EXPECTED[k]"
            if self.expected
            else "reference(input_requires_grad=input_requires_grad)"
        )
        lines = [
            "    # Repeat calls of the same Sequential (same values): the reference's values"
            + (", the plans of a fresh one" if plans else ""),
            f"    for k, (no_grad, input_requires_grad) in enumerate({self.repeats!r}, start=1):",
            f"        wanted = {wanted}",
        ]
        if self.baseline:
            lines.append("        baseline = reference(DTYPE, input_requires_grad)")
        if self.dialect.exposes_channel_gradients:
            lines += [
                '        skip = ("grad",) if no_grad else ("grad_channel",)  '
                "# no channels in repeats",
                "        wanted = {n: t for n, t in wanted.items() if not n.startswith(skip)}",
            ]
        else:  # no channel gradient: the implementation exposes none
            lines.append(
                "        wanted = {n: t for n, t in wanted.items() "
                'if not (no_grad and n.startswith("grad"))}'
            )
        if self.dialect.clears_gradients(self):
            self.helpers.add("before_repeat_call")
            lines.append("        before_repeat_call(ops)")
        lines.append("        got, changed = run(model, ops, input_requires_grad, no_grad)")
        if plans:
            lines += [
                "        fresh, fresh_ops = build()",
                "        run(fresh, fresh_ops, input_requires_grad, no_grad)",
            ]
        if self.dialect.exposes_channel_gradients:
            lines.append(
                '        got = {n: t for n, t in got.items() if not n.startswith("grad_channel")}'
            )
        lines += [
            f'        problems += [f"call[{{k}}] {{p}}" for p in check_all(got, wanted'
            f"{', baseline' if self.baseline else ', bounds' if self.own else ''})]",
            '        problems += [f"call[{k}] {n}: changed by the call" for n in changed]',
        ]
        if plans:
            self.helpers.add("plans")
            lines += [
                "        if plans(model) != plans(fresh):",
                '            problems.append(f"call[{k}] plans {plans(model)}, '
                "a fresh Sequential's "
                '{plans(fresh)}")',
            ]
        return lines

    def error_test(self):
        """The test of a case the reference rejects: building and running it raises the
        error as the dialect spells it, and a failed construction leaves its ops unlocked
        where the dialect can tell (te/backend.py, torch_backend/backend.py: left_locked)."""
        kind = self.expect.get("error_kind", "unrecognized")
        lines = self.test_head(f"test_case_raises_{kind.replace('-', '_')}")
        lines += self.dialect.compact_raises(self, kind)
        lines += [
            *self.dialect.failed_construction,
            '        before = state["locked_before"]',
            '        left = [i for i, op in enumerate(state["ops"]) '
            "if locked(op) and not before[i]]",
            '        assert not left, f"ops {left} left locked by the failed construction"',
        ]
        return lines
