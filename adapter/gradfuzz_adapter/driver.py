"""Runs one case through the paths of a backend (docs/BACKENDS.md "run", "Protocol 2").

The steps and their phase names are the same for every backend: op creation, the
call-then-bind calls, binding, Sequential construction, late binding, forward, backward.
A backend supplies a Builder (torch_backend.backend.TorchBuilder, te.backend.TEBuilder) that
knows how its ops are made, bound, run and differentiated; this module does the rest: values on
the device, caller-tensor copies (`modified`) and, when one changed, a second run that
names the plan group that wrote it (`modified_by`), where a path asks for it the tensor
each plan group handed on or returned (`trace`), the loss cotangents, one
autograd.grad call per call of the Sequential, the repeat calls of `spec.repeat_calls` with
the plans a fresh Sequential makes for each, the reply's tensors and error reports with the
function of the code under test that raised (`error.origin`).
"""

import collections
import contextlib
import dataclasses
import functools
import io
import os
import sys
import sysconfig
import time
import types

import torch
import torch.utils.checkpoint

from .fp8_state import StateCheck, to_host
from .invariants import fp8_checks_on

PHASE_CREATE = "op creation"
PHASE_CALL = "call-then-bind call"
PHASE_BIND = "binding"
PHASE_CONSTRUCT = "Sequential construction"
PHASE_LATE_BIND = "late binding"
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_UPDATE = "optimizer step"
PHASE_CHECKPOINT = "checkpoint round trip"

PROTOCOL = 2

# What this process ran, for GRADFUZZ_ADAPTER_TIMING (__main__.py): counts and seconds of the
# paths' first calls (ops built, forward, backward), their repeat calls, the fresh
# Sequentials repeat calls are planned against, and the writer runs (modified_by).
COST = collections.Counter()


@contextlib.contextmanager
def _cost(what):
    start = time.perf_counter()
    try:
        yield
    finally:
        COST[what] += 1
        COST[what + "_s"] += time.perf_counter() - start


@dataclasses.dataclass
class HeldWeight:
    """A quantized weight as its caller reads it (spec.held_quantized_tensor): `tensor` the
    parameter itself (dequantize(), shape, size()); `copies` its row-wise data and its
    column-wise data laid out as the row-wise (transposed back), raw (FP8 codes as bytes, and
    their scales), where the column-wise copy is exactly the row-wise one's transpose for
    this format (per-tensor scaling, 2D blocks), else None."""

    op: int
    tensor: torch.Tensor
    copies: list | None = None


class Builder:
    """What a backend implements for the driver. Every method gets the op objects it made."""

    name = "?"

    def device(self, case):
        raise NotImplementedError

    def fusion_scope(self, fusions):
        """Context manager under which a path with these fusion names runs."""
        return contextlib.nullcontext()

    def create_op(self, op_case, case, device):
        raise NotImplementedError

    def make_boundary(self):
        raise NotImplementedError

    def call_standalone(self, op, x, extras):
        raise NotImplementedError

    def bind_input(self, op, slot, channel):
        raise NotImplementedError

    def bind_output(self, op, slot, channel, output_to_caller):
        raise NotImplementedError

    def is_locked(self, op):
        raise NotImplementedError

    def make_sequential(self, modules):
        raise NotImplementedError

    def forward(self, seq, x, extras):
        """The Sequential's outputs as a list (main output first)."""
        raise NotImplementedError

    def after_forward(self, seq, case, ops, outputs):
        """Called once the first call's forward returned `outputs` (plans, backward
        observers); not for repeat calls, which report no channel gradients."""

    def param_leaves(self, op, op_case):
        """Backend tensors whose gradients autograd.grad should return (requiring grad)."""
        raise NotImplementedError

    def param_grads(self, op, op_case, leaf_grads):
        """The op's parameter gradients in the model's layout (None where none)."""
        raise NotImplementedError

    def channel_leaves(self, seq, case):
        """[(fuser, channel, tensor)] whose total gradient autograd.grad should return."""
        return []

    def after_backward(self, ops):
        """Called after autograd.grad (delayed weight gradients)."""

    def before_repeat_call(self, ops, case):
        """What a training loop does between two steps, before a repeat call: every
        parameter's accumulated gradients cleared (`.grad`, as optimizer.zero_grad; a
        `main_grad` buffer zeroed, as Megatron-LM zeroes its grad buffers), so a call's
        gradients are its own."""
        for op_case in case.catalog_ops:
            for t in self.param_leaves(ops[op_case.index], op_case):
                t.grad = None
                main_grad = getattr(t, "main_grad", None)
                if isinstance(main_grad, torch.Tensor):
                    with torch.no_grad():
                        main_grad.zero_()

    def recorded_channel_grads(self, case):
        """Per fuser {channel: gradient} observed by the backend, or None."""
        return None

    # -- the usage script's steps (docs/BACKENDS.md "Steps")

    def set_params(self, op, op_case, values):
        """An optimizer step's write: the model-layout `values` (on the op's device, in the
        case dtype) copied in place into the op's parameters, under no_grad."""
        with torch.no_grad():
            for t, value in zip(self.param_tensors(op, op_case), values):
                t.copy_(value)

    def param_tensors(self, op, op_case):
        """The op's parameters in the model's layout, one per spec parameter."""
        raise NotImplementedError

    def save_state(self, op):
        """What a checkpoint saves of one op (its state_dict)."""
        return op.state_dict()

    def load_state(self, op, state):
        """A checkpoint's state loaded into a fresh op."""
        op.load_state_dict(state)

    @contextlib.contextmanager
    def scratch_scope(self):
        """A run beside the path's calls (the fresh Sequential whose plans a repeat call's are
        compared with): whatever process-wide state the backend keeps for the path (TE's
        quantization state), the scratch run keeps apart, as if it ran in a process of its
        own."""
        yield

    @contextlib.contextmanager
    def recipe_off_scope(self):
        """A call with the case's recipe disabled (spec.repeat_calls[k].recipe_off): every
        forward (and its backward) under it runs in high precision, as a call outside TE's
        autocast does, and must leave every quantizer's state as it was. A backend that
        lists "recipe_change" in capabilities.usage implements it."""
        raise NotImplementedError(f"the {self.name} backend has no recipe_off_scope")
        yield  # pragma: no cover

    def set_amax_history_len(self, ops, case, length):
        """DelayedScaling's amax_history_len is `length` from the next call on
        (spec.repeat_calls[k].amax_history_len): te, a recipe with that length, whose
        histories TE's fuser resizes at the next forward."""
        raise NotImplementedError(f"the {self.name} backend has no set_amax_history_len")

    def take_tensor_checks(self):
        """The checks of every quantized tensor the backend made since the last take, as
        {"checked": n, "violations": [{"op", "quantizer", "what", "note"}]} (issue 26 item
        2: FP8 codes, column-wise copy, dequantize, exactly), or None where it checks none."""
        return None

    def held_weights(self, ops, case):
        """[HeldWeight] of every Linear's quantized weight (spec.quantized_params), read by
        the caller after each call (held_quantized_tensor)."""
        raise NotImplementedError(f"the {self.name} backend has no held_weights")

    def delayed_states(self, ops, case):
        """{key: fp8_state.state_entry(...)} of every delayed-scaling quantizer of the ops
        (issue "FP8 state"); {} where the backend has none to show."""
        return {}

    def plans(self, seq, case, ops):
        """Per fuser {"forward": [...], "backward": [...]} in spec op indices."""
        return []

    def plan_without_forward(self, seq, x, extras):
        """Has a fresh Sequential make the plans its first forward with (x, extras) would
        make, in the current grad mode and recipe scope, without running it; False where
        the backend cannot (the driver then runs the forward). The plans must be those the
        forward makes: a backend does this only where its framework makes them before any
        op runs and from nothing the forward computes."""
        return False

    def any_fused(self, plans):
        return any(g["fused"] for p in plans for pass_ in ("forward", "backward") for g in p[pass_])

    def classify(self, exc):
        """("error", kind) or ("unsupported", reason)."""
        raise NotImplementedError

    def left_locked(self, seq, ops, locked_before, phase):
        """Spec op indices a failed construction left locked."""
        return []

    def code_under_test(self):
        """Source files or folders whose frames can be an error's origin (absolute paths),
        e.g. TE's package and the adapter's te extensions. Empty (the default): every frame
        outside torch, Python's standard library, the adapter's plumbing and the builder's
        own methods (see error_origin)."""
        return ()

    def writer_scope(self, seq, case, ops, watch):
        """Context manager under which one call of `seq` runs with each plan group's run
        announced to `watch`, a GroupWatch (watch.instrument(obj, method, group) wraps a
        method that runs one group; watch.enter(group) marks a group's start where no
        method can be wrapped; watch.trace, where not None, takes what a group returned
        that no wrapped method hands back), so that a changed caller tensor is attributed
        to the group that wrote it (`modified_by`) and the path's trace records each
        group's tensor (`trace`). A group is {"pass", "fuser", "begin", "end", "name",
        "fused", "class", "method"} (GroupWatch). The default wraps nothing: modified_by
        is left out and the trace is empty. te: te_writer_scope, torch runtime:
        torch_writer_scope (below)."""
        return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------
# Values on the device


class _DeviceValues:
    """The case's caller values on the path's device, in the case dtype, converted once per
    case; each path (and each call) gets its own copy (`fresh`), so one path writing into
    its tensors cannot reach another."""

    def __init__(self, case):
        self.case = case
        self.device = None
        self.cache = {}
        self.raw = {}

    def _values(self):
        """(key, tensor) for every caller value and parameter of the case."""
        case = self.case
        out = [("input", case.input)]
        out += [(("extra", k), e) for k, e in enumerate(case.extra_inputs)]
        out += [(("cotangent", k), c) for k, c in enumerate(case.cotangents)]
        for k, (x, extras) in enumerate(case.call_inputs):
            out.append((("call", k), x))
            out += [(("call", k, j), e) for j, e in enumerate(extras)]
        for op in case.ops:
            out += [(("param", op.index, j), p) for j, p in enumerate(op.params)]
        return [(key, t) for key, t in out if t is not None]

    def _upload(self):
        """Every value of the case on the (non-CPU) device in one host-to-device copy per
        wire dtype (float64, int64): flattened, joined, copied, split back into views."""
        self.raw = {}
        groups = {}
        for key, t in self._values():
            groups.setdefault(t.dtype, []).append((key, t))
        for members in groups.values():
            flat = torch.cat([t.reshape(-1) for _, t in members]).to(self.device)
            offset = 0
            for key, t in members:
                self.raw[key] = flat[offset : offset + t.numel()].view(t.shape)
                offset += t.numel()

    def _on_device(self, key, t, dtype):
        if t is None:
            return None
        cached = self.cache.get((key, dtype))
        if cached is None:
            source = self.raw.get(key, t)
            if source.is_floating_point():
                cached = source.to(device=self.device, dtype=dtype)
            else:
                cached = source.to(device=self.device)
            self.cache[(key, dtype)] = cached
        return cached

    def fresh(self, key, t, requires_grad=False, dtype=None):
        """A copy of value `t` (named `key`) on the device: floating tensors in `dtype`
        (the case's by default) with `requires_grad`."""
        dtype = dtype or self.case.dtype
        base = self._on_device(key, t, dtype)
        if base is None:
            return None
        copy = base.clone()
        if copy.is_floating_point():
            copy.requires_grad_(bool(requires_grad))
        return copy

    def use(self, device):
        if device == self.device:
            return
        self.cache.clear()
        self.raw = {}
        self.device = device
        if torch.device(device).type != "cpu":
            self._upload()

    def op_case(self, op_case):
        """`op_case` with its parameter values on the device in the case dtype (converted
        once per case), for the builder to copy into the op it makes: a host-to-device
        copy per parameter per path was a synchronising transfer each on CUDA. The values
        are shared by the case's paths and must not be written to."""
        if not op_case.params:
            return op_case
        key = ("op", op_case.index)
        cached = self.cache.get(key)
        if cached is None:
            params = [
                self._on_device(("param", op_case.index, j), p, self.case.dtype)
                for j, p in enumerate(op_case.params)
            ]
            cached = self.cache[key] = dataclasses.replace(op_case, params=params)
        return cached


