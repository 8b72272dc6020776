"""Exported pytest files: run as a user runs them (a subprocess, no gradfuzz on the path),
they pass on a correct case and fail on each check the oracle makes (values, caller tensors,
expected errors and their kind, ops left locked, repeat-call plans); te scripts are short,
build the case with te.ops and import no TE while being written, and run on TE's own Python
over the stubbed extension."""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import spec

from gradfuzz_adapter.__main__ import Server
from gradfuzz_adapter.client import make_request
from gradfuzz_adapter.export import EMBEDDED_MARK

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = {"atol": 1.3e-6, "rtol": 1e-5, "baseline_factor": 0.0, "baseline_cap": 0.0}
PASS = {"kind": "pass", "tolerance": TOLERANCE}


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


RESIDUAL = [
    {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
    {"name": "ConstantScale", "attrs": {"scale": 0.75}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
    {"name": "Boundary"},
    {
        "name": "Dispatch",
        "attrs": {"groups": 2},
        "output_style": "generator",
        "output_bindings": [{"channel": None}, bound("probs")],
    },
    {"name": "ScaledSwiGLU", "input_channels": ["probs"]},
]


def export(case_spec, backend, expect=None, paths=None, **extra):
    header, tensors = make_request(
        case_spec,
        op="export",
        paths=paths,
        backend=backend,
        expect=expect or PASS,
        case_file="corpus/findings/0123456789abcdef.json",
        **extra,
    )
    reply, _ = Server("torch").handle(header, tensors)
    assert reply["ok"], reply
    return reply["script"]


def run_pytest(folder, scripts, prelude=None):
    """Writes {file name: script} into `folder` and runs pytest on them in one subprocess,
    as a user runs the files (no gradfuzz_adapter on the path); returns
    ({file name: {test id: outcome}}, the whole output)."""
    for name, script in scripts.items():
        (folder / name).write_text(script)
    args = ["-q", "-rA", "-p", "no:cacheprovider", *sorted(scripts)]
    command = (
        [sys.executable, "-c", prelude, *args]
        if prelude
        else [sys.executable, "-m", "pytest", *args]
    )
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=""),
    )
    output = result.stdout + result.stderr
    outcomes = {name: {} for name in scripts}
    for line in output.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] in ("PASSED", "FAILED", "ERROR", "SKIPPED"):
            file_name, _, test = parts[1].partition("::")
            if file_name in outcomes:
                outcomes[file_name][test] = parts[0]
    return outcomes, output


def outcome(outcomes, name):
    return set(outcomes[name].values())


# ----------------------------------------------------------------------------------------
# torch scripts (the torch backend's runtime embedded: what CI runs)

BROKEN_VALUE = (
    """BasicOp("ConstantScale", {'scale': 0.75}""",
    """BasicOp("ConstantScale", {'scale': 0.7501}""",
)
# The runtime under test drops every channel's gradient (review finding 1's symptom).
BROKEN_GRADIENT = ("values[(i, s)] = t\n", "values[(i, s)] = t.detach()\n")
# The runtime under test writes AddExtraInput(in_place)'s add into the caller's tensor.
BROKEN_COPY = ("t = t.clone()", "t = t")


