"""Planted faults: one function or method of the code under test replaced at run time, for
one request only (docs/BACKENDS.md Protocol 2, `run`'s "fault"; `gradfuzz selftest
--backend te|torch`).

A Fault names its target by dotted path ("transformer_engine.pytorch.ops.fuser.
OperationFuser.__init__") and builds the replacement from the original; planted() swaps it
in for the body of a `with` and puts the original back afterwards, also when the body
raises. Files are never edited. The faults themselves are te/faults.py's (TE) and
torch_backend/faults.py's (the torch backend's recipe emulation and ranks).
"""

import contextlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fault:
    """A planted defect. `replace(original)` returns the replacement for the target's raw
    class-dict entry (a function, or the staticmethod/classmethod object: see wrap)."""

    name: str
    description: str
    target: str
    replace: Callable
    # A fault of the ranks' communication fires only in cases of this many ranks (the
    # selftest draws such cases for it); 0 for the others.
    world_size: int = 0

    def capability(self):
        """The fault's entry in capabilities.faults."""
        entry = {"name": self.name, "description": self.description, "target": self.target}
        if self.world_size:
            entry["world_size"] = self.world_size
        return entry


def resolve(target):
    """(owner, attribute) of a dotted target: the longest importable module prefix, then
    attributes. Raises AttributeError or ImportError naming what is missing."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        if parts[-1] not in vars(owner):
            raise AttributeError(f"fault target {target}: {owner!r} has no {parts[-1]!r}")
        return owner, parts[-1]
    raise ImportError(f"fault target {target}: no importable module prefix")


def wrap(original, make):
    """The replacement for a raw class-dict entry `original` with `make(function)` around
    its function: a staticmethod or classmethod stays one."""
    if isinstance(original, staticmethod):
        return staticmethod(make(original.__func__))
    if isinstance(original, classmethod):
        return classmethod(make(original.__func__))
    return make(original)


@contextlib.contextmanager
def planted(faults, name):
    """Runs the body with fault `name` of `faults` ({name: Fault}) planted; None plants
    nothing. An unknown name raises ValueError listing the known ones."""
    if name is None:
        yield
        return
    fault = faults.get(name)
    if fault is None:
        known = ", ".join(sorted(faults)) or "none"
        raise ValueError(f"unknown fault {name!r}; this backend's faults: {known}")
    owner, attr = resolve(fault.target)
    original = vars(owner)[attr]
    setattr(owner, attr, fault.replace(original))
    try:
        yield
    finally:
        setattr(owner, attr, original)


def capabilities(faults):
    """capabilities.faults: every fault's name, description and target."""
    return [fault.capability() for fault in faults.values()]


# The environment variable that plants a fault for a whole process (plant_from_environment).
FAULT_VARIABLE = "GRADFUZZ_FAULT"
_PLANTED_FROM_ENVIRONMENT = {}


def plant_from_environment(faults, prefix, variable=FAULT_VARIABLE):
    """Plants fault $GRADFUZZ_FAULT of `faults` for the rest of the process, as replay plants
    it for one request: an exported upstream test of the torch backend runs under it
    (`GRADFUZZ_FAULT=torch-fp8-dgrad-scaled-down pytest test.py`). Once per process; unset,
    empty or another backend's name (not starting with `prefix`) plants nothing; an unknown
    name of this backend raises ValueError listing the known ones. Returns the planted
    fault's name or None."""
    name = os.environ.get(variable) or None
    if name is None or not name.startswith(prefix):
        return None
    if name in _PLANTED_FROM_ENVIRONMENT:
        return name
    stack = contextlib.ExitStack()
    stack.enter_context(planted(faults, name))  # never exited: the process keeps it
    _PLANTED_FROM_ENVIRONMENT[name] = stack
    return name


# ----------------------------------------------------------------------------------------
# Defects of the calls around a Sequential (the usage script's steps, issue "usage surface"):
# wrappers around a Sequential's call, `original(self, x, *extra_inputs, **kwargs)`, shared by the
# torch backend's faults and te/faults.py (each backend's own Sequential).


def eval_pass_keeps_graph(original):
    """Runs an evaluation pass (grad mode off, not inference mode) with grad mode on: the
    caller's eval outputs carry an autograd graph."""

    def call(self, x, *extra_inputs, **kwargs):
        if torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return original(self, x, *extra_inputs, **kwargs)
        with torch.enable_grad():
            return original(self, x, *extra_inputs, **kwargs)

    return call


def output_buffer_reused(original):
    """Hands out the main output's values by writing them into the tensor the previous call
    returned too (a reused output buffer): what the caller holds from that call changes."""

    def call(self, x, *extra_inputs, **kwargs):
        out = original(self, x, *extra_inputs, **kwargs)
        main = out[0] if isinstance(out, tuple) else out
        if torch.is_inference_mode_enabled() or main.is_inference():
            return out
        last = getattr(self, "_gradfuzz_fault_last_output", None)
        if last is not None and last.shape == main.shape and not last.is_inference():
            with torch.no_grad():
                last.copy_(main.detach())
        self._gradfuzz_fault_last_output = main
        return out

    return call


def recompute_as_eval_pass(original):
    """A forward run inside a backward (activation recompute) is taken for an evaluation
    pass and runs with grad mode off, as code whose recompute-phase test is mis-wired may:
    it saves nothing for backward, which the recompute must restore."""

    def call(self, x, *extra_inputs, **kwargs):
        if torch._C._current_graph_task_id() != -1:
            with torch.no_grad():
                return original(self, x, *extra_inputs, **kwargs)
        return original(self, x, *extra_inputs, **kwargs)

    return call