class _CallerTensors:
    """Copies of the caller-owned tensors a call receives, to see whether the call changed
    them (by value: a CUDA kernel may write through a data pointer without bumping
    `_version`)."""

    def __init__(self):
        self.entries = []

    def add(self, name, t):
        if t is not None:
            self.entries.append((name, t, t.detach().clone()))

    def modified(self):
        """Names of the tensors whose values changed (by value, a NaN where there was one
        unchanged), compared on their device with one transfer of the verdicts (a
        torch.equal per tensor synchronised with the GPU once each)."""
        changed, pending = [], []
        for name, given, pristine in self.entries:
            try:
                if given.shape != pristine.shape:
                    changed.append(name)
                    continue
                same = given.detach() == pristine
                if pristine.is_floating_point():  # a NaN nobody wrote is not a change
                    same |= given.detach().isnan() & pristine.isnan()
                pending.append((name, same.all()))
            except RuntimeError:
                changed.append(name)  # the tensor's data was replaced or freed
        if pending:
            same = torch.stack([verdict.to(pending[0][1].device) for _, verdict in pending])
            for (name, _), equal in zip(pending, same.tolist()):
                if not equal:
                    changed.append(name)
        order = {name: k for k, (name, _, _) in enumerate(self.entries)}
        return sorted(changed, key=order.__getitem__)


# ----------------------------------------------------------------------------------------
# Writers of caller tensors (modified_by)


class _Snapshot:
    """The flat byte snapshot of the caller tensors a batched check compares (WriterTracker):
    their bytes at the previous check, one segment per tensor in `names` order, with each
    tensor's shape and dtype, the segment id of every byte (on the device) and, per tensor,
    a cached flat byte view of it (data pointer, view) while it stays contiguous."""

    __slots__ = ("names", "shapes", "dtypes", "spans", "data", "segments", "views")

    def __init__(self, names, tensors, data, segments):
        self.names = names
        self.shapes = [t.shape for t in tensors]
        self.dtypes = [t.dtype for t in tensors]
        self.spans, start = {}, 0
        for name, t in zip(names, tensors):
            size = t.numel() * t.element_size()
            self.spans[name] = (len(self.spans), start, start + size)
            start += size
        self.data = data
        self.segments = segments
        self.views = [None] * len(names)

    def value(self, name):
        """The tensor `name` as this snapshot holds it (a copy: a segment's bytes need not
        be aligned for its dtype)."""
        k, start, end = self.spans[name]
        value = self.data[start:end].clone().view(self.dtypes[k])
        return value.reshape(self.shapes[k])


def _bytes(t):
    """`t`'s bytes as a flat uint8 tensor (a view of a contiguous tensor, else a copy)."""
    return t.detach().contiguous().view(-1).view(torch.uint8)


def _freed(t):
    """Whether `t` lost its data (its storage resized to 0): reading it would crash."""
    return t.data_ptr() == 0 and t.numel() > 0


_FREED = "freed"  # the previous value of a tensor whose storage was freed


def _copy(t):
    return _FREED if _freed(t) else t.detach().clone()


class WriterTracker:
    """Attributes each change of a caller tensor to the plan group whose run it happened in.

    A group is {"name", "begin", "end", "pass"} (spec op indices, end exclusive, pass
    "forward" or "backward"). Between two checks the tracker compares every caller tensor
    with its value at the previous check; a change seen at the end of a group's run is that
    group's, a change seen outside any group is nobody's (not reported).

    It watches a path's own first call (run_path), so it never raises into the code it
    watches: a check that fails marks the tracker `failed` (no writer reported). Tensors on
    the CPU are compared at once; on a GPU (or with `deferred`) each check only queues
    "changed since the previous check" flags, and leave() brings all flags to the host in
    one transfer and attributes them in order: a watched call then waits for the GPU once,
    not at every group (with many workers on one GPU each wait can be a time slice,
    docs/GPU.md).

    A deferred check is batched: one flat byte copy of all the tensors it compares
    (torch.cat), compared with the previous check's (the first check's: the pristine
    copies) and reduced to a flag per tensor: 4 kernels per check (cat, !=, zeros,
    scatter_reduce) whatever the number of tensors, where a check per tensor took 3 each
    (~3.2 ms per case on an H200 with 5-10 tensors). The comparisons are bit-exact: a NaN
    that nobody writes stays unchanged (the former comparison by value called it changed at
    every check, so the first group to run was named its writer); a -0.0 written over 0.0
    is a change (the immediate checks compare by value, torch.equal, as
    _CallerTensors.modified does, and confirm a mismatch byte by byte: they see no such
    change, nor does `modified`). A check falls back to the comparisons per tensor where a
    batch cannot be made: tensors on several devices, a tensor whose shape or dtype is no
    longer its snapshot's, one whose data was replaced or freed, or more than BATCH_BYTES of
    tensors. The immediate checks stay per tensor: on the CPU a batch costs more."""

    # The most bytes of caller tensors a batched check copies: its segment ids take 8
    # bytes per byte; past this the launches per tensor no longer matter.
    BATCH_BYTES = 1 << 22

    def __init__(self, caller, deferred=None):
        self.caller = caller
        self.current = None
        self.writers = {}
        self.watch = None  # the GroupWatch of instrument(), with this tracker alone
        self.failed = False
        self.deferred = deferred
        # Each tensor's value at the previous check of its own (per tensor; a tensor of the
        # batch snapshot has its value there instead), and per check (open group or None,
        # tensor names, changed: a list of bools or a device uint8 tensor of flags).
        self.previous = {}
        self.snapshot = None
        self.pending = []

    def _check(self):
        if self.failed:
            return
        try:
            self._compare()
        except Exception:  # noqa: BLE001 - the attribution is best effort, the run is not ours
            self.failed = True

    def _compare(self):
        entries = self.caller.entries
        if self.writers:
            entries = [entry for entry in entries if entry[0] not in self.writers]
        if not entries:
            return
        device = entries[0][1].device
        deferred = device.type != "cpu" if self.deferred is None else self.deferred
        if deferred and self._batched(entries, device):
            return
        self._per_tensor(entries)

    def _batched(self, entries, device):
        """One check of `entries` as one snapshot on `device`; False where it cannot be made
        (tensors on other devices, ...: nothing queued then)."""
        names = tuple([name for name, _, _ in entries])
        snapshot = self.snapshot
        if snapshot is None or snapshot.names != names:
            snapshot = self._layout(names, entries, device)
            if snapshot is None:
                return False
        shapes, dtypes, views = snapshot.shapes, snapshot.dtypes, snapshot.views
        current = []
        try:
            for k, (_, given, _) in enumerate(entries):
                if given.shape != shapes[k] or given.dtype != dtypes[k]:
                    return False
                cached = views[k]
                if cached is not None and cached[0] == given.data_ptr() and given.is_contiguous():
                    current.append(cached[1])
                    continue
                if given.device != device or _freed(given):
                    return False  # (a cached view's data pointer is of its device)
                view = _bytes(given)
                views[k] = (given.data_ptr(), view) if given.is_contiguous() else None
                current.append(view)
        except RuntimeError:
            return False  # a tensor's data was replaced or freed
        data = torch.cat(current)
        changed = (data != snapshot.data).view(torch.uint8)  # CUDA's scatter has no bool
        flags = torch.zeros(len(names), dtype=torch.uint8, device=device)
        flags.scatter_reduce_(0, snapshot.segments, changed, "amax")
        self.pending.append((self.current, names, flags))
        snapshot.data = data
        if snapshot is not self.snapshot:
            self._replace(snapshot)
        return True

    def _layout(self, names, entries, device):
        """A snapshot of `names` holding their values at the previous check (from the
        current snapshot, the values kept per tensor or the pristine copies); None where one
        is not what its tensor now is (shape, dtype, device) or the batch is too large."""
        old = self.snapshot
        if old is not None and old.data.device != device:
            return None
        pieces, total = [], 0
        for name, given, pristine in entries:
            if old is not None and name in old.spans:
                k, start, end = old.spans[name]
                if given.shape != old.shapes[k] or given.dtype != old.dtypes[k]:
                    return None
                pieces.append(old.data[start:end])
            else:
                seen = self.previous.get(name, pristine)
                if seen is _FREED or seen.device != device:
                    return None
                if (seen.shape, seen.dtype) != (given.shape, given.dtype):
                    return None
                pieces.append(_bytes(seen))
            total += pieces[-1].numel()
        if total > self.BATCH_BYTES:
            return None
        segments = torch.cat(
            [
                torch.full((piece.numel(),), k, dtype=torch.int64, device=device)
                for k, piece in enumerate(pieces)
            ]
        )
        return _Snapshot(names, [given for _, given, _ in entries], torch.cat(pieces), segments)

    def _replace(self, snapshot):
        """Makes `snapshot` (None: no snapshot) the one that holds its tensors' values: the
        tensors of the current one that it lacks keep theirs per tensor."""
        old = self.snapshot
        if old is not None:
            for name in old.names:
                if snapshot is None or name not in snapshot.spans:
                    self.previous[name] = old.value(name)
        if snapshot is not None:
            for name in snapshot.names:
                self.previous.pop(name, None)
        self.snapshot = snapshot

    def _per_tensor(self, entries):
        """The check of each tensor of `entries` on its own: at once on the CPU (by value,
        torch.equal; a mismatch is confirmed byte by byte, so that a NaN stays unchanged),
        else a flag queued (a device uint8, or True). A tensor of another shape or dtype than
        its previous value is changed, so is one whose storage was freed (once)."""
        if self.snapshot is not None:
            self._replace(None)
        changed = []
        for name, given, pristine in entries:
            deferred = given.device.type != "cpu" if self.deferred is None else self.deferred
            try:
                seen = self.previous.get(name, pristine)
                if not given.data_ptr() and given.numel():  # _freed(given), inlined
                    differs = seen is not _FREED
                elif seen is _FREED or given.shape != seen.shape or given.dtype != seen.dtype:
                    differs = True
                elif deferred:
                    differs = (_bytes(given) != _bytes(seen)).any().view(1).view(torch.uint8)
                else:
                    differs = not torch.equal(given.detach(), seen) and not torch.equal(
                        _bytes(given), _bytes(seen)
                    )
                if deferred:
                    flags = differs if isinstance(differs, torch.Tensor) else [differs]
                    self.pending.append((self.current, (name,), flags))
                    self.previous[name] = _copy(given)
                elif differs:
                    changed.append((name, given))
            except RuntimeError:
                changed.append((name, given))  # the tensor's data was replaced
        for name, given in changed:
            if self.current is not None:
                self.writers[name] = dict(self.current)
            else:
                self.previous[name] = _copy(given)

    def _resolve(self):
        """Attributes the deferred flags in check order: a tensor's first change seen while
        a group ran is that group's (as _compare attributes it at once)."""
        on_device = [flags for _, _, flags in self.pending if isinstance(flags, torch.Tensor)]
        values = iter(
            torch.cat([f.to(on_device[0].device) for f in on_device]).tolist() if on_device else []
        )
        for group, names, flags in self.pending:
            for name in names:
                changed = next(values) if isinstance(flags, torch.Tensor) else flags[0]
                if changed and group is not None and name not in self.writers:
                    self.writers[name] = dict(group)
        self.pending = []

    def enter(self, group):
        """Closes the running group (if any) and opens `group` (None: no group runs)."""
        self._check()
        self.current = group

    def leave(self):
        """Closes the running group and attributes what the deferred checks saw."""
        self.enter(None)
        if self.pending and not self.failed:
            try:
                self._resolve()
            except Exception:  # noqa: BLE001 - best effort, as _check
                self.failed = True

    def instrument(self, obj, method, group):
        """Wraps obj.<method> (an instance attribute from then on) so that each of its runs
        is a run of `group`; idempotent per (obj, method). A GroupWatch of this tracker
        alone (what a builder's writer_scope is handed is the path's GroupWatch)."""
        if self.watch is None:
            self.watch = GroupWatch(tracker=self)
        self.watch.instrument(obj, method, group)

    def restore(self):
        """Undoes instrument()."""
        if self.watch is not None:
            self.watch.restore()


