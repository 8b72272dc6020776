"""The driver's Protocol 2 fields (docs/BACKENDS.md): error origins, the writer of a changed
caller tensor (modified_by) and repeat calls, on the torch runtime and on TE's own Python
code over the stubbed extension (te_stub.py)."""

import inspect

import pytest
import torch
from helpers import run, spec

from gradfuzz_adapter import driver
from gradfuzz_adapter.case import decode_case
from gradfuzz_adapter.client import make_request
from gradfuzz_adapter.driver import WriterTracker, _CallerTensors, error_origin
from gradfuzz_adapter.protocol import TensorList
from gradfuzz_adapter.torch_backend import runtime as torch_runtime
from gradfuzz_adapter.torch_backend.backend import TorchBackend, TorchBuilder


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


def line_of(function, text):
    """The line number of the first line of `function`'s source that contains `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


class WatchedTorchBuilder(TorchBuilder):
    """The torch builder with the writer hook wired as torch_backend should wire it."""

    def writer_scope(self, seq, case, ops, tracker):
        return driver.torch_writer_scope(seq, case, tracker)


@pytest.fixture
def torch_backend():
    backend = TorchBackend()
    backend.builder = WatchedTorchBuilder()
    return backend


# ----------------------------------------------------------------------------------------
# Error origins


def test_a_locked_late_bind_names_the_public_setter_of_the_torch_runtime(torch_backend):
    ops = [{"name": "AddExtraInput"}]
    late = [{"op": 0, "slot": 0, "channel": "r"}]
    _, results = run(torch_backend, spec(ops, late_binds=late))
    error = results[0]["error"]
    assert (error["kind"], error["phase"]) == ("locked", "late binding")
    # _check_binding raises; the public method that called it is the cause.
    assert error["origin"] == "BasicOp.set_extra_input_channel"
    line = line_of(torch_runtime.BasicOp.set_extra_input_channel, "self._check_binding(")
    assert error["origin_file"] == f"gradfuzz_adapter/torch_backend/runtime.py:{line}"


def test_a_routing_error_names_the_fuser_constructor(torch_backend):
    ops = [{"name": "AddExtraInput", "input_channels": ["nowhere"]}]
    _, results = run(torch_backend, spec(ops))
    error = results[0]["error"]
    assert (error["kind"], error["origin"]) == ("missing-producer", "Fuser.__init__")
    assert error["origin_file"].startswith("gradfuzz_adapter/torch_backend/runtime.py:")


def test_an_origin_skips_torch_the_driver_and_the_builder():
    builder = TorchBuilder()

    def raise_in_torch():
        torch.zeros(2).view(3)  # raises inside torch: no frame of the code under test

    try:
        raise_in_torch()
    except RuntimeError as exc:
        origin = error_origin(exc, builder)
    # The test's own function is the only frame outside torch (a module-level function).
    assert origin["origin"] == "test_an_origin_skips_torch_the_driver_and_the_builder"
    assert origin["origin_file"].startswith("test_driver.py:")

    class Builder(TorchBuilder):
        def create_op(self, op_case, case, device):
            raise ValueError("in the builder")

    builder = Builder()
    try:
        builder.create_op(None, None, None)
    except ValueError as exc:
        origin = error_origin(exc, builder)
    assert origin["origin"] == "test_an_origin_skips_torch_the_driver_and_the_builder"


# ----------------------------------------------------------------------------------------
# Writers


@pytest.mark.parametrize("deferred", [None, True])
def test_the_tracker_attributes_a_change_to_the_group_that_made_it(deferred):
    # deferred: the comparisons a GPU tensor gets (flags resolved at leave), here on the CPU.
    caller = _CallerTensors()
    a, b = torch.zeros(3), torch.zeros(2)
    caller.add("input", a)
    caller.add("extra_input[0]", b)
    tracker = WriterTracker(caller, deferred=deferred)
    b += 1  # outside any group: nobody's
    first = {"name": "A", "begin": 0, "end": 1, "pass": "forward"}
    second = {"name": "B", "begin": 1, "end": 2, "pass": "forward"}

    class Op:
        def run(self, t):
            t.mul_(2)

        def write(self, t):
            t.add_(5)

    op0, op1 = Op(), Op()
    tracker.instrument(op0, "run", first)
    tracker.instrument(op1, "write", second)
    op0.run(b)  # b changes again, inside group A
    op1.write(a)
    op0.run(torch.zeros(1))
    tracker.leave()
    assert tracker.writers == {"extra_input[0]": first, "input": second}
    tracker.restore()
    assert "run" not in op0.__dict__ and "write" not in op1.__dict__


def test_the_writer_of_an_in_place_add_on_the_torch_runtime(torch_backend, monkeypatch):
    # A planted defect: the runtime hands AddExtraInput(in_place) the caller's tensor
    # instead of a private copy (runtime.Fuser.forward), so the add writes into it.
    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)
    ops = [
        {"name": "ConstantScale", "attrs": {"scale": 0.5}},
        {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [False]},
        {"name": "GELU"},
    ]
    _, results = run(torch_backend, spec(ops))
    assert results[0]["modified"] == ["extra_input[0]"]
    assert results[0]["modified_by"] == {
        "extra_input[0]": {"name": "AddExtraInput", "begin": 1, "end": 2, "pass": "forward"}
    }


def test_no_second_run_looks_for_a_writer_when_nothing_changed(torch_backend, monkeypatch):
    def fail(*args):
        raise AssertionError("the instrumented second run ran")

    monkeypatch.setattr(driver, "_writers", fail)
    ops = [{"name": "AddExtraInput", "attrs": {"in_place": 1}}]
    paths = [{"name": "fused", "modified_by": "rerun"}]
    _, results = run(torch_backend, spec(ops), paths=paths)
    assert results[0]["modified"] == [] and "modified_by" not in results[0]


def test_the_first_call_itself_names_the_writer_without_a_second_run(torch_backend, monkeypatch):
    def fail(*args):
        raise AssertionError("the instrumented second run ran")

    monkeypatch.setattr(driver, "_writers", fail)
    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)
    ops = [{"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]}]
    _, results = run(torch_backend, spec(ops))
    assert results[0]["modified_by"]["extra_input[0]"]["name"] == "AddExtraInput"
    # A path that asks for no writer gets none.
    _, results = run(torch_backend, spec(ops), paths=[{"name": "fused", "modified_by": False}])
    assert results[0]["modified"] == ["extra_input[0]"] and "modified_by" not in results[0]


def same_results(a, b):
    """Whether two replies of a path agree on everything the oracle reads."""
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for key in a:
        if key in ("outputs", "grad_extra_inputs"):
            assert all(_same_tensor(x, y) for x, y in zip(a[key], b[key])), key
        elif key == "grad_input":
            assert _same_tensor(a[key], b[key])
        elif key == "grad_params":
            for x, y in zip(a[key], b[key]):
                assert all(_same_tensor(g, h) for g, h in zip(x, y))
        elif key == "channel_grads":
            for x, y in zip(a[key], b[key]):
                assert x.keys() == y.keys() and all(_same_tensor(x[k], y[k]) for k in x)
        elif key != "repeats":
            assert a[key] == b[key], key
    for x, y in zip(a.get("repeats", []), b.get("repeats", [])):
        same_results(x, y)
    return True


def _same_tensor(x, y):
    return (x is None and y is None) or torch.equal(x, y)


def test_a_watched_first_call_finds_the_writers_a_second_run_finds(torch_backend, monkeypatch):
    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)
    cases = [
        [
            {"name": "ConstantScale", "attrs": {"scale": 0.5}},
            {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
            {"name": "GELU"},
        ],
        [
            {"name": "Bias"},
            {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
            {"name": "ConstantScale", "attrs": {"scale": 0.5}},
            {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
        ],
    ]
    for ops in cases:
        found = {}
        for mode in (True, "rerun"):
            _, results = run(
                torch_backend, spec(ops), paths=[{"name": "fused", "modified_by": mode}]
            )
            found[mode] = results[0]
        assert found[True]["modified_by"], found[True]
        assert same_results(found[True], found["rerun"])


def test_a_tracker_that_cannot_compare_reports_no_writer_and_lets_the_call_run(monkeypatch):
    caller = _CallerTensors()
    a = torch.zeros(3)
    caller.add("input", a)
    tracker = WriterTracker(caller)

    def broken():
        raise ValueError("a comparison failed")

    monkeypatch.setattr(tracker, "_compare", broken)

    class Op:
        def write(self, t):
            t.add_(1)
            return "ran"

    op = Op()
    tracker.instrument(op, "write", {"name": "A", "begin": 0, "end": 1, "pass": "forward"})
    assert op.write(a) == "ran"
    tracker.leave()
    assert tracker.failed and tracker.writers == {}


# The tracker's comparisons: deferred None compares at once (the CPU's mode), True queues
# flags as on a GPU (one batched snapshot per check).

GROUPS = {n: {"name": n, "begin": i, "end": i + 1, "pass": "forward"} for i, n in enumerate("ABC")}


def tracked(tensors, deferred):
    caller = _CallerTensors()
    for name, t in tensors.items():
        caller.add(name, t)
    return WriterTracker(caller, deferred=deferred)


def run_groups(tracker, steps):
    """Runs `steps`, (group name or None, function that writes) each, as the instrumented
    groups' runs would: a check at each step's start, one at leave()."""
    for group, write in steps:
        tracker.enter(GROUPS.get(group))
        if write is not None:
            write()
    tracker.leave()
    assert not tracker.failed
    return {name: group["name"] for name, group in tracker.writers.items()}


@pytest.mark.parametrize("deferred", [None, True])
def test_the_tracker_tells_apart_tensors_of_mixed_dtypes(deferred):
    t = {
        "f32": torch.rand(3, 4),
        "bf16": torch.rand(5).to(torch.bfloat16),
        "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False, True]),
        "f32b": torch.rand(7),
    }
    tracker = tracked(t, deferred)

    def a():
        t["bf16"][2] += 1

    def b():
        t["bool"][1] = True
        t["i64"][1, 2] = -4

    assert run_groups(tracker, [("A", a), ("B", b), ("C", None)]) == {
        "bf16": "A",
        "bool": "B",
        "i64": "B",
    }


@pytest.mark.parametrize("deferred", [None, True])
def test_a_non_contiguous_caller_tensor_changes_by_its_own_elements(deferred):
    # base[:, ::2] flattens to a view of stride 2 (reshape(-1) copies nothing).
    base = torch.zeros(4, 6)
    t = {"strided": base[:, ::2], "transposed": torch.zeros(3, 5).t(), "plain": torch.zeros(2)}
    assert not t["strided"].is_contiguous() and not t["transposed"].is_contiguous()
    tracker = tracked(t, deferred)

    def a():
        base[:, 1] = 7  # beside the strided view's elements: no change of it

    def b():
        t["strided"][3, 2] = 1
        t["transposed"][4, 0] = 2

    assert run_groups(tracker, [("A", a), ("B", b)]) == {"strided": "B", "transposed": "B"}


@pytest.mark.parametrize("deferred", [None, True])
def test_empty_and_zero_dim_caller_tensors(deferred):
    t = {"empty": torch.zeros(0, 3), "scalar": torch.tensor(1.5), "flag": torch.tensor(False)}
    tracker = tracked(t, deferred)

    def b():
        t["scalar"].mul_(2)
        t["flag"].fill_(True)

    assert run_groups(tracker, [("A", None), ("B", b), ("C", None)]) == {
        "scalar": "B",
        "flag": "B",
    }


@pytest.mark.parametrize("deferred", [None, True])
def test_a_nan_that_nobody_writes_is_no_change(deferred):
    # NaN != NaN: a comparison by value called this tensor changed at every check.
    t = {"nan": torch.tensor([float("nan"), 1.0, float("nan")]), "other": torch.zeros(2)}
    tracker = tracked(t, deferred)

    def b():
        t["other"][0] = 1

    assert run_groups(tracker, [("A", None), ("B", b), ("C", None)]) == {"other": "B"}


@pytest.mark.parametrize("deferred", [None, True])
def test_a_nan_written_over_a_number_is_a_change(deferred):
    t = {"x": torch.ones(3)}
    tracker = tracked(t, deferred)

    def b():
        t["x"][1] = float("nan")

    assert run_groups(tracker, [("A", None), ("B", b), ("C", None)]) == {"x": "B"}


def test_a_nan_nobody_wrote_is_no_change_and_a_nan_written_is():
    caller = _CallerTensors()
    kept = torch.tensor([1.0, float("nan"), 3.0])
    written = torch.tensor([1.0, 2.0, 3.0])
    ints = torch.tensor([1, 2])
    caller.add("input", kept)
    caller.add("extra_input[0]", written)
    caller.add("extra_input[1]", ints)
    assert caller.modified() == []
    written[1] = float("nan")
    kept[0] = float("nan")
    assert caller.modified() == ["input", "extra_input[0]"]


def test_a_negative_zero_written_over_zero_is_a_change():
    # The batched (deferred) comparison is bit-exact. The immediate one compares by value
    # as _CallerTensors.modified does, which reports no such tensor as modified either.
    t = {"x": torch.zeros(3), "y": torch.zeros(2, dtype=torch.bfloat16)}
    tracker = tracked(t, True)

    def b():
        t["x"][1] = -0.0
        t["y"].neg_()

    assert run_groups(tracker, [("A", None), ("B", b)]) == {"x": "B", "y": "B"}


@pytest.mark.parametrize("deferred", [None, True])
def test_only_the_second_of_two_groups_writes(deferred):
    t = {"x": torch.zeros(4), "y": torch.zeros(4)}
    tracker = tracked(t, deferred)

    def b():
        t["y"].add_(1)

    assert run_groups(tracker, [(None, None), ("A", None), ("B", b), (None, None)]) == {"y": "B"}


@pytest.mark.parametrize("deferred", [None, True])
def test_tensors_resized_replaced_or_freed_mid_run(deferred):
    t = {k: torch.zeros(2, 2) for k in ("resized", "replaced", "freed", "late", "quiet")}
    tracker = tracked(t, deferred)

    def a():
        t["resized"].resize_(3, 3)

    def b():
        t["replaced"].data = torch.empty(0)  # as TE's clear_tensor_data frees a tensor

    def c():
        t["freed"].untyped_storage().resize_(0)  # reading it crashed the process (SIGSEGV)

    def c_again():
        t["late"][0, 0] = 1  # after the checks that fell back, a batched one again

    steps = [("A", a), ("B", b), (None, None), ("C", c), ("A", None), ("B", c_again), ("C", None)]
    assert run_groups(tracker, steps) == {
        "resized": "A",
        "replaced": "B",
        "freed": "C",
        "late": "B",
    }


@pytest.mark.parametrize("deferred", [None, True])
def test_a_freed_tensor_outside_any_group_is_nobodys(deferred):
    t = {"freed": torch.zeros(3), "x": torch.zeros(3)}
    tracker = tracked(t, deferred)

    def b():
        t["x"].add_(1)

    steps = [(None, lambda: t["freed"].untyped_storage().resize_(0)), ("A", None), ("B", b)]
    assert run_groups(tracker, steps) == {"x": "B"}


def test_a_deferred_check_queues_one_flag_tensor_for_all_tensors():
    t = {f"t{k}": torch.zeros(k + 1) for k in range(8)}
    tracker = tracked(t, True)
    for group in "ABAB":
        tracker.enter(GROUPS[group])
    assert len(tracker.pending) == 4
    assert all(len(names) == 8 and flags.shape == (8,) for _, names, flags in tracker.pending)
    t["t3"].add_(1)
    tracker.leave()
    assert tracker.writers == {"t3": GROUPS["B"]}


def test_past_batch_bytes_the_checks_go_tensor_by_tensor(monkeypatch):
    monkeypatch.setattr(WriterTracker, "BATCH_BYTES", 40)
    t = {"small": torch.zeros(2), "large": torch.zeros(10)}
    tracker = tracked(t, True)
    tracker.enter(GROUPS["A"])
    assert [names for _, names, _ in tracker.pending] == [("small",), ("large",)]

    def b():
        t["large"][9] = 1

    assert run_groups(tracker, [("B", b), ("C", None)]) == {"large": "B"}


class ReferenceTracker:
    """The tracker's contract, tensor by tensor and at once: at each check a tensor not yet
    attributed whose bytes differ from the previous check's is the open group's (nobody's
    outside a group)."""

    def __init__(self, caller):
        self.caller = caller
        self.previous = {name: pristine.clone() for name, _, pristine in caller.entries}
        self.current = None
        self.writers = {}

    @staticmethod
    def same(a, b):
        return (a.shape, a.dtype) == (b.shape, b.dtype) and torch.equal(
            a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
        )

    def enter(self, group):
        for name, given, pristine in self.caller.entries:
            seen = self.previous.setdefault(name, pristine.clone())
            if name in self.writers:
                continue
            if not self.same(given.detach(), seen) and self.current is not None:
                self.writers[name] = self.current
            self.previous[name] = given.detach().clone()
        self.current = group


def random_tensor(gen, device):
    dtype = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool][
        int(torch.randint(5, (), generator=gen))
    ]
    shape = [(3,), (2, 3), (), (0,), (4, 4), (5, 2)][int(torch.randint(6, (), generator=gen))]
    t = torch.randint(-2, 3, shape, generator=gen).to(dtype)
    if len(shape) == 2 and torch.rand((), generator=gen) < 0.5:
        t = t.t()  # non-contiguous
    return t.to(device)


def random_write(gen, t, signed_zero):
    if t.numel() == 0:
        return
    i = torch.randint(t.numel(), (), generator=gen)
    index = tuple(int(j) for j in torch.unravel_index(i, t.shape))
    choice = int(torch.randint(4, (), generator=gen))
    if t.dtype == torch.bool:
        t[index] = bool(choice % 2)
    elif t.dtype == torch.int64:
        t[index] = choice - 1
    else:
        t[index] = [float("nan"), -0.0 if signed_zero else 0.0, 1.0, 2.5][choice]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize(
    "device, deferred, signed_zero",
    [("cpu", True, True), ("cpu", None, False), pytest.param("cuda", None, True, marks=CUDA)],
)
@pytest.mark.parametrize("seed", range(12))
def test_random_writes_are_attributed_as_the_reference_attributes_them(
    device, deferred, signed_zero, seed
):
    # signed_zero: -0.0 among the values written (the immediate mode compares by value).
    gen = torch.Generator().manual_seed(seed)
    caller = _CallerTensors()
    tensors = []

    def add():
        t = random_tensor(gen, device)
        caller.add(f"t{len(tensors)}", t)
        tensors.append(t)

    for _ in range(int(torch.randint(3, 9, (), generator=gen))):
        add()
    tracker = WriterTracker(caller, deferred=deferred)
    reference = ReferenceTracker(caller)
    for _ in range(int(torch.randint(4, 20, (), generator=gen))):
        group = GROUPS.get([None, "A", "B", "C"][int(torch.randint(4, (), generator=gen))])
        tracker.enter(group)
        reference.enter(group)
        for _ in range(int(torch.randint(3, (), generator=gen))):
            k = int(torch.randint(len(tensors), (), generator=gen))
            random_write(gen, tensors[k], signed_zero)
        if torch.rand((), generator=gen) < 0.1:
            add()  # as a cotangent is added for the backward
    tracker.leave()
    reference.enter(None)
    assert not tracker.failed
    assert tracker.writers == reference.writers


class UnwatchedTorchBuilder(TorchBuilder):
    """A builder without the writer hook (the driver's default)."""

    def writer_scope(self, seq, case, ops, tracker):
        return driver.Builder.writer_scope(self, seq, case, ops, tracker)


def test_without_the_hook_a_changed_tensor_has_no_writer(monkeypatch):
    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)
    ops = [{"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]}]
    backend = TorchBackend()
    backend.builder = UnwatchedTorchBuilder()
    _, results = run(backend, spec(ops))
    assert results[0]["modified"] == ["extra_input[0]"] and "modified_by" not in results[0]


def test_the_backends_builders_name_the_writer(monkeypatch):
    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)
    ops = [{"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]}]
    _, results = run(TorchBackend(), spec(ops))
    assert results[0]["modified"] == ["extra_input[0]"]
    assert results[0]["modified_by"]["extra_input[0]"]["name"] == "AddExtraInput"


# ----------------------------------------------------------------------------------------
# Repeat calls


REPEATS = [{"no_grad": True}, {"input_requires_grad": False}, {}]


def test_repeat_calls_on_the_torch_runtime_give_the_first_calls_values(torch_backend):
    ops = [
        {"name": "Linear", "attrs": {"out": 6}},
        {"name": "RowStat", "output_bindings": [bound("s", True)]},
        {"name": "ScaledSReLU", "input_channels": ["s"]},
    ]
    paths = [{"name": "fused", "fusions": ["AnyName"]}]
    _, results = run(torch_backend, spec(ops, repeat_calls=REPEATS), paths=paths)
    first = results[0]
    names = [r["name"] for r in first["repeats"]]
    assert names == ["fused.call[1]", "fused.call[2]", "fused.call[3]"]
    no_grad, frozen_input, again = first["repeats"]
    for repeat in first["repeats"]:
        assert repeat["status"] == "ok" and repeat["modified"] == []
        assert len(repeat["outputs"]) == 2
        for got, want in zip(repeat["outputs"], first["outputs"]):
            assert torch.equal(got, want)
        assert repeat["plans"] == first["plans"]
        assert repeat["expected_plans"] == first["plans"]  # torch: one group per op
        assert "channel_grads" not in repeat
    assert "grad_input" not in no_grad  # forward only
    assert frozen_input["grad_input"] is None
    for repeat in (frozen_input, again):
        for got, want in zip(repeat["grad_params"], first["grad_params"]):
            assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert torch.equal(again["grad_input"], first["grad_input"])


def test_a_failing_repeat_call_ends_the_repeats(torch_backend, monkeypatch):
    calls = []
    original = torch_runtime.Sequential.__call__

    def second_call_fails(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise torch_runtime.InvalidArgumentError("the second call")
        return original(self, *args)

    monkeypatch.setattr(torch_runtime.Sequential, "__call__", second_call_fails)
    _, results = run(torch_backend, spec([{"name": "GELU"}], repeat_calls=REPEATS))
    first = results[0]
    assert first["status"] == "ok"
    assert [r["status"] for r in first["repeats"]] == ["error"]
    error = first["repeats"][0]["error"]
    assert (error["kind"], error["phase"], error["message"]) == (
        "invalid-argument",
        "forward",
        "the second call",
    )
    # Every frame is plumbing, the builder or a nested function: the innermost is taken.
    assert error["origin"] == "second_call_fails"


def test_a_case_without_repeat_calls_has_no_repeats(torch_backend):
    _, results = run(torch_backend, spec([{"name": "GELU"}]))
    assert "repeats" not in results[0]


def test_hello_says_protocol_2_and_repeat_calls():
    hello = driver.protocol_hello(TorchBackend().hello())
    assert hello["protocol"] == 2 and hello["capabilities"]["repeat_calls"] is True
    hello = driver.protocol_hello({"protocol": 1, "capabilities": {"repeat_calls": False}})
    assert hello["capabilities"]["repeat_calls"] is False  # a backend may say otherwise


# ----------------------------------------------------------------------------------------
# On TE's Python code


@pytest.fixture(scope="module")
def te():
    import te_stub

    reason = te_stub.available()
    if reason:
        pytest.skip(reason)
    te_stub.install()
    from gradfuzz_adapter.te import backend as te_backend

    backend = te_backend.TEBackend(device="cpu")

    class WatchedTEBuilder(te_backend.TEBuilder):
        def writer_scope(self, seq, case, ops, tracker):
            return driver.te_writer_scope(self.operation_fuser, case, ops, tracker)

    builder = backend.builder
    backend.builder = WatchedTEBuilder(builder.te, builder.ext, builder.operation_fuser, "cpu")
    return backend


def test_te_locked_after_a_standalone_call_names_basic_operations_setter(te):
    ops = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("c")]},
        {"name": "AddExtraInput", "input_channels": ["c"]},
    ]
    _, results = run(te, spec(ops, dtype="float32", call_then_bind=[{"op": 1}]))
    error = results[0]["error"]
    assert (error["kind"], error["phase"]) == ("locked", "binding")
    # Raised by _check_extra_tensor_channels_unlocked, called by the setter AddExtraInput
    # inherits: the defining class is named, so every subclass's case is one cause.
    assert error["origin"] == "BasicOperation.set_extra_input_channel"
    operation = te.te.ops.BasicOperation
    line = line_of(operation.set_extra_input_channel, "self._check_extra_tensor_channels_")
    assert error["origin_file"] == f"transformer_engine/pytorch/ops/op.py:{line}"


def test_te_routing_error_at_the_first_forward_names_the_fuser(te):
    ops = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "Boundary"},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    _, results = run(te, spec(ops, dtype="float32"))
    error = results[0]["error"]
    assert (error["kind"], error["origin"]) == ("missing-producer", "OperationFuser.__init__")
    assert error["origin_file"].startswith("transformer_engine/pytorch/ops/fuser.py:")