@pytest.fixture(scope="module")
def torch_scripts(tmp_path_factory):
    good = export(spec(RESIDUAL, shape=(6, 8), dtype="float32", seed=3), "torch")
    error_ops = [{"name": "AddExtraInput", "input_channels": ["nowhere"]}]
    expect = {"kind": "error", "error_kind": "missing-producer", "tolerance": TOLERANCE}
    raises = export(spec(error_ops), "torch", expect)
    in_place = [
        {"name": "ConstantScale", "attrs": {"scale": 2.0}},
        {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
    ]
    writes = export(spec(in_place, dtype="float32"), "torch")
    scripts = {
        "test_good.py": good,
        "test_broken_value.py": good.replace(*BROKEN_VALUE),
        "test_broken_gradient.py": good.replace(*BROKEN_GRADIENT),
        "test_raises.py": raises,
        "test_raises_wrong_kind.py": raises.replace(
            "== 'missing-producer'", "== 'duplicate-producer'"
        ),
        "test_writes.py": writes,
        "test_writes_broken.py": writes.replace(*BROKEN_COPY),
    }
    for name in ("test_broken_value.py", "test_broken_gradient.py", "test_writes_broken.py"):
        assert scripts[name] != (writes if "writes" in name else good), name
    outcomes, output = run_pytest(tmp_path_factory.mktemp("torch_scripts"), scripts)
    return scripts, outcomes, output


def test_torch_script_stands_alone_and_passes(torch_scripts):
    scripts, outcomes, output = torch_scripts
    script = scripts["test_good.py"]
    assert "import gradfuzz" not in script and "from gradfuzz" not in script
    assert "gradfuzz replay corpus/findings/0123456789abcdef.json --backend torch" in script
    # The torch runtime fuses nothing: its fused and unfused paths are one test.
    assert outcomes["test_good.py"] == {"test_case": "PASSED"}, output
    assert outcome(outcomes, "test_writes.py") == {"PASSED"}, output


def test_torch_script_fails_on_each_check_the_oracle_makes(torch_scripts):
    _, outcomes, output = torch_scripts
    assert outcome(outcomes, "test_broken_value.py") == {"FAILED"}, output
    assert "output: " in output and " off, worst at flat index" in output
    assert outcome(outcomes, "test_broken_gradient.py") == {"FAILED"}, output
    assert "grad_input: " in output and "grad_channel[r]: " in output
    assert outcome(outcomes, "test_writes_broken.py") == {"FAILED"}, output
    assert "extra_input[0]: changed by the call (a caller tensor)" in output


def test_torch_script_expecting_an_error(torch_scripts):
    _, outcomes, output = torch_scripts
    assert outcome(outcomes, "test_raises.py") == {"PASSED"}, output
    assert outcome(outcomes, "test_raises_wrong_kind.py") == {"FAILED"}, output


def test_per_tensor_bounds_of_the_request_are_the_scripts(tmp_path):
    # expect.tensors (the oracle's bounds by tensor name) replace the fallback tolerance: a
    # per-element allowance covers an error, a norm bound catches one every element allows.
    case_spec = spec(RESIDUAL[:3], dtype="float32", seed=5)
    header, tensors = make_request(case_spec, op="export", backend="torch")
    allowance = torch.full((4, 8), 0.5, dtype=torch.float64)
    n = len(tensors)
    header["expect"] = {
        "kind": "pass",
        "tolerance": TOLERANCE,
        "tensors": {
            "output": {"atol": 1e-6, "rtol": 1e-5, "allowance": n, "norm_bound": None},
            "grad_input": {"atol": 1e-6, "rtol": 1e-5, "allowance": n, "norm_bound": 1e-3},
        },
    }
    reply, _ = Server("torch").handle(header, [*tensors, allowance])
    script = reply["script"]
    # A constant allowance reads as one: torch.full.
    assert "'output': (1e-06, 1e-05, torch.full([4, 8], 0.5, dtype=torch.float64), None)" in script
    assert "1e-05, torch.full([4, 8], 0.5, dtype=torch.float64), 0.001)" in script
    off = script.replace("""{'scale': 0.75}""", """{'scale': 0.76}""")
    outcomes, output = run_pytest(tmp_path, {"test_bounds.py": script, "test_off.py": off})
    assert outcome(outcomes, "test_bounds.py") == {"PASSED"}, output
    # 0.76 instead of 0.75: every element of the output and of grad_input is within its 0.5
    # allowance, grad_input as a whole is not within 1e-3.
    assert outcome(outcomes, "test_off.py") == {"FAILED"}, output
    assert "grad_input: error norm" in output and "output: " not in output


def test_values_over_the_budget_go_to_a_data_file_or_a_seed(tmp_path, monkeypatch):
    from gradfuzz_adapter.export import values as script_values

    monkeypatch.setattr(script_values, "INLINE_BUDGET", 600)  # fits the small values only
    monkeypatch.setattr(script_values, "LITERAL_ELEMENTS", 8)
    case_spec = spec(RESIDUAL, shape=(16, 8), dtype="float32", seed=3)
    data_file = str(tmp_path / "test_file.values.pt")
    header, tensors = make_request(
        case_spec, op="export", backend="torch", expect=PASS, data_file=data_file
    )
    reply, _ = Server("torch").handle(header, tensors)
    assert reply["ok"] and reply["notes"] == [] and reply["data_file"] == data_file
    in_file = reply["script"]
    assert "VALUES = load_values('test_file.values.pt')" in in_file
    assert "X = VALUES['input']" in in_file
    del header["data_file"]
    reply, _ = Server("torch").handle(header, tensors)
    seeded = reply["script"]
    assert "input" in reply["notes"][0] and "seeded([16, 8], 'float32', seed=" in seeded
    scripts = {
        "test_file.py": in_file,
        "test_file_broken.py": in_file.replace(*BROKEN_VALUE),
        "test_seeded.py": seeded,
    }
    outcomes, output = run_pytest(tmp_path, scripts)
    assert outcome(outcomes, "test_file.py") == {"PASSED"}, output
    assert outcome(outcomes, "test_file_broken.py") == {"FAILED"}, output
    assert outcome(outcomes, "test_seeded.py") == {"PASSED"}, output


def test_the_full_form_stays_behind_a_flag():
    script = export(spec(RESIDUAL[:3]), "torch", full=True)
    assert "def forward_backward(" in script and "def compare_results(" in script
    assert len(script.splitlines()) > 1000
    compact = export(spec(RESIDUAL[:3]), "torch")
    assert "def forward_backward(" not in compact


# ----------------------------------------------------------------------------------------
# te scripts


LINEAR = [
    {"name": "Linear", "attrs": {"out": 6, "accumulate_into_main_grad": 0}},
    {"name": "Bias"},
    {"name": "GELU"},
]


def test_a_three_op_te_script_is_short_and_builds_the_case_with_te_ops():
    paths = [{"name": "fused", "fusions": ["ForwardLinearBiasActivation"]}, {"name": "unfused"}]
    script = export(spec(LINEAR, dtype="float32"), "te", paths=paths)
    compile(script, "exported_te.py", "exec")
    lines = script.splitlines()
    # The case and its test first, gradfuzz's helpers after: a reader sees the case in
    # about a hundred lines.
    assert EMBEDDED_MARK not in script  # nothing TE lacks
    assert len(lines) <= 150, len(lines)
    for expected in (
        "import transformer_engine.pytorch as te  # noqa: E402",
        "op0 = te.ops.BasicLinear(8, 6, device=DEVICE, dtype=DTYPE, "
        "accumulate_into_main_grad=False)",
        "        op0.weight.copy_(W0)",
        "op1 = te.ops.Bias(6, device=DEVICE, dtype=DTYPE)",
        "op2 = te.ops.GELU(cache_quantized_input=False)",
        "model = te.ops.Sequential(op0, op1, op2)",
        "    h = F.linear(x, w0)  # Linear",
        '    h = F.gelu(h, approximate="tanh")  # GELU',
        "@pytest.mark.parametrize(\"fusions\", [['ForwardLinearBiasActivation'], []], "
        "ids=['fused', 'unfused'])",
        'DTYPE, DEVICE = torch.float32, torch.device("cuda")',
        "    only_fusions(monkeypatch, fusions)",
        '("grad_param[0].Linear[0]", ops[0].weight)',
    ):
        assert expected in script, expected
    # Only what the case uses: no other catalog op, no custom op, no runtime.
    absent_names = ("def grouped_linear", "class Dispatch", "class FusedResidual", "BasicOp(")
    for absent in (*absent_names, "zlib"):
        assert absent not in script, absent


def test_te_script_of_grouped_linear_uses_the_parameter_helpers():
    ops = [{"name": "GroupedLinear", "attrs": {"groups": 2, "out": 4, "single_grouped_weight": 1}}]
    script = export(spec(ops, shape=(6, 8), dtype="bfloat16"), "te")
    compile(script, "exported_te.py", "exec")
    assert 'os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")' in script
    assert 'copy_param_values(op0, "GroupedLinear", ' in script
    assert "def model_param_grads(op, name, autograd_grads):" in script


def test_generating_a_te_script_imports_no_te():
    probe = (
        "import sys, json\n"
        "from gradfuzz_adapter.__main__ import Server\n"
        "from gradfuzz_adapter.client import make_request\n"
        "h, t = make_request(json.loads(sys.argv[1]), op='export', backend='te', "
        "expect={'kind': 'pass'})\n"
        "reply, _ = Server('te').handle(h, t)\n"
        "assert reply['ok'] and 'te.ops.MakeExtraOutput' in reply['script']\n"
        "print(sorted(m for m in sys.modules if m.startswith('transformer_engine')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(spec(RESIDUAL, shape=(6, 8)))],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_te_script_expecting_an_error_uses_tes_exception():
    ops = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("c")]},
        {"name": "RowStat", "output_bindings": [bound("c")]},
    ]
    expect = {"kind": "error", "error_kind": "duplicate-producer", "tolerance": TOLERANCE}
    script = export(spec(ops), "te", expect)
    compile(script, "exported_te.py", "exec")
    assert "with pytest.raises((ValueError,), match='has multiple producers')" in script
    assert "left locked by the failed construction" in script