# ----------------------------------------------------------------------------------------
# Plan groups watched: their writers (modified_by) and the trace (trace)

# The keys of a group that name it for modified_by (docs/BACKENDS.md Protocol 2).
_WRITER_KEYS = ("name", "begin", "end", "pass")


class GroupWatch:
    """One call's plan-group runs, as a builder's writer_scope announces them, handed on to
    whoever watches them: the writer tracker (WriterTracker: where each group starts and
    ends) and the trace (Trace: what each group returned). Either may be None; the one
    instrumentation serves both.

    A group is a trace entry without its tensor: {"pass", "fuser", "begin", "end", "name",
    "fused", "class", "method"} (docs/BACKENDS.md "run"); the tracker is given its
    {"name", "begin", "end", "pass"}. A group announced with fewer keys (a test's) is
    handed on with what it has."""

    def __init__(self, tracker=None, trace=None):
        self.tracker = tracker
        self.trace = trace
        self.patched = []

    def enter(self, group):
        """A group's run starts where no method could be wrapped (None: no group runs);
        the tracker closes the group that ran before it."""
        if self.tracker is not None:
            self.tracker.enter(None if group is None else _writer_group(group))

    def instrument(self, obj, method, group, extras=None):
        """Wraps obj.<method> (an instance attribute from then on) so that each of its runs
        is a run of `group` for the tracker and, where it returns, the trace records the
        first item of what it returned (a group's main output or input gradient: TE's
        fuser_forward returns (output, extra outputs), fuser_backward (grad_input, param
        grads, extra input grads), the torch runtime's forward (output, extra outputs))
        and, with `extras` (GroupExtras), the extra tensors it returned (Trace.take_extras:
        what it hands back is the method's result, an op's generator handed on as one).
        Idempotent per (obj, method)."""
        if any(o is obj and m == method for o, m, _ in self.patched):
            return
        had = method in getattr(obj, "__dict__", {})
        original = getattr(obj, method)
        tracker, trace = self.tracker, self.trace
        writer = _writer_group(group)

        def wrapped(*args, **kwargs):
            if tracker is None:
                result = original(*args, **kwargs)
            else:
                outer = tracker.current
                tracker.enter(writer)
                try:
                    result = original(*args, **kwargs)
                finally:
                    tracker.enter(outer)
            if trace is not None:
                entry = trace.record(group, _main_tensor(result))
                if extras is not None:
                    result = trace.take_extras(entry, extras, result)
            return result

        setattr(obj, method, wrapped)
        self.patched.append((obj, method, original if had else None))

    def restore(self):
        """Puts back every method instrument() wrapped."""
        for obj, method, original in reversed(self.patched):
            if original is None:
                with contextlib.suppress(AttributeError):
                    delattr(obj, method)
            else:
                setattr(obj, method, original)
        self.patched = []


def plan_group(pass_, fuser, begin, end, name, fused, cls, method):
    """A group as GroupWatch takes it (a trace entry without its tensor), keys in the
    reply's order."""
    return {
        "pass": pass_,
        "fuser": fuser,
        "begin": begin,
        "end": end,
        "name": name,
        "fused": fused,
        "class": cls,
        "method": method,
    }


def _writer_group(group):
    return {key: group[key] for key in _WRITER_KEYS if key in group}


def _main_tensor(result):
    """The first item of a group's result (a tuple or list), or the result itself."""
    if isinstance(result, (tuple, list)):
        return result[0] if result else None
    return result


class GroupExtras:
    """Where a group's extra tensors are in what its method returns, and which the trace
    keeps (Trace.take_extras): `position`, the index of the result's item that holds them
    (TE's fuser_forward: 1, the extra outputs; fuser_backward: 2, the extra-input
    gradients; the torch runtime's forward: 1); `ops`, per basic op of the group in the
    group's order, (spec op index, the slots kept); `per_op`: the item is a sequence with
    one entry per basic op (TE's), else the one op's own extra tensors (the torch
    runtime's)."""

    def __init__(self, position, ops, per_op=True):
        self.position = position
        self.ops = [(op, list(slots)) for op, slots in ops]
        self.per_op = per_op


def extra_slots(op_case, pass_):
    """The slots of `op_case` a trace entry of `pass_` carries: forward every extra output;
    backward the extra inputs that can have a gradient (float kind: not split sizes or
    routing maps)."""
    if pass_ == "forward":
        return list(range(len(op_case.extra_output_kinds)))
    return [s for s, kind in enumerate(op_case.extra_input_kinds) if kind == "float"]


class Trace:
    """A path's first call group by group (docs/BACKENDS.md "run", `trace`): an entry per
    plan group run, in the order they ran, with the group's main tensor (forward: its
    output; backward: its input gradient) and its extra tensors (`extras`: forward, each
    basic op's extra outputs; backward, the gradient returned for each extra input that can
    have one), detached and copied when the group returned, so that later in-place writes
    do not reach them; a quantized tensor object (_quantized: TE's QuantizedTensor and its
    storage classes) is dequantized to the case dtype and marked `quantized`. It never
    raises into the call it watches: a tensor it cannot copy (or dequantize) is recorded
    as none."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.entries = []
        self.lost = set()  # ids of extras a contribution of which could not be copied

    def record(self, group, tensor=None, extras=None):
        """Appends `group`'s entry with a copy of `tensor` (None: none yet, see update) and
        the list `extras` (Trace.extra items, kept as it is: the torch runtime's backward
        fills them later); returns the entry."""
        entry = dict(group)
        self.update(entry, tensor)
        entry["extras"] = [] if extras is None else extras
        self.entries.append(entry)
        return entry

    def update(self, entry, tensor):
        """Sets `entry`'s tensor to a copy of `tensor` (the torch runtime's backward: the
        entry is made where the group's backward starts, its gradient seen later)."""
        entry["tensor"], entry["quantized"] = self._copy(tensor)

    @staticmethod
    def extra(op, slot):
        """An extra tensor's item of an entry, without its tensor yet."""
        return {"op": op, "slot": slot, "tensor": None, "quantized": False}

    def set_extra(self, item, tensor):
        item["tensor"], item["quantized"] = self._copy(tensor)

    def add_extra(self, item, tensor):
        """Adds one contribution to `item`'s tensor (the torch runtime's backward: an extra
        input's gradient is the sum of what each of the op's nodes returned for it); one
        that cannot be copied or added leaves the item without a tensor."""
        if tensor is None or id(item) in self.lost:
            return
        copied, quantized = self._copy(tensor)
        try:
            if copied is None:
                raise ValueError("not copied")
            if item["tensor"] is not None:
                with torch.no_grad():
                    copied = item["tensor"] + copied
            item["tensor"] = copied
            item["quantized"] = item["quantized"] or quantized
        except Exception:  # noqa: BLE001 - the trace is evidence, never the call's error
            self.lost.add(id(item))
            item["tensor"] = None

    def take_extras(self, entry, layout, result):
        """Sets `entry`'s extras from a group's `result` as `layout` (GroupExtras) places
        them, one item per kept slot, op then slot order (none where the op returned no
        tensor for it), and returns the result to hand back: `result` itself, or where an
        op returned its extra tensors as a generator, a result of the same kinds whose
        generator is one that yields the same items in turn and copies each as it is drawn
        (what draws it sees what it would have: a generator, with no len(), consumed
        once). Never raises: on any surprise the items stay without tensors and `result`
        is handed back as it is."""
        items = []
        per_op = []
        for op, slots in layout.ops:
            mine = {s: self.extra(op, s) for s in slots}
            items.extend(mine.values())
            per_op.append(mine)
        entry["extras"] = items
        try:
            if not isinstance(result, (tuple, list)) or len(result) <= layout.position:
                return result
            container = result[layout.position]
            if layout.per_op:
                if not isinstance(container, (tuple, list)):
                    return result
                returned = list(container)
            else:
                returned = [container]
            changed = False
            for k, mine in enumerate(per_op):
                tensors = returned[k] if k < len(returned) else None
                if isinstance(tensors, (tuple, list)):
                    for s, item in mine.items():
                        if s < len(tensors):
                            self.set_extra(item, tensors[s])
                elif isinstance(tensors, types.GeneratorType) and mine:
                    returned[k] = _drawn(tensors, self._setter(mine))
                    changed = True
            if not changed:
                return result
            if layout.per_op:
                container = list(returned) if isinstance(container, list) else tuple(returned)
            else:
                container = returned[0]
            rebuilt = list(result)
            rebuilt[layout.position] = container
            return rebuilt if isinstance(result, list) else tuple(rebuilt)
        except Exception:  # noqa: BLE001 - the trace is evidence, never the call's error
            for item in items:
                item["tensor"], item["quantized"] = None, False
            return result

    def _setter(self, mine):
        def seen(slot, tensor):
            if slot in mine:
                self.set_extra(mine[slot], tensor)

        return seen

    def _copy(self, t):
        quantized = _quantized(t)
        if not quantized and not isinstance(t, torch.Tensor):
            return None, False
        try:
            with torch.no_grad():
                if quantized:
                    return _dequantized(t, self.dtype), True
                if _freed(t):
                    return None, False
                return t.detach().clone(), False
        except Exception:  # noqa: BLE001 - the trace is evidence, never the call's error
            return None, quantized

    def emit(self, tensors):
        """The entries as the reply carries them: tensors added to `tensors` (indices)."""
        out = []
        for entry in self.entries:
            entry = dict(entry)
            entry["tensor"] = _emitted(entry["tensor"], tensors)
            entry["extras"] = [
                dict(item, tensor=_emitted(item["tensor"], tensors))
                for item in entry.get("extras") or []
            ]
            out.append(entry)
        return out