def test_te_custom_op_errors_name_the_custom_op(te):
    ops = [{"name": "Dispatch", "attrs": {"groups": 2}}]
    case_spec = spec(ops, dtype="float32", shape=(4, 8))
    from gradfuzz_adapter.client import make_request

    header, tensors = make_request(case_spec)
    tensors[header["values"]["extra_inputs"][0]] = torch.zeros(3, 2, dtype=torch.float64)
    from gradfuzz_adapter.case import decode_case
    from gradfuzz_adapter.protocol import TensorList

    results = te.run(decode_case(header, tensors), header["paths"], TensorList())
    error = results[0]["error"]
    assert error["kind"] == "invalid-argument"
    assert error["origin"] == "Dispatch.fuser_forward"  # not the catalog's check it called


IN_PLACE = [
    {"name": "MakeExtraOutput", "attrs": {"in_place": 1}, "output_bindings": [bound("c")]},
    {"name": "ConstantScale", "attrs": {"scale": 0.5}},
    {"name": "AddExtraInput", "attrs": {"in_place": 1}, "input_channels": ["c"]},
]


def test_te_writers_of_in_place_ops(te):
    _, results = run(te, spec(IN_PLACE, dtype="float32"), paths=[{"name": "unfused"}])
    result = results[0]
    assert result["modified"] == ["input", "cotangent[0]"]
    # add_extra_input.py: fuser_forward adds x into the channel's value, the caller's input;
    # make_extra_output.py: fuser_backward accumulates into the gradient AddExtraInput handed
    # back for the channel, which is the caller's cotangent itself.
    assert result["modified_by"] == {
        "input": {"name": "AddExtraInput", "begin": 2, "end": 3, "pass": "forward"},
        "cotangent[0]": {"name": "MakeExtraOutput", "begin": 0, "end": 1, "pass": "backward"},
    }


