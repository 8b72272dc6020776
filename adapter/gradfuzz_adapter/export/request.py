"""An `export` request decoded once (docs/BACKENDS.md): which form, which backend's dialect,
the paths, and what the script holds the case to, with every tensor index resolved.

The forms read an ExportRequest; none of them goes back to the request's JSON.
"""

from dataclasses import dataclass, field

# The forms an export request can ask for (ExportRequest.form).
FORMS = ("compact", "full", "distributed", "upstream")


@dataclass
class ExportRequest:
    """One export request. `expect` is the request's expectation as sent ({"kind",
    "tolerance", "tensors", ...}); `allowances`, `expected` and `own` are its tensors:

    - allowances: {tensor name: per-element allowance} from expect.tensors;
    - expected: per call {tensor name: value} (expect.expected, expect.repeat_expected: the
      float64 FP8 reference of a quantizing case), None when the request ships none;
    - own: {path name: {"points", "tensors", "allowances", "expected"}} from expect.paths,
      the paths judged against the reference of their own quantization points.

    `finding`, `fault` and `verify` are the upstream form's: the cluster the test is about,
    the torch backend's planted fault that shows it (switched on as replay does), and
    whether the test may be run here to check that it fails for the finding's reason."""

    form: str
    backend: str
    expect: dict
    paths: list
    case_file: str = ""
    data_file: str | None = None
    allowances: dict = field(default_factory=dict)
    expected: list | None = None
    own: dict = field(default_factory=dict)
    finding: dict | None = None
    fault: str | None = None
    verify: bool = True

    @classmethod
    def decode(cls, request, tensors, default_backend):
        """The ExportRequest of `request` (a JSON header) and its frame's `tensors`.
        ValueError names what is wrong."""
        expect = request.get("expect") or {"kind": "pass"}
        form = request.get("form") or "compact"
        if form not in FORMS:
            raise ValueError(f"export: unknown form {form!r}; known forms: {', '.join(FORMS)}")
        if expect.get("sharding"):
            form = "distributed"  # a torchrun script, one process per rank
        elif form == "compact" and request.get("full", False):
            form = "full"
        out = cls(
            form=form,
            backend=request.get("backend", default_backend),
            expect=expect,
            paths=request.get("paths") or [],
            case_file=request.get("case_file", ""),
            data_file=request.get("data_file") or None,
            finding=request.get("finding"),
            fault=request.get("fault") or None,
            verify=bool(request.get("verify", True)),
        )
        out.allowances = allowances(expect, tensors)
        if form == "distributed":
            out.expected = [
                _tensors_by_name(expect.get("expected") or {}, tensors, "expect.expected")
            ]
        else:
            out.expected = shipped_expectation(expect, tensors)
            out.own = path_expectations(expect, tensors)
        return out

    def value_extras(self):
        """{key: tensor} of the request's tensors a script spells besides the case's values
        (values.py's `extra`): the allowances and the expected values, each path's own."""
        extra = dict(self.allowances)
        for k, call in enumerate(self.expected or []):
            extra.update({f"expected call[{k}] {name}": t for name, t in call.items()})
        for path, e in self.own.items():
            extra.update({f"{path} {name}": t for name, t in e["allowances"].items()})
            for k, call in enumerate(e["expected"]):
                extra.update({f"{path} expected call[{k}] {name}": t for name, t in call.items()})
        return extra

    def default_paths(self, case):
        """The request's paths, or the case's fused path alone."""
        return self.paths or [{"name": "fused", "fusions": list(case.spec.get("fusions") or [])}]


def _tensors_by_name(refs, tensors, where):
    """{name: tensor} of {name: frame index} (the request's field `where`)."""
    if not isinstance(refs, dict):
        raise ValueError(f"{where}: expected an object of tensor names")
    out = {}
    for name, index in refs.items():  # frame indices, as the allowances'
        if not isinstance(index, int) or not 0 <= index < len(tensors):
            raise ValueError(f"{where}[{name!r}]: no tensor {index!r}")
        out[name] = tensors[index]
    return out


def shipped_expectation(expect, tensors, where="expect"):
    """[{tensor name: expected value}] per call from expect.expected and
    expect.repeat_expected (the float64 FP8 reference's values of a quantizing case), or
    None when the request ships none (the script then recomputes its reference)."""
    if "expected" not in expect:
        return None

    def one(refs, where):
        return _tensors_by_name(refs, tensors, where)

    calls = [one(expect["expected"], f"{where}.expected")]
    repeats = expect.get("repeat_expected") or []
    if not isinstance(repeats, list):
        raise ValueError(f"{where}.repeat_expected: expected a list, one object per repeat call")
    calls += [one(r, f"{where}.repeat_expected[{k}]") for k, r in enumerate(repeats)]
    return calls


def allowances(expect, tensors, where="expect"):
    """{tensor name: allowance tensor} from expect.tensors' "allowance" indices."""
    out = {}
    for name, bound in (expect.get("tensors") or {}).items():
        ref = bound.get("allowance")
        if ref is not None:
            if not isinstance(ref, int) or not 0 <= ref < len(tensors):
                raise ValueError(f"{where}.tensors[{name!r}].allowance: no tensor {ref!r}")
            out[name] = tensors[ref]
    return out


def path_expectations(expect, tensors):
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
            "allowances": allowances(own, tensors, where),
            "expected": shipped_expectation(own, tensors, where),
        }
    return out