STUB_PRELUDE = """
import sys
sys.path.insert(0, {tests!r})
import te_stub
te_stub.install()
import pytest
if "--stale-plan" in sys.argv:
    # A planted defect: from its second call on, a fuser runs its basic ops unfused.
    sys.argv.remove("--stale-plan")
    from transformer_engine.pytorch.ops.fuser import OperationFuser
    original, seen = OperationFuser.maybe_fuse_ops, set()
    def stale(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if id(self) in seen:
            self._forward_ops = [(op, [i]) for i, op in enumerate(self._basic_ops)]
        seen.add(id(self))
    OperationFuser.maybe_fuse_ops = stale
for path in sys.argv[1:]:
    if path.endswith(".py"):
        source = open(path).read()
        source = source.replace('torch.device("cuda")', 'torch.device("cpu")')
        open(path, "w").write(source)
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def stub():
    import te_stub

    reason = te_stub.available()
    if reason:
        pytest.skip(reason)
    return STUB_PRELUDE.format(tests=HERE)


RUNNABLE = RESIDUAL[:3] + [
    {"name": "Bias"},
    {"name": "Boundary"},
    {
        "name": "Dispatch",
        "attrs": {"groups": 2},
        "output_bindings": [{"channel": None}, {"channel": None}, bound("map")],
    },
    {"name": "RowStat", "output_bindings": [bound("s", True)]},
    {"name": "DualExtraOutput", "output_bindings": [bound("d")]},
    {"name": "AddExtraInput", "input_channels": ["d"]},
    {"name": "Combine", "input_channels": ["map"]},
]
JOINT = [{"name": "fused", "fusions": ["FusedResidual.joint"]}, {"name": "unfused"}]


def test_te_scripts_fail_exactly_on_tes_defects(tmp_path, stub):
    """On TE's real fuser and ops (compiled extension stubbed; ops that need no kernel)."""
    generator = [
        dict(op, output_style="generator") if op["name"] == "RowStat" else op for op in RUNNABLE
    ]
    in_place = [
        {"name": "MakeExtraOutput", "attrs": {"in_place": 1}, "output_bindings": [bound("c")]},
        {"name": "ConstantScale", "attrs": {"scale": 0.5}},
        {"name": "AddExtraInput", "attrs": {"in_place": 1}, "input_channels": ["c"]},
    ]
    wiring = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "Boundary"},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    missing = {"kind": "error", "error_kind": "missing-producer"}
    scripts = {
        "test_good.py": export(
            spec(RUNNABLE, shape=(6, 8), dtype="float32", seed=3), "te", paths=JOINT
        ),
        # Review finding 2 in TE 2.20.2: a generator of extra outputs is sized with len().
        "test_finding2.py": export(spec(generator, shape=(6, 8), dtype="float32", seed=3), "te"),
        # Review finding 3: a standalone call locks the op's bindings.
        "test_finding3.py": export(
            spec(RUNNABLE, shape=(6, 8), dtype="float32", seed=3, call_then_bind=[{"op": 2}]),
            "te",
        ),
        # In-place ops write into the caller's input and cotangent.
        "test_in_place.py": export(spec(in_place, dtype="float32"), "te"),
        # A routing error in a later fuser at the first forward leaves the earlier locked.
        "test_left_locked.py": export(spec(wiring, dtype="float32"), "te", missing),
        # The same error within one fuser: raised, nothing left locked.
        "test_raises.py": export(
            spec([{"name": "AddExtraInput", "input_channels": ["nowhere"]}], dtype="float32"),
            "te",
            missing,
        ),
    }
    outcomes, output = run_pytest(tmp_path, scripts, stub)
    assert outcome(outcomes, "test_good.py") == {"PASSED"}, output
    assert outcome(outcomes, "test_finding2.py") == {"FAILED"}, output
    assert "object of type 'generator' has no len()" in output
    assert outcome(outcomes, "test_finding3.py") == {"FAILED"}, output
    assert "Cannot change extra tensor channels" in output
    assert outcome(outcomes, "test_in_place.py") == {"FAILED"}, output
    assert "input: changed by the call (a caller tensor)" in output
    assert "cotangent[0]: changed by the call (a caller tensor)" in output
    assert outcome(outcomes, "test_left_locked.py") == {"FAILED"}, output
    assert "ops [0] left locked by the failed construction" in output
    assert outcome(outcomes, "test_raises.py") == {"PASSED"}, output