def _emitted(t, tensors):
    """`t`'s index in `tensors` once added; None for none or one that cannot travel."""
    if t is None:
        return None
    mark = len(tensors)
    try:
        return tensors.add(t)
    except Exception:  # noqa: BLE001 - a tensor that cannot travel is left out
        tensors.truncate(mark)
        return None


def _drawn(generator, seen):
    """A generator that yields what `generator` yields, as it is drawn, first handing each
    item to seen(k, item) (whose errors are swallowed)."""
    for k, item in enumerate(generator):
        with contextlib.suppress(Exception):
            seen(k, item)
        yield item


def _quantized(t):
    """Whether `t` is a quantized tensor object: its class has a dequantize() of its own
    (TE's QuantizedTensor and storage classes; torch.Tensor's is for torch's quantized
    dtypes)."""
    method = getattr(type(t), "dequantize", None)
    return callable(method) and method is not torch.Tensor.dequantize


def _dequantized(t, dtype):
    """A quantized tensor's values as a plain tensor of `dtype` (TE's dequantize takes the
    dtype; a class whose dequantize does not is converted afterwards)."""
    try:
        plain = t.dequantize(dtype=dtype)
    except TypeError:
        plain = t.dequantize()
    return plain.detach().to(dtype).clone()


@contextlib.contextmanager
def te_writer_scope(operation_fuser, case, ops, watch, basic_operation=None):
    """The group scope of te.ops (a TEBuilder's writer_scope returns this with TE's
    OperationFuser and BasicOperation classes; `watch`: a GroupWatch): TE builds its fusers
    and their plans at the first forward (fuser.py: OperationFuser.maybe_fuse_ops sets
    _forward_ops/_backward_ops, lists of (op, basic op indices)) and runs each group as
    op.fuser_forward / op.fuser_backward (_OperationFuserAutogradFunction.forward/backward),
    so maybe_fuse_ops is wrapped to instrument every group's method once the plans exist.
    A group's "method" is the one that computes it: a basic op that keeps
    BasicOperation's fuser_forward/fuser_backward computes in its op_forward/op_backward
    (op.py: BasicOperation.fuser_forward calls self.op_forward). Its extra tensors are read
    from what fuser_forward/fuser_backward return, per basic op of the group (GroupExtras:
    the group's basic op indices mapped to spec op indices as its begin/end are)."""
    index = {id(op): i for i, op in enumerate(ops) if op is not None}
    original = operation_fuser.__dict__["maybe_fuse_ops"]

    def maybe_fuse_ops(fuser, *args, **kwargs):
        result = original(fuser, *args, **kwargs)
        for attr, pass_, method, basic_method in (
            ("_forward_ops", "forward", "fuser_forward", "op_forward"),
            ("_backward_ops", "backward", "fuser_backward", "op_backward"),
        ):
            for op, idxs in getattr(fuser, attr, None) or []:
                members = [index.get(id(fuser._basic_ops[i])) for i in idxs]
                if not members or None in members:
                    continue
                fused = bool(op.is_fused_op)
                name = (
                    getattr(op, "fusion_name", type(op).__name__)
                    if fused
                    else case.ops[members[0]].name
                )
                inherited = basic_operation is not None and getattr(
                    type(op), method, None
                ) is getattr(basic_operation, method, None)
                group = plan_group(
                    pass_,
                    case.ops[members[0]].fuser,
                    min(members),
                    max(members) + 1,
                    name,
                    fused,
                    type(op).__name__,
                    basic_method if inherited and not fused else method,
                )
                # fuser.py: fuser_forward returns (output, per basic op of the group its
                # extra outputs), fuser_backward (grad_input, per basic op its param grads,
                # per basic op its extra-input grads), in the order of idxs.
                extras = GroupExtras(
                    1 if pass_ == "forward" else 2,
                    [(m, extra_slots(case.ops[m], pass_)) for m in members],
                )
                watch.instrument(op, method, group, extras)
        return result

    operation_fuser.maybe_fuse_ops = maybe_fuse_ops
    try:
        yield
    finally:
        operation_fuser.maybe_fuse_ops = original
        watch.restore()


@contextlib.contextmanager
def torch_writer_scope(seq, case, watch):
    """The group scope of the torch runtime (a TorchBuilder's writer_scope returns this;
    `watch`: a GroupWatch). Forward: every op is its own group, runtime.Fuser.forward
    calls op.forward(x, extras) per op, which is wrapped (its extra outputs are the second
    item of what it returns). Backward is PyTorch's autograd over eager ops, with no per-op
    entry point: a hook on each op's main output marks the start of that op's backward (its
    output's gradient is complete), which closes the group that ran before (the writer
    tracker's groups: one per op).

    The trace's backward groups are the fuser's backward plan (Fuser.backward_plan: a fused
    BackwardLinearScale spans its Linear and ConstantScale): a group's entry is made where
    its last op's backward starts, and its tensor is its first op's input gradient, seen by
    a hook on that input. The op is that tensor's only user (the runtime hands an op's
    output to the next op alone, catalog ops return new tensors), so the input's gradient
    is what the group's backward returned for it. An input that does not require grad
    leaves the entry's tensor none (the group returned none). An extra input can have
    other users (a channel's other consumers, the caller): its gradient is what the op's
    own autograd nodes return for it (_ExtraGrads), summed."""
    trace = watch.trace
    for f, (fuser, members) in enumerate(zip(seq.fusers, case.fusers)):
        # Per local op index: the trace's backward group that starts (its last op) or ends
        # (its first op) there, and the one it belongs to, as {"group", "entry", "extras"}
        # (the entry once made; the extras: its ops' extra-input items, op then slot order).
        starts, ends, owners = {}, {}, {}
        if trace is not None:
            for planned in fuser.backward_plan(members):
                begin, end, name = planned["begin"], planned["end"], planned["name"]
                cls = type(fuser.ops[members.index(begin)]).__name__
                traced = plan_group(
                    "backward", f, begin, end, name, planned["fused"], cls, "backward"
                )
                slot = {"group": traced, "entry": None, "extras": []}
                starts[members.index(end - 1)] = slot
                ends[members.index(begin)] = slot
                for index in range(begin, end):
                    owners[members.index(index)] = slot
        for i, (op, index) in enumerate(zip(fuser.ops, members)):
            cls = type(op).__name__
            forward_group = plan_group(
                "forward", f, index, index + 1, op.name, False, cls, "forward"
            )
            backward_group = plan_group(
                "backward", f, index, index + 1, op.name, False, cls, "backward"
            )
            owner, items = owners.get(i), {}
            if owner is not None:
                for s in extra_slots(case.ops[index], "backward"):
                    items[s] = Trace.extra(index, s)
                    owner["extras"].append(items[s])
            op.forward = _hooked_forward(
                op.forward, watch, backward_group, starts.get(i), ends.get(i), owner, items
            )
            extras = GroupExtras(1, [(index, extra_slots(case.ops[index], "forward"))], False)
            watch.instrument(op, "forward", forward_group, extras)
    try:
        yield
    finally:
        watch.restore()
        for fuser in seq.fusers:
            for op in fuser.ops:
                op.__dict__.pop("forward", None)


def _hooked_forward(original, watch, group, start, end, owner=None, items=None):
    """An op's forward with the hooks of its backward: on its output, the start of its
    backward `group` (and of the trace group `start`, if any); on its input, the gradient
    of the trace group `end` (if any); on the autograd nodes it made, the gradients of its
    extra inputs `items` ({slot: Trace.extra item} of the trace group `owner`)."""

    def forward(x, extras):
        grads = _ExtraGrads.before(watch.trace, owner, items, x, extras)
        y, outs = original(x, extras)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            try:
                y.register_hook(_backward_starts(watch, group, start))
            except RuntimeError:
                _lost(watch)
        if end is not None and isinstance(x, torch.Tensor) and x.requires_grad:
            try:
                x.register_hook(_backward_returned(watch.trace, end))
            except RuntimeError:
                pass  # the entry keeps no tensor
        if grads is not None:
            outs = grads.after(y, outs)
        return y, outs

    return forward


def _backward_starts(watch, group, start):
    """The hook on an op's output: the op's backward starts (`start`: the trace group
    whose backward starts with it, or None)."""

    def hook(grad):
        watch.enter(group)
        if start is not None:
            _entry_of(watch.trace, start)

    return hook


def _backward_returned(trace, end):
    """The hook on a trace group's input: its gradient is what the group returned."""

    def hook(grad):
        trace.update(_entry_of(trace, end), grad)  # its start unseen: the entry made now

    return hook


def _entry_of(trace, slot):
    """The entry of the trace group `slot` ({"group", "entry", "extras"}), made now if its
    backward had not yet been seen."""
    if slot["entry"] is None:
        slot["entry"] = trace.record(slot["group"], extras=slot["extras"])
    return slot["entry"]