@pytest.mark.parametrize("deferred", [None, True])
def test_te_writers_of_the_watched_first_call_are_those_of_a_second_run(te, monkeypatch, deferred):
    fused_ops = [
        {"name": "ConstantScale", "attrs": {"scale": 2.0}},
        {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "ConstantScale", "attrs": {"scale": 0.75}},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    cases = [(IN_PLACE, []), (fused_ops, ["FusedResidual.joint"])]

    def run_all(mode):
        out = []
        for ops, fusions in cases:
            paths = [
                {"name": "fused", "fusions": fusions, "modified_by": mode},
                {"name": "unfused", "modified_by": mode},
            ]
            out.append(run(te, spec(ops, dtype="float32", repeat_calls=[{}]), paths=paths)[1])
        return out

    reruns = run_all("rerun")
    # deferred=True: the watched call's comparisons all wait for leave(), as on a GPU.
    tracker_init = driver.WriterTracker.__init__
    monkeypatch.setattr(
        driver.WriterTracker,
        "__init__",
        lambda self, caller, deferred_=None: tracker_init(self, caller, deferred=deferred),
    )
    for watched_paths, rerun_paths in zip(run_all(True), reruns):
        for watched, rerun in zip(watched_paths, rerun_paths):
            assert watched["modified_by"], watched
            assert same_results(watched, rerun)


def test_te_writer_inside_a_fused_op(te):
    ops = [
        {"name": "ConstantScale", "attrs": {"scale": 2.0}},
        {"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]},
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "ConstantScale", "attrs": {"scale": 0.75}},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    paths = [{"name": "joint", "fusions": ["FusedResidual.joint"]}]
    _, results = run(te, spec(ops, dtype="float32"), paths=paths)
    result = results[0]
    assert result["modified"] == ["extra_input[0]"]
    assert result["modified_by"] == {
        "extra_input[0]": {"name": "AddExtraInput", "begin": 1, "end": 2, "pass": "forward"}
    }
    assert result["plans"][0]["forward"][-1]["name"] == "FusedResidual.joint"


RESIDUAL = [
    {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
    {"name": "ConstantScale", "attrs": {"scale": 0.75}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
    {"name": "Bias"},
]


def test_te_repeat_calls_give_the_first_calls_values_and_fresh_plans(te):
    paths = [{"name": "joint", "fusions": ["FusedResidual.joint"]}]
    case_spec = spec(RESIDUAL, dtype="float32", repeat_calls=REPEATS)
    _, results = run(te, case_spec, paths=paths)
    first = results[0]
    assert first["status"] == "ok", first
    assert first["plans"][0]["forward"][0]["name"] == "FusedResidual.joint"
    assert [r["status"] for r in first["repeats"]] == ["ok"] * 3
    for repeat in first["repeats"]:
        assert torch.equal(repeat["outputs"][0], first["outputs"][0])
        assert repeat["expected_plans"] == repeat["plans"]
        assert repeat["plans"][0]["forward"] == first["plans"][0]["forward"]
    frozen_input, again = first["repeats"][1:]
    assert frozen_input["grad_input"] is None
    assert torch.equal(again["grad_input"], first["grad_input"])
    # The bias's gradient is the call's own (not accumulated over calls).
    assert torch.equal(again["grad_params"][3][0], first["grad_params"][3][0])


def test_te_repeat_call_with_a_stale_plan_differs_from_the_fresh_plans(te, monkeypatch):
    # A planted defect: from its second call on, a fuser runs its basic ops unfused whatever
    # its (cached) plan says, as a cache keyed wrongly would. A fresh Sequential's first
    # call still plans FusedResidual: the repeat's plans differ from expected_plans.
    fuser_class = te.operation_fuser
    original = fuser_class.maybe_fuse_ops
    seen = set()

    def stale(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if id(self) in seen:
            self._forward_ops = [(op, [i]) for i, op in enumerate(self._basic_ops)]
        seen.add(id(self))

    monkeypatch.setattr(fuser_class, "maybe_fuse_ops", stale)
    paths = [{"name": "joint", "fusions": ["FusedResidual.joint"]}]
    case_spec = spec(RESIDUAL, dtype="float32", repeat_calls=[{"no_grad": True}])
    _, results = run(te, case_spec, paths=paths)
    repeat = results[0]["repeats"][0]
    assert repeat["status"] == "ok", repeat
    names = ["MakeExtraOutput", "ConstantScale", "AddExtraInput", "Bias"]
    assert [g["name"] for g in repeat["plans"][0]["forward"]] == names
    assert [g["name"] for g in repeat["expected_plans"][0]["forward"]] == [
        "FusedResidual.joint",
        "Bias",
    ]


PLANNED_CASES = [
    (RESIDUAL, ["FusedResidual.joint"], {}),
    (RESIDUAL, ["FusedResidual.forward", "FusedResidual.backward"], {}),
    # The input does not require grad: the first op requiring backward is the first with a
    # parameter or an extra input that does (fuser.py: maybe_fuse_ops).
    (
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
            {"name": "ConstantScale", "attrs": {"scale": 2.0}},
            {"name": "AddExtraInput", "input_channels": ["r"]},
            {"name": "AddExtraInput", "extra_input_requires_grad": [1]},
            {"name": "Bias"},
        ],
        ["FusedResidual.joint"],
        {"input_requires_grad": False},
    ),
]


@pytest.mark.parametrize("fault", [None, "te-fuser-backward-boundary-off-by-one"])
@pytest.mark.parametrize("ops,fusions,extra", PLANNED_CASES)
def test_te_fresh_plans_made_without_the_forward_are_the_forwards(
    te, monkeypatch, ops, fusions, extra, fault
):
    # Every repeat call's expected plans from its own fresh Sequential (per_call), planned
    # without running it, against the same with the fresh Sequential's forward run.
    calls = [{"no_grad": True}, {"input_requires_grad": False}, {}, {"no_grad": True}]
    paths = [{"name": "fused", "fusions": fusions, "expected_plans": "per_call"}]
    header, tensors = make_request(
        spec(ops, dtype="float32", repeat_calls=calls, **extra), paths=paths
    )
    forwards = []
    builder = te.builder
    forward = type(builder).forward
    monkeypatch.setattr(
        type(builder), "forward", lambda self, *a: forwards.append(1) or forward(self, *a)
    )

    def expected_plans():
        forwards.clear()
        case = decode_case(header, tensors)
        result = te.run(case, header["paths"], TensorList(), fault=fault)[0]
        assert result["status"] == "ok", result
        return [r["expected_plans"] for r in result["repeats"]], len(forwards)

    planned, planned_forwards = expected_plans()
    monkeypatch.setattr(type(builder), "plan_without_forward", lambda self, *a: False)
    run_forward, run_forwards = expected_plans()
    assert planned == run_forward
    assert any(g["fused"] for plans in planned for p in plans for g in p["forward"])
    # The first call and the repeat calls run; the fresh Sequentials (one per call) do not.
    assert planned_forwards == 1 + len(calls)
    assert run_forwards == 1 + 2 * len(calls)


def test_a_chain_of_sequentials_plans_by_its_forward(te):
    from transformer_engine.pytorch import ops as te_ops

    chain = driver.Chain.__new__(driver.Chain)
    assert te.builder.plan_without_forward(chain, None, []) is False
    mixed = te_ops.Sequential(te_ops.Identity(), torch.nn.Identity())
    assert te.builder.plan_without_forward(mixed, torch.zeros(2, 2), []) is False
    assert mixed._module_groups is None


def test_case_values_go_to_the_device_in_one_copy_per_dtype():
    from gradfuzz_adapter.case import decode_case
    from gradfuzz_adapter.client import make_request

    ops = [
        {"name": "Linear", "attrs": {"out": 6}},
        {"name": "Dispatch", "attrs": {"groups": 2}},
        {"name": "Combine"},
    ]
    header, tensors = make_request(spec(ops, call_then_bind=[{"op": 0}]))
    case = decode_case(header, tensors)
    values = driver._DeviceValues(case)
    device = torch.device("cuda" if torch.cuda.is_available() else "meta")
    values.use(device)
    keys = {"input", ("extra", 0), ("extra", 1), ("call", 0), ("param", 0, 0)}
    keys |= {("cotangent", k) for k, c in enumerate(case.cotangents) if c is not None}
    assert set(values.raw) == keys
    # One buffer per wire dtype: the float64 values are views of one storage.
    floats = [t for t in values.raw.values() if t.dtype == torch.float64]
    assert len({t.untyped_storage().data_ptr() for t in floats}) == 1 or device.type == "meta"
    x = values.fresh("input", case.input, requires_grad=True)
    assert x.shape == case.input.shape and x.dtype == case.dtype and x.requires_grad
    routing = values.fresh(("extra", 1), case.extra_inputs[1])
    assert routing.dtype == torch.int64 and routing.device.type == device.type
    if device.type == "cuda":
        assert torch.equal(x.detach().cpu(), case.input.to(case.dtype))
        assert torch.equal(routing.cpu(), case.extra_inputs[1])


def test_a_request_can_turn_the_writer_search_off(torch_backend, monkeypatch):
    from gradfuzz_adapter.case import decode_case
    from gradfuzz_adapter.client import make_request
    from gradfuzz_adapter.protocol import TensorList

    monkeypatch.setattr(torch_runtime.BasicOp, "writes_extra_input_in_place", lambda s, k: False)
    ops = [{"name": "AddExtraInput", "attrs": {"in_place": 1}, "extra_input_requires_grad": [0]}]
    for flag, expected in ((None, True), (False, False), (True, True)):
        extra = {} if flag is None else {"modified_by": flag}
        header, tensors = make_request(spec(ops), **extra)
        results = torch_backend.run(decode_case(header, tensors), header["paths"], TensorList())
        assert results[0]["modified"] == ["extra_input[0]"]
        assert ("modified_by" in results[0]) is expected, flag


@CUDA
def test_on_a_gpu_the_checks_do_not_wait_for_it():
    t = {f"t{k}": torch.zeros(k, 3, device="cuda") for k in range(8)}
    t["half"] = torch.zeros((), dtype=torch.float16, device="cuda")
    tracker = tracked(t, None)

    def b():
        t["t5"][2, 1].fill_(1)  # (an assignment copies a host scalar: a synchronisation)
        t["half"].fill_(-0.0)

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for group, write in [("A", None), ("B", b), ("C", None), (None, None)]:
            tracker.enter(GROUPS.get(group))
            if write is not None:
                write()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert not tracker.failed and len(tracker.pending) == 4
    tracker.leave()
    assert tracker.writers == {"t5": GROUPS["B"], "half": GROUPS["B"]}


@CUDA
def test_caller_tensors_on_the_cpu_and_a_gpu():
    t = {"cpu": torch.zeros(3), "gpu": torch.zeros(3, device="cuda"), "gpu2": torch.ones(2).cuda()}
    tracker = tracked(t, None)

    def a():
        t["gpu"][0] = 1

    def b():
        t["cpu"][0] = 1
        t["gpu2"][1] = 0

    assert run_groups(tracker, [("A", a), ("B", b)]) == {"gpu": "A", "cpu": "B", "gpu2": "B"}