def test_te_repeat_calls_check_the_plans_against_a_fresh_sequential(tmp_path, stub):
    repeats = [{"no_grad": True}, {"input_requires_grad": False}, {}]
    case_spec = spec(RUNNABLE[:4], dtype="float32", seed=2, repeat_calls=repeats)
    script = export(case_spec, "te", paths=JOINT)
    assert "plans(model) != plans(fresh)" in script
    outcomes, output = run_pytest(tmp_path, {"test_repeats.py": script}, stub)
    assert outcome(outcomes, "test_repeats.py") == {"PASSED"}, output
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            stub,
            "--stale-plan",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_repeats.py",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=""),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "call[1] plans [[[('MakeExtraOutput', [0])" in result.stdout
    assert "a fresh Sequential's [[[('FusedResidual.joint', [0, 1, 2])" in result.stdout


def test_te_weight_gradients_outside_autograd_are_read_where_te_puts_them():
    """accumulate_into_main_grad (drawn for half of TE's Linears) and delay_wgrad_compute:
    the script attaches main_grad and reads it, or runs backward_dw and reads .grad, as
    te/params.py does, without embedding it; repeat calls clear them first."""
    linear = [{"name": "Linear", "attrs": {"out": 4, "accumulate_into_main_grad": 1}}]
    script = export(spec(linear, dtype="float32", repeat_calls=[{}]), "te")
    compile(script, "exported_te.py", "exec")
    for expected in (
        "    op0.weight.main_grad = torch.zeros(op0.weight.shape, dtype=torch.float32, "
        "device=DEVICE)",
        '        got["grad_param[0].Linear[0]"] = ops[0].weight.main_grad',
        "        before_repeat_call(ops)",
    ):
        assert expected in script, expected
    grouped = [
        {"name": "GroupedLinear", "attrs": {"groups": 2, "out": 4, "delay_wgrad_compute": 1}}
    ]
    script = export(spec(grouped, shape=(6, 8), dtype="bfloat16"), "te")
    compile(script, "exported_te.py", "exec")
    for expected in (
        "        op0.weight1.copy_(W0[1])",
        "    if ops[0].need_backward_dw():",
        "        ops[0].backward_dw()",
        '    got["grad_param[0].GroupedLinear[0]"] = torch.stack([ops[0].weight0.grad, '
        "ops[0].weight1.grad])",
    ):
        assert expected in script, expected
    assert "def model_param_grads" not in script and "before_repeat_call" not in script


def test_te_script_registers_fused_residual_only_where_it_can_fire():
    paths = [{"name": "fused", "fusions": ["FusedResidual.backward", "FusedResidual.joint"]}]
    no_window = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "RMSNorm"},
    ]
    script = export(spec(no_window, dtype="float32"), "te", paths=paths)
    assert "FusedResidual" not in script.split("@pytest.mark.parametrize")[1].split("\n", 1)[1]
    assert EMBEDDED_MARK not in script and len(script.splitlines()) <= 150
    script = export(spec(RESIDUAL[:3], dtype="float32"), "te", paths=paths)
    assert "class FusedResidual(te.ops.FusedOperation):" in script
    # Added to TE's lists per test, not registered for the whole process.
    assert (
        'OWN_FUSIONS = {"backward_fusion_functions": [fuse_residual_backward], '
        '"forward_backward_fusion_functions": [fuse_residual_joint]}'
    ) in script
    assert "OWN_FUSIONS.get(attr, [])" in script and "register_" not in script
    assert "fuse_residual_forward" not in script  # no path names the forward pass