class _ExtraGrads:
    """The gradients one torch-runtime op's backward returns for its extra inputs. An extra
    input's tensor may have other users (a channel's value goes to every consumer and to
    the caller), so a hook on it would see their sum: instead, the autograd nodes the op's
    forward made (found from its outputs back to its inputs' nodes) each get a hook that
    adds what the node returns along its edges to that input's node. The graph is only
    read: no node is added, so the gradients' sums run as they would untraced. An extra
    input whose node is also the main input's or another slot's (the op could not be told
    apart from them) is left without a tensor."""

    # The most nodes one op's graph is searched for (an op reads only its inputs, whose
    # nodes end the search; past this something else is going on).
    MAX_NODES = 100_000

    def __init__(self, trace, owner, targets, stops):
        self.trace, self.owner = trace, owner
        self.targets = targets  # [(node or None, output_nr, leaf tensor or None, item)]
        self.stops = stops  # the input nodes by id: the search ends there
        self.seen = set()
        self.nodes = []  # the nodes searched, kept alive so that their ids stay theirs

    @classmethod
    def before(cls, trace, owner, items, x, extras):
        """The watch of one forward call, its targets taken before the op runs (an op
        writing into an input in place gives the tensor a new node); None where there is
        nothing to watch."""
        if trace is None or owner is None or not items:
            return None
        try:
            keys, targets = [], []
            for slot, item in items.items():
                e = extras[slot] if slot < len(extras) else None
                if not isinstance(e, torch.Tensor) or not e.requires_grad:
                    continue
                keys.append(_node_key(e))
                targets.append((e.grad_fn, e.output_nr, e if e.grad_fn is None else None, item))
            main = _node_key(x) if isinstance(x, torch.Tensor) and x.requires_grad else None
            kept = [
                target for key, target in zip(keys, targets) if key != main and keys.count(key) == 1
            ]
            if not kept:
                return None
            # The nodes themselves are kept: a node's Python object is the same one only
            # while it is alive, and so is its id.
            stops = {id(node): node for node, _, _, _ in kept if node is not None}
            if main is not None and x.grad_fn is not None:
                stops[id(x.grad_fn)] = x.grad_fn
            return cls(trace, owner, kept, stops)
        except Exception:  # noqa: BLE001 - the trace is evidence, never the call's error
            return None

    def after(self, y, outs):
        """Searches the graph from the op's outputs `y` and `outs` (a generator: each item
        as it is drawn, handed on as a generator); returns what to hand on as `outs`."""
        try:
            self._search(y)
            if isinstance(outs, types.GeneratorType):
                return _drawn(outs, lambda _, t: self._search(t))
            for t in outs:
                self._search(t)
        except Exception:  # noqa: BLE001 - the trace is evidence, never the call's error
            pass
        return outs

    def _match(self, node, nr):
        for target in self.targets:
            wanted, wanted_nr, leaf, item = target
            if wanted is not None:
                if node is wanted and nr == wanted_nr:
                    return item
            elif getattr(node, "variable", None) is leaf:
                return item
        return None

    def _search(self, t):
        if not isinstance(t, torch.Tensor) or t.grad_fn is None:
            return
        stack = [t.grad_fn]
        while stack:
            node = stack.pop()
            if id(node) in self.seen or id(node) in self.stops:
                continue
            if len(self.seen) >= self.MAX_NODES:
                raise RuntimeError("the op's graph is too large to search")
            self.seen.add(id(node))
            self.nodes.append(node)
            hits = []
            for k, (following, nr) in enumerate(node.next_functions):
                if following is None:
                    continue
                item = self._match(following, nr)
                if item is not None:
                    hits.append((k, item))
                elif not hasattr(following, "variable"):  # AccumulateGrad: a leaf's end
                    stack.append(following)
            if hits:
                node.register_hook(self._hook(hits))

    def _hook(self, hits):
        trace, owner = self.trace, self.owner

        def hook(grad_inputs, grad_outputs):
            try:
                _entry_of(trace, owner)
                for k, item in hits:
                    trace.add_extra(item, grad_inputs[k] if k < len(grad_inputs) else None)
            except Exception:  # noqa: BLE001 - the trace is evidence, never the call's error
                for _, item in hits:
                    trace.lost.add(id(item))
                    item["tensor"] = None

        return hook


def _node_key(t):
    """Where autograd delivers `t`'s gradient: (its node, output number), or for a leaf the
    tensor itself."""
    if t.grad_fn is None:
        return ("leaf", id(t))
    return (id(t.grad_fn), t.output_nr)


def _lost(watch):
    """A backward start that cannot be seen: the tracker cannot tell backward's groups
    apart (no writer reported)."""
    if watch.tracker is not None:
        watch.tracker.failed = True


# ----------------------------------------------------------------------------------------
# Error origins


def _stdlib_dirs():
    paths = sysconfig.get_paths()
    return tuple(
        os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths
    )


_STDLIB = _stdlib_dirs()
# A frame's file resolved once per process: realpath costs a stat per path component, and
# error paths (a third of te cases) would pay it for every frame.
_realpath = functools.lru_cache(maxsize=4096)(os.path.realpath)
_TORCH = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
# The adapter's own plumbing: never the code under test.
_PLUMBING = tuple(
    os.path.realpath(os.path.join(os.path.dirname(__file__), name))
    for name in ("driver.py", "case.py", "protocol.py", "__main__.py", "client.py")
)


def _relative(path):
    """`path` relative to the sys.path entry holding it ("transformer_engine/pytorch/ops/
    op.py", "gradfuzz_adapter/torch_backend/runtime.py"), else its base name."""
    best = None
    for entry in sys.path:
        root = _realpath(entry or os.getcwd()) + os.sep
        if path.startswith(root) and (best is None or len(root) > len(best)):
            best = root
    return path[len(best) :] if best else os.path.basename(path)


def _qualname(frame):
    """The function's qualified name with its defining class ("BasicOperation.
    set_extra_input_channel" for a method a subclass inherits)."""
    code = frame.f_code
    name = getattr(code, "co_qualname", None)
    if name is None:
        # Python < 3.11: find the defining class through the method's self or cls.
        name = code.co_name
        owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
        if owner is not None:
            cls = owner if isinstance(owner, type) else type(owner)
            for klass in cls.__mro__:
                member = klass.__dict__.get(code.co_name)
                member = getattr(member, "__func__", member)
                if getattr(member, "__code__", None) is code:
                    name = f"{klass.__qualname__}.{code.co_name}"
                    break
    return name


def _shown(qualname):
    return qualname.rsplit("<locals>.", 1)[-1]


def _is_helper(qualname):
    """A private helper (`_check_extra_tensor_channels_unlocked`) or a function nested in a
    function (`_map_to_basic_ops.<locals>.raise_mismatch_error`): how a public method
    raises, so the public method is the cause."""
    last = qualname.rsplit(".", 1)[-1]
    private = last.startswith("_") and not last.startswith("__")
    nested = "<locals>." in qualname and "." not in _shown(qualname)
    return private or nested


def error_origin(exc, builder):
    """{"origin", "origin_file"} for the frame of `exc`'s traceback that names the cause,
    or {} when none qualifies.

    Frames qualify inside the code under test: builder.code_under_test(), or by default
    every frame but torch's, the standard library's, the adapter's plumbing (driver, case,
    protocol) and the builder's own methods. Of those, the innermost method of a class that
    is not a private helper is taken (`BasicOperation.set_extra_input_channel`, not the
    `_check_extra_tensor_channels_unlocked` it calls; `Dispatch.fuser_forward`, not the
    catalog's `check_logits`): errors cluster by the op class that raised. Without one, the
    innermost public function, else the innermost frame."""
    roots = tuple(_realpath(p) for p in builder.code_under_test())
    candidates = []
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        raw = frame.f_code.co_filename
        path = _realpath(raw)
        if roots:
            inside = any(path == r or path.startswith(r + os.sep) for r in roots)
        else:
            inside = (
                not raw.startswith("<")  # <frozen ...>, <string>: no file
                and not path.startswith(_TORCH)
                and not path.startswith(_STDLIB)
                and path not in _PLUMBING
                and frame.f_locals.get("self") is not builder
            )
        if inside:
            candidates.append((_qualname(frame), path, tb.tb_lineno))
        tb = tb.tb_next
    if not candidates:
        return {}
    public = [c for c in candidates if not _is_helper(c[0])]
    methods = [c for c in public if "." in _shown(c[0])]
    qualname, path, line = (methods or public or candidates)[-1]
    # Nested definitions are shown from their innermost enclosing function on
    # ("RowStat.fuser_forward" for a class that define_extensions defines).
    return {"origin": _shown(qualname), "origin_file": f"{_relative(path)}:{line}"}


def _error_entry(builder, exc, detail, phase):
    entry = {"kind": detail, "type": type(exc).__name__, "message": str(exc), "phase": phase}
    entry.update(error_origin(exc, builder))
    return entry


# ----------------------------------------------------------------------------------------
# One path


class _Built:
    """What building a path made, and the phase it reached."""

    def __init__(self, case):
        self.ops = [None] * len(case.ops)
        self.seq = None
        self.phase = PHASE_CREATE
        self.locked_before = [False] * len(case.ops)


def _build(builder, case, device, values, built):
    """Ops, call-then-bind calls, bindings, Sequential, late binds (built.phase follows)."""
    built.phase = PHASE_CREATE
    for op_case in case.ops:
        built.ops[op_case.index] = (
            builder.make_boundary()
            if op_case.boundary
            else builder.create_op(values.op_case(op_case), case, device)
        )
    ops = built.ops

    built.phase = PHASE_CALL
    for k, ((index, grad_mode), (call_x, call_extras)) in enumerate(
        zip(case.call_then_bind, case.call_inputs)
    ):
        with torch.set_grad_enabled(grad_mode):
            x = values.fresh(("call", k), call_x, grad_mode)
            extras = [values.fresh(("call", k, j), e, grad_mode) for j, e in enumerate(call_extras)]
            builder.call_standalone(ops[index], x, extras)

    built.phase = PHASE_BIND
    for op_case in case.catalog_ops:
        op = ops[op_case.index]
        for slot, channel in op_case.bound_inputs:
            builder.bind_input(op, slot, channel)
        for slot, channel, to_caller in op_case.bound_outputs:
            builder.bind_output(op, slot, channel, to_caller)

    built.phase = PHASE_CONSTRUCT
    built.locked_before = [
        op is not None and not c.boundary and builder.is_locked(op) for op, c in zip(ops, case.ops)
    ]
    built.seq = make_sequential(builder, case, ops)

    built.phase = PHASE_LATE_BIND
    for index, slot, channel in case.late_binds:
        builder.bind_input(ops[index], slot, channel)


def make_sequential(builder, case, ops):
    """The path's Sequential over `ops`: one (builder.make_sequential), or with
    case.several_sequentials a Chain of one per run of ops between Boundary modules."""
    if not case.several_sequentials:
        return builder.make_sequential(ops)
    return Chain(builder, case, ops)


class Chain:
    """spec.several_sequentials: each run of ops between Boundary modules a Sequential of its
    own (builder.make_sequential), called one after another with the Boundaries between
    them, in the one autocast builder.forward enters around the call. A caller splits the
    public extra inputs itself: each Sequential takes those of its ops' unbound input slots,
    in op order, and the extra outputs come back concatenated in the same order, as one
    Sequential returns them. It shows the backends what they read of one Sequential: the
    torch runtime's `fusers` and `modules`, TE's `_module_groups`."""

    def __init__(self, builder, case, ops):
        self.parts = []  # (module, None) for a Boundary, (Sequential, public extra inputs)
        self.modules = list(ops)
        run = []

        def flush():
            if run:
                count = sum(
                    1
                    for op_case in run
                    for slot, channel in enumerate(op_case.input_channels)
                    if channel is None and slot < len(op_case.extra_input_kinds)
                )
                seq = builder.make_sequential([ops[op_case.index] for op_case in run])
                self.parts.append((seq, count))
                run.clear()

        for op_case in case.ops:
            if op_case.boundary:
                flush()
                self.parts.append((ops[op_case.index], None))
            else:
                run.append(op_case)
        flush()

    @property
    def sequentials(self):
        return [seq for seq, count in self.parts if count is not None]

    @property
    def fusers(self):
        return [f for seq in self.sequentials for f in seq.fusers]

    @property
    def _module_groups(self):
        groups = []
        for part, count in self.parts:
            if count is None:
                groups.append(part)
                continue
            mine = getattr(part, "_module_groups", None)
            if mine is None:
                return None  # a Sequential that has not built its fusers yet
            groups.extend(mine)
        return groups

    def __call__(self, x, *extra_inputs):
        wanted = sum(count for _, count in self.parts if count is not None)
        if len(extra_inputs) != wanted:
            raise ValueError(
                f"the Sequentials take {wanted} public extra inputs together, got "
                f"{len(extra_inputs)}"
            )
        extra_outputs = []
        taken = 0
        for part, count in self.parts:
            if count is None:
                x = part(x)
                continue
            out = part(x, *extra_inputs[taken : taken + count])
            taken += count
            if isinstance(out, tuple):
                x = out[0]
                extra_outputs.extend(out[1:])
            else:
                x = out
        return x if not extra_outputs else (x, *extra_outputs)


def _written_weight(case, op_case, index):
    """The high-precision weight last written into `op_case`'s Linear before call `index` (0
    the first call): the case's, or the last optimizer step's."""
    weight = op_case.params[0]
    for k, call in enumerate(repeat_calls(case)[:index], start=1):
        if call["update"]:
            weight = case.step_params[k - 1][op_case.index][0]
    return weight


def _take_tensor_checks(builder, call):
    """The backend's checks of the quantized tensors the call made (Builder.
    take_tensor_checks: {"checked", "violations"}, issue 26 item 2), joined to the call's
    fp8_state verdict: their violations beside the states', their count as
    "tensors_checked"."""
    verdict = builder.take_tensor_checks()
    if verdict is None:
        return
    state = call.fp8_state if call.fp8_state is not None else {"checked": 0, "violations": []}
    state["violations"].extend(verdict["violations"])
    state["tensors_checked"] = state.get("tensors_checked", 0) + verdict["checked"]
    call.fp8_state = state


def _read_held_weights(builder, case, ops, call):
    """spec.held_quantized_tensor: after the call, the caller reads every quantized weight
    it holds (builder.held_weights). dequantize() must follow the values last written (one
    FP8 step of them: a copy the call or the optimizer step left stale is off by far more)
    and carry autograd where the weight requires grad; shape and size() must be the
    weight's; the column-wise copy must be the row-wise one's transpose where the format
    makes it so. What is wrong goes into the call's fp8_state as a violation of its own
    ("held_weight[0]"; oracle::check_fp8_state)."""
    if not case.held_quantized_tensor:
        return
    verdict = call.fp8_state if call.fp8_state is not None else {"checked": 0, "violations": []}
    by_index = {op_case.index: op_case for op_case in case.catalog_ops}

    def violate(op, what, note):
        verdict["violations"].append(
            {"op": op, "quantizer": "held_weight[0]", "what": what, "note": note}
        )

    for held in builder.held_weights(ops, case):
        verdict["checked"] += 1
        w = held.tensor
        want = _written_weight(case, by_index[held.op], call.index).detach()
        shape = tuple(want.shape)
        sizes = tuple(w.size(d) for d in range(len(shape))) if w.dim() == len(shape) else ()
        if tuple(w.shape) != shape or sizes != shape:
            violate(
                held.op,
                "shape",
                f"the weight's shape is {list(w.shape)} and size() {list(sizes)}; its values "
                f"are {list(shape)}",
            )
            continue
        with torch.enable_grad():
            deq = w.dequantize()
        if w.requires_grad and not deq.requires_grad:
            violate(
                held.op,
                "autograd",
                "dequantize() of a weight that requires grad hands back a tensor without autograd",
            )
        got = deq.detach().to(device="cpu", dtype=torch.float64)
        ref = want.to(device="cpu", dtype=torch.float64)
        # One FP8 step: E4M3's relative half-step is 2^-4 (E5M2's 2^-3), below the smallest
        # normal an absolute 2^-10 of the block's scale, at most amax/448 (and the weight's
        # own dtype rounds the dequantized value once more).
        allowance = ref.abs() * 2.0**-3 + ref.abs().max() * 2.0**-12
        worst = (got - ref).abs() - allowance
        if bool((worst > 0).any()):
            at = int(worst.argmax())
            violate(
                held.op,
                "dequantize",
                f"dequantize() gives {float(got.flatten()[at]):.9g} at element {at} where "
                f"the weight last written holds {float(ref.flatten()[at]):.9g} (more than "
                "one FP8 step apart: the quantized copy did not follow the write)",
            )
        copies = held.copies or []
        for r, c in zip(copies[0::2], copies[1::2]):
            if r.shape != c.shape or not torch.equal(r, c):
                differ = "its shape" if r.shape != c.shape else "its codes"
                violate(
                    held.op,
                    "columnwise",
                    f"the column-wise copy is not the row-wise one's transpose ({differ} "
                    f"differ: {list(c.shape)} against {list(r.shape)})",
                )
                break
    call.fp8_state = verdict


def _carries_graph(out, given):
    """Whether an evaluation pass's output hands the caller an autograd graph: a grad_fn, or
    requires_grad on anything but a tensor the caller passed in (an identity op may return
    the caller's own leaf, or a view of it)."""
    if out.grad_fn is not None:
        return True
    if not out.requires_grad:
        return False
    storage = out.untyped_storage().data_ptr()
    return not any(
        t is not None and (t is out or t.untyped_storage().data_ptr() == storage) for t in given
    )


class _States:
    """One path's delayed-scaling state check (fp8_state.StateCheck) with what it needs: the
    weights each call runs with (an optimizer step changes them) and the states a checkpoint
    saved. Only under DelayedScaling, where the builder lists states."""

    def __init__(self, builder, case):
        self.builder, self.case = builder, case
        self.check = StateCheck()
        self.weights = _weights(case, [op.params for op in case.ops])
        self.saved = None

    @staticmethod
    def of(builder, case):
        recipe = case.spec.get("recipe") or {}
        if recipe.get("name") != "DelayedScaling" or not fp8_checks_on():
            return None
        return _States(builder, case)

    def states(self, ops):
        return to_host(self.builder.delayed_states(ops, self.case))

    def before_call(self, ops):
        self.check.before(self.states(ops), checkpointed=self.saved)
        self.saved = None

    def resize_at_next_call(self, length):
        """The recipe's amax_history_len is `length` from the next call on (the states after
        the last call resized: StateCheck.resize)."""
        self.check.resize(length)

    def after_call(self, ops, trained, quantized=True):
        """The call's verdict; `quantized` False: it ran with the recipe off and must have
        left every state as it was."""
        if quantized:
            self.check.after(
                self.states(ops),
                forward_trained=trained,
                backward_trained=trained,
                weights=self.weights,
            )
        else:
            self.check.untouched(self.states(ops))
        return self.check.take()

    def stepped(self, params):
        """An optimizer step wrote `params` (per spec op, model layout)."""
        self.weights = _weights(self.case, params)

    def saving(self, ops):
        """A checkpoint is saved from `ops`: the fresh ops must come back with these states."""
        self.saved = self.states(ops)


def _weights(case, params):
    """{(op, group): weight} of the case's Linear and GroupedLinear ops, model layout."""
    out = {}
    for op_case, values in zip(case.ops, params):
        if op_case.boundary or not values or op_case.name not in ("Linear", "GroupedLinear"):
            continue
        w = values[0]
        if op_case.name == "Linear":
            out[(op_case.index, 0)] = w
        else:
            for g in range(w.shape[0]):
                out[(op_case.index, g)] = w[g]
    return out


def _grad_mode(no_grad, inference):
    if no_grad and inference:
        return torch.inference_mode()
    return torch.set_grad_enabled(not no_grad)


class _Call:
    """One call of the Sequential: its outputs, gradients and changed caller tensors."""

    def __init__(self, index=0):
        # 0 the path's first call, k its k-th repeat call.
        self.index = index
        # The delayed-scaling state check's verdict of the call (fp8_state.StateCheck.take).
        self.fp8_state = None
        self.graph_outputs = []
        self.outputs = []
        self.grads = {}
        self.modified = []
        self.caller = _CallerTensors()
        # With record_plans: the plans right after the first call's forward (what a fresh
        # Sequential plans for this call's requires-grad pattern).
        self.forward_plans = None


def _run_call(
    builder,
    case,
    built,
    values,
    call,
    *,
    input_requires_grad,
    no_grad=False,
    first=True,
    tracker_scope=None,
    record_plans=False,
    inference=False,
    recompute=False,
    recipe_off=False,
    held=None,
    states=None,
):
    """Forward (and, unless `no_grad`, one autograd.grad of sum_k <output_k, cotangent_k>)
    of built.seq on fresh copies of the case's values; fills `call`. `first`: the path's
    first call (observers, channel gradients). `tracker_scope(caller)`: a context manager
    entered around forward and backward (the writer instrumentation). `record_plans`: keep
    the plans as the forward made them (call.forward_plans). The usage script's steps:
    `inference` (with no_grad: under torch.inference_mode), `recompute` (the forward under
    torch.utils.checkpoint), `recipe_off` (forward and backward with the recipe disabled:
    builder.recipe_off_scope), `held` (with case.read_after_backward: [(name, tensor)] the
    caller holds from earlier calls; this call's outputs are appended). `states`: the path's
    _States (delayed scaling's state judged before and after the call)."""
    ops, seq = built.ops, built.seq
    built.phase = PHASE_FORWARD
    caller = call.caller
    x = values.fresh("input", case.input, input_requires_grad)
    extras = [
        values.fresh(("extra", k), e, rg)
        for k, (e, rg) in enumerate(zip(case.extra_inputs, case.extra_input_requires_grad))
    ]
    caller.add("input", x)
    for k, e in enumerate(extras):
        caller.add(f"extra_input[{k}]", e)
    for name, t in held or []:
        caller.add(name, t)
    if states is not None:
        states.before_call(ops)
    scope = tracker_scope(caller) if tracker_scope is not None else contextlib.nullcontext()
    recipe_scope = builder.recipe_off_scope() if recipe_off else contextlib.nullcontext()
    with scope, recipe_scope:
        with _grad_mode(no_grad, inference):
            if recompute:
                outputs = list(
                    torch.utils.checkpoint.checkpoint(
                        lambda x_, *e_: tuple(builder.forward(seq, x_, list(e_))),
                        x,
                        *extras,
                        use_reentrant=False,
                    )
                )
            else:
                outputs = builder.forward(seq, x, extras)
        for k, out in enumerate(outputs):
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"output {k} of the Sequential is a {type(out).__name__}")
        call.outputs = outputs
        if no_grad:
            # An evaluation pass hands the caller no autograd graph.
            call.graph_outputs = [
                k for k, out in enumerate(outputs) if _carries_graph(out, [x, *extras])
            ]
        if held is not None and case.read_after_backward:
            for k, out in enumerate(outputs):
                caller.add(f"held_output[{k}]", out)
                held.append((f"held_output[{k}].call[{call.index}]", out))
        if record_plans:
            try:
                call.forward_plans = builder.plans(seq, case, ops)
            except Exception:  # noqa: BLE001 - unreadable: the repeat calls plan afresh
                call.forward_plans = None
        if first:
            builder.after_forward(seq, case, ops, outputs)
        if no_grad:
            call.modified = caller.modified()
            if states is not None:
                call.fp8_state = states.after_call(ops, trained=False, quantized=not recipe_off)
            _read_held_weights(builder, case, ops, call)
            _take_tensor_checks(builder, call)
            return

        built.phase = PHASE_BACKWARD
        loss_outputs, loss_cotangents = [], []
        for k, (out, cot) in enumerate(zip(outputs, case.cotangents)):
            if cot is None or out is None or not out.is_floating_point() or not out.requires_grad:
                continue
            if tuple(out.shape) != tuple(cot.shape):
                continue  # a shape bug; the output comparison reports it
            cot = values.fresh(("cotangent", k), cot, dtype=out.dtype).to(device=out.device)
            caller.add(f"cotangent[{k}]", cot)
            loss_outputs.append(out)
            loss_cotangents.append(cot)
        wrt = []
        where = []
        if x.requires_grad:
            wrt.append(x)
            where.append(("input", None))
        param_leaves = {}
        for op_case in case.catalog_ops:
            leaves = builder.param_leaves(ops[op_case.index], op_case)
            param_leaves[op_case.index] = (len(wrt), len(leaves))
            wrt.extend(leaves)
            where.extend(("param", op_case.index) for _ in leaves)
        for k, e in enumerate(extras):
            if e is not None and e.requires_grad:
                wrt.append(e)
                where.append(("extra", k))
        if first:
            for fuser, channel, t in builder.channel_leaves(seq, case):
                if t is not None and t.requires_grad:
                    wrt.append(t)
                    where.append(("channel", (fuser, channel)))
        computed = [None] * len(wrt)
        if loss_outputs and wrt:
            computed = list(
                torch.autograd.grad(loss_outputs, wrt, loss_cotangents, allow_unused=True)
            )
        builder.after_backward(ops)
    grads = {"input": None, "extra": [None] * len(extras)}
    grads["channel"] = [dict() for _ in case.fusers]
    for (kind, key), g, t in zip(where, computed, wrt):
        if kind == "input":
            grads["input"] = g
        elif kind == "extra":
            grads["extra"][key] = g
        elif kind == "channel":
            grads["channel"][key[0]][key[1]] = torch.zeros_like(t) if g is None else g
    grads["params"] = []
    for op_case in case.ops:
        if op_case.boundary:
            grads["params"].append([])
            continue
        start, count = param_leaves[op_case.index]
        grads["params"].append(
            builder.param_grads(ops[op_case.index], op_case, computed[start : start + count])
        )
    if first:
        recorded = builder.recorded_channel_grads(case)
        if recorded is not None:
            grads["channel"] = recorded
    else:
        del grads["channel"]
    call.grads = grads
    call.modified = caller.modified()
    if states is not None:
        call.fp8_state = states.after_call(ops, trained=True, quantized=not recipe_off)
    _read_held_weights(builder, case, ops, call)
    _take_tensor_checks(builder, call)


def _fail(builder, result, exc, phase):
    status, detail = builder.classify(exc)
    if status == "unsupported":
        result["status"] = "unsupported"
        result["reason"] = f"{type(exc).__name__}: {exc} [{detail}]"
    else:
        result["status"] = "error"
        result["error"] = _error_entry(builder, exc, detail, phase)


def _emit(result, call, tensors, phase):
    """The call's tensors into the reply (indices into `result`); a result that cannot
    travel is the call's error."""
    mark = len(tensors)
    try:
        result["outputs"] = [tensors.add(o) for o in call.outputs]
        grads = call.grads
        if grads:
            result["grad_input"] = tensors.add(grads["input"])
            result["grad_params"] = [[tensors.add(g) for g in gs] for gs in grads["params"]]
            result["grad_extra_inputs"] = [tensors.add(g) for g in grads["extra"]]
            if "channel" in grads:
                result["channel_grads"] = [
                    {name: tensors.add(g) for name, g in chans.items() if g is not None}
                    for chans in grads["channel"]
                ]
    except Exception as exc:  # noqa: BLE001 - a result that cannot travel is the path's error
        tensors.truncate(mark)
        for key in ("outputs", "grad_input", "grad_params", "grad_extra_inputs", "channel_grads"):
            result.pop(key, None)
        result["status"] = "error"
        result["error"] = {
            "kind": "unrecognized",
            "type": type(exc).__name__,
            "message": f"the path's results cannot be sent: {exc}",
            "phase": phase,
        }


def _safe_plans(builder, seq, case, ops):
    if seq is None:
        return []
    try:
        return builder.plans(seq, case, ops)
    except Exception:  # noqa: BLE001 - a plan we cannot read is left out, not an error
        return []


def _fresh_plans(builder, case, device, values, repeat_call):
    """Per fuser, the plans of a fresh Sequential (fresh ops, same bindings and values) at
    its first call with `repeat_call`'s requires-grad pattern: what TE's fuser plans for that
    first_op_requiring_backward without its plan cache (forward only: TE's
    OperationFuser.maybe_fuse_ops makes both passes' plans at the forward; where the
    backend can make them without the forward, builder.plan_without_forward, nothing
    runs)."""
    with builder.scratch_scope():
        built = _Built(case)
        _build(builder, case, device, values, built)
        x = values.fresh("input", case.input, repeat_call["input_requires_grad"])
        extras = [
            values.fresh(("extra", k), e, rg)
            for k, (e, rg) in enumerate(zip(case.extra_inputs, case.extra_input_requires_grad))
        ]
        recipe_scope = (
            builder.recipe_off_scope()
            if repeat_call.get("recipe_off")
            else contextlib.nullcontext()
        )
        with torch.set_grad_enabled(not repeat_call["no_grad"]), recipe_scope:
            if not builder.plan_without_forward(built.seq, x, extras):
                builder.forward(built.seq, x, extras)
        return builder.plans(built.seq, case, built.ops)


_STEPS = ("update", "inference_mode", "checkpoint", "recompute", "second_sequential")
# capabilities.usage of a backend whose Builder has the steps' methods (set_params, save_state,
# load_state) and builds deferred ops (create_op with case.deferred_init): every element the
# driver runs (harness/capabilities.h: usage).
USAGE = (
    *_STEPS,
    "read_after_backward",
    "deferred_init",
    "recipe_change",
    "several_sequentials",
    "quantized_params",
    "held_quantized_tensor",
)


def repeat_calls(case):
    """spec.repeat_calls as [{"no_grad", "input_requires_grad", "update", "inference_mode",
    "checkpoint", "recompute", "second_sequential", "recipe_off", "amax_history_len"}]
    (harness/case_spec.h: RepeatCall's defaults: false, true, false for the usage script's
    steps, 0 for the history length)."""
    return [
        {
            "no_grad": bool(c.get("no_grad", False)),
            "input_requires_grad": bool(c.get("input_requires_grad", True)),
            **{step: bool(c.get(step, False)) for step in _STEPS},
            "recipe_off": bool(c.get("recipe_off", False)),
            "amax_history_len": int(c.get("amax_history_len", 0)),
        }
        for c in case.spec.get("repeat_calls") or []
    ]


def run_path(builder, case, path, tensors, values=None, writers=True):
    """One path's reply entry (docs/BACKENDS.md "run" reply and Protocol 2); tensors go
    into `tensors`. `values`: the case's device values (shared by the case's paths);
    `writers` (the path's own "modified_by" overrides it): whether a changed caller
    tensor's writer is looked for (modified_by): True watches the path's first call itself
    (builder.writer_scope), "rerun" runs the path a second time watched, False not at all.
    The path's "trace" (true; default false) makes the reply carry the first call's trace
    (Trace), from the same watch of its plan groups."""
    values = values or _DeviceValues(case)
    writers = path.get("modified_by", writers)
    traced = path.get("trace", False)
    if not isinstance(traced, bool):
        raise ValueError(f'"trace" must be true or false, got {traced!r}')
    result = {"name": path["name"], "status": "ok"}
    fusions = path.get("fusions") or []
    # The repeat calls' expected plans: "per_pattern" (one fresh Sequential per requires-grad
    # pattern, the first call itself for its own), "per_call" (one each) or False (none).
    plans_mode = path.get("expected_plans", "per_pattern")
    if plans_mode not in ("per_pattern", "per_call", False):
        raise ValueError(
            f'"expected_plans" must be "per_pattern", "per_call" or false, got {plans_mode!r}'
        )
    fresh = {} if plans_mode == "per_pattern" else plans_mode
    built = _Built(case)
    call = _Call()
    repeats = []
    # The outputs the caller holds (case.read_after_backward), compared after each call.
    held = []
    # Delayed scaling's state judged across the path's calls (DelayedScaling cases).
    states = _States.of(builder, case)
    watch = (
        _Watch(builder, case, built, writers=writers is True, traced=traced)
        if writers is True or traced
        else None
    )
    modified_by = {}
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(builder.fusion_scope(fusions))
            device = builder.device(case)
            values.use(device)
            with _cost("paths"):
                _build(builder, case, device, values, built)
                _run_call(
                    builder,
                    case,
                    built,
                    values,
                    call,
                    input_requires_grad=case.input_requires_grad,
                    tracker_scope=watch.scope if watch else None,
                    record_plans=isinstance(fresh, dict)
                    and bool(fusions)
                    and bool(repeat_calls(case)),
                    held=held,
                    states=states,
                )
            if call.forward_plans is not None:
                fresh[
                    _pattern({"no_grad": False, "input_requires_grad": case.input_requires_grad})
                ] = call.forward_plans
            modified_by = watch.writers(call) if watch and call.modified else {}
        except Exception as exc:  # noqa: BLE001 - every backend error becomes the path's result
            _fail(builder, result, exc, built.phase)
            result["left_locked"] = (
                builder.left_locked(built.seq, built.ops, built.locked_before, built.phase)
                if built.phase in (PHASE_CONSTRUCT, PHASE_FORWARD)
                else []
            )
        result["plans"] = _safe_plans(builder, built.seq, case, built.ops)
        _emit(result, call, tensors, built.phase)
        if call.fp8_state is not None:
            result["fp8_state"] = call.fp8_state
        if traced:
            result["trace"] = watch.trace.emit(tensors)
        result["modified"] = call.modified if result["status"] == "ok" else []
        result.setdefault("left_locked", [])
        if result["status"] == "ok":
            for k, repeat_call in enumerate(repeat_calls(case), start=1):
                repeat = _run_repeat(
                    builder,
                    case,
                    built,
                    values,
                    device,
                    fusions,
                    repeat_call,
                    fresh,
                    k,
                    held,
                    states,
                )
                repeat["name"] = f"{path['name']}.call[{k}]"
                _emit_repeat(repeat, tensors)
                repeats.append(repeat)
                if repeat["status"] != "ok":
                    break  # the Sequential's state is unknown after a failed call (as the model)
    if repeat_calls(case):
        result["repeats"] = repeats
    if result["modified"] and writers == "rerun":
        with _cost("writer_runs"):
            modified_by = _writers(builder, case, path, values)
    if result["modified"] and writers and modified_by:
        result["modified_by"] = modified_by
    return result


class _Watch:
    """A path's first call watched group by group (builder.writer_scope around its forward
    and backward, with a GroupWatch): for writers of caller tensors (run_path with writers
    True: a WriterTracker) and for its trace (`traced`: a Trace, kept from the start so that
    a call that fails early still has one)."""

    def __init__(self, builder, case, built, *, writers, traced):
        self.builder, self.case, self.built = builder, case, built
        self.watch_writers = writers
        self.tracker = None
        self.trace = Trace(case.dtype) if traced else None

    def scope(self, caller):
        if self.watch_writers:
            self.tracker = WriterTracker(caller)
        groups = GroupWatch(self.tracker, self.trace)
        return self.builder.writer_scope(self.built.seq, self.case, self.built.ops, groups)

    def writers(self, call):
        """{caller tensor: group} for the changed tensors of `call` (its first call), as
        _writers finds them in a second run; {} where the tracker could not tell."""
        tracker = self.tracker
        if tracker is None:
            return {}
        tracker.leave()  # a change after the last group's start is that group's
        if tracker.failed:
            return {}
        return {name: group for name, group in tracker.writers.items() if name in call.modified}


def _pattern(repeat_call):
    """What a fresh Sequential's plans depend on: grad mode, the input's requires-grad, and
    whether the recipe is on (TE keys its plans on the recipe type)."""
    return (
        repeat_call["no_grad"],
        repeat_call["input_requires_grad"],
        repeat_call.get("recipe_off", False),
    )


def _run_repeat(
    builder,
    case,
    built,
    values,
    device,
    fusions,
    repeat_call,
    fresh,
    index=1,
    held=None,
    states=None,
):
    """Repeat call `index` of built.seq (same Sequential, same values but for its optimizer
    step's parameters) with the steps of the usage script before it, and the plans a fresh
    Sequential makes for it. `fresh`: the plans already made per requires-grad pattern (a
    dict, filled here), "per_call" (a fresh Sequential for this call whatever was made
    before) or False (no expected plans). `held`: run_path's held outputs."""
    repeat = {"status": "ok"}
    call = _Call(index)
    try:
        with _cost("repeat_calls"):
            builder.before_repeat_call(built.ops, case)
            if repeat_call["amax_history_len"]:
                # A recipe with another history length from this call on (TE's fuser
                # resizes each history at the call's forward).
                builder.set_amax_history_len(built.ops, case, repeat_call["amax_history_len"])
                if states is not None:
                    states.resize_at_next_call(repeat_call["amax_history_len"])
            if repeat_call["update"]:
                built.phase = PHASE_UPDATE
                _optimizer_step(builder, case, built, values, index)
                if states is not None:
                    states.stepped(case.step_params[index - 1])
            if repeat_call["checkpoint"]:
                built.phase = PHASE_CHECKPOINT
                if states is not None:
                    states.saving(built.ops)
                _checkpoint_round_trip(builder, case, built, values, device)
            if repeat_call["second_sequential"]:
                # The same op objects in a fuser of their own: it runs this call and the next.
                built.phase = PHASE_CONSTRUCT
                built.seq = make_sequential(builder, case, built.ops)
            _run_call(
                builder,
                case,
                built,
                values,
                call,
                input_requires_grad=repeat_call["input_requires_grad"],
                no_grad=repeat_call["no_grad"],
                first=False,
                inference=repeat_call["inference_mode"],
                recompute=repeat_call["recompute"],
                recipe_off=repeat_call["recipe_off"],
                held=held,
                states=states,
            )
    except Exception as exc:  # noqa: BLE001 - the call's error is the repeat's result
        _fail(builder, repeat, exc, built.phase)
    repeat["plans"] = _safe_plans(builder, built.seq, case, built.ops)
    repeat["modified"] = call.modified if repeat["status"] == "ok" else []
    if call.graph_outputs:
        repeat["graph_outputs"] = call.graph_outputs
    if call.fp8_state is not None:
        repeat["fp8_state"] = call.fp8_state
    repeat["call"] = call
    if not fusions or fresh is False:
        # No fusion registered: nothing to cache wrongly (the model checks none either).
        repeat["expected_plans"] = []
        return repeat
    if isinstance(fresh, dict) and _pattern(repeat_call) in fresh:
        repeat["expected_plans"] = fresh[_pattern(repeat_call)]
        return repeat
    try:
        with _cost("fresh_plans"):
            repeat["expected_plans"] = _fresh_plans(builder, case, device, values, repeat_call)
        if isinstance(fresh, dict):
            fresh[_pattern(repeat_call)] = repeat["expected_plans"]
    except Exception as exc:  # noqa: BLE001 - the first call built it: a failure is news
        repeat["expected_plans"] = []
        if repeat["status"] == "ok":
            _fail(builder, repeat, exc, "the plan check")
    return repeat


def _optimizer_step(builder, case, built, values, index):
    """What an optimizer's step does before repeat call `index`: every parameter written in
    place with the step's values (case.step_params, in the case dtype on the device)."""
    stepped = case.step_params[index - 1]
    for op_case in case.catalog_ops:
        new = [
            values.fresh(("step", index, op_case.index, j), t)
            for j, t in enumerate(stepped[op_case.index])
        ]
        builder.set_params(built.ops[op_case.index], op_case, [t.detach() for t in new])


def _checkpoint_round_trip(builder, case, built, values, device):
    """A checkpoint saved (every op's state through torch.save), fresh ops built as the path
    built its own (bindings, Sequential) with their parameters scrambled, the checkpoint
    loaded into them: the path goes on with the fresh ops and Sequential."""
    blob = io.BytesIO()
    torch.save(
        {
            op_case.index: builder.save_state(built.ops[op_case.index])
            for op_case in case.catalog_ops
        },
        blob,
    )
    fresh = _Built(case)
    _build(builder, case, device, values, fresh)
    for op_case in case.catalog_ops:
        # What a fresh model holds before its checkpoint loads: other values than the run's.
        scrambled = [
            -2.0 * values.fresh(("param", op_case.index, j), p).detach() + 0.5
            for j, p in enumerate(op_case.params)
        ]
        builder.set_params(fresh.ops[op_case.index], op_case, scrambled)
    blob.seek(0)
    states = torch.load(blob, weights_only=False)
    for op_case in case.catalog_ops:
        builder.load_state(fresh.ops[op_case.index], states[op_case.index])
    built.ops, built.seq = fresh.ops, fresh.seq
    built.phase = PHASE_CHECKPOINT


def _emit_repeat(repeat, tensors):
    call = repeat.pop("call")
    _emit(repeat, call, tensors, "forward")


def _writers(builder, case, path, values):
    """modified_by: the path run again (fresh ops, same values) with each plan group's run
    watched (builder.writer_scope), {caller tensor: group} for the tensors it changed; {}
    where the backend cannot tell or the second run went otherwise."""
    built = _Built(case)
    call = _Call()
    holder = {}

    def tracker_scope(caller):
        tracker = WriterTracker(caller)
        holder["tracker"] = tracker
        return builder.writer_scope(built.seq, case, built.ops, GroupWatch(tracker))

    try:
        with builder.fusion_scope(path.get("fusions") or []):
            device = builder.device(case)
            values.use(device)
            _build(builder, case, device, values, built)
            _run_call(
                builder,
                case,
                built,
                values,
                call,
                input_requires_grad=case.input_requires_grad,
                tracker_scope=tracker_scope,
            )
            tracker = holder["tracker"]
            tracker.leave()  # a change after the last group's start is that group's
    except Exception:  # noqa: BLE001 - the attribution is best effort; the path's result stands
        return {}
    return {name: group for name, group in tracker.writers.items() if name in call.modified}


def run_paths(builder, case, paths, tensors, writers=None):
    """Every requested path in order, honouring skip_if_nothing_fused and only_if_fired.
    `writers`: how modified_by is looked for (run_path; default: the request's
    "modified_by": true, false or "rerun", the earlier way, which costs a path's worth of
    time per modified path, docs/BENCHMARKS.md)."""
    if writers is None:
        writers = case.writers
    results = []
    first_ok_unfused = None
    values = _DeviceValues(case)
    for path in paths:
        nothing_fused = path.get("skip_if_nothing_fused") and results and first_ok_unfused
        not_fired = path.get("only_if_fired") and not (
            results and _fired_each_of(results[0], path["only_if_fired"])
        )
        if nothing_fused or not_fired:
            results.append(
                {
                    "name": path["name"],
                    "status": "skipped",
                    "plans": [],
                    "modified": [],
                    "left_locked": [],
                }
            )
            continue
        result = run_path(builder, case, path, tensors, values, writers)
        if not results:
            plans = [result["plans"]] + [r["plans"] for r in result.get("repeats", [])]
            first_ok_unfused = result["status"] == "ok" and not any(
                builder.any_fused(p) for p in plans
            )
        results.append(result)
    return results


def _fired_each_of(first, lists):
    """Whether `first` (the first path's result) ran without error and its plans hold, for
    each list of names, a fused group named in it (harness/path_run.h: fired_each_of)."""
    if first["status"] != "ok":
        return False
    fused = {
        g["name"]
        for fuser in first["plans"]
        for pass_ in ("forward", "backward")
        for g in fuser[pass_]
        if g["fused"]
    }
    return all(fused.intersection(names) for names in lists)


def protocol_hello(hello):
    """A backend's hello with what this driver adds for every backend (Protocol 2): the
    protocol number and capabilities.repeat_calls."""
    hello = dict(hello)
    hello["protocol"] = max(int(hello.get("protocol", 1)), PROTOCOL)
    capabilities = dict(hello.get("capabilities") or {})
    capabilities.setdefault("repeat_calls", True)
    hello["capabilities"] = capabilities
    return hello
