"""The torch backend's runtime: the repaired channel semantics of
../shared/spec/runtime.md on plain PyTorch eager autograd (no custom autograd).

One fusion, under an FP8 recipe only: TE's BackwardLinearScale (a quantized Linear and the
ConstantScale after it; te.ops fused/backward_linear_scale.py): the Linear's backward GEMMs
quantize the unscaled gradient and apply the scale as their alpha, the ConstantScale's
backward passes the gradient through (FUSIONS; a Sequential made with it enabled).

Ops are small classes with forward(x, extra_inputs) -> (y, extra_outputs) over the catalog
functions; channels are bound with the setters of runtime.md section 2 (validation order
slot-out-of-range, invalid-channel-name, locked); a Sequential groups runs of ops between
plain modules (Boundary) into fusers, validates every fuser at construction and locks only
when all are valid; a standalone op call runs a transient fuser that validates and never
locks. Embedded in exported torch scripts after errors.py and catalog.py.
"""

import torch

from ..catalog import apply, attr_real, param_shapes, slot_kinds, validate
from ..errors import (
    DuplicateProducerError,
    ExtraCountError,
    ExtraInputCountError,
    InvalidArgumentError,
    InvalidChannelNameError,
    LockedError,
    MissingProducerError,
    NeededOutsideFusionError,
    ProducerNotEarlierError,
    PublicOutputNoneError,
    SlotOutOfRangeError,
)
from .fp8 import OpQuantization, casts_grad_input_for_previous_op


class BasicOp:
    """One catalog op with its parameters, bindings and output style.

    forward(x, extra_inputs) -> (y, extra_outputs): extra_outputs is a tuple, or with
    output_style "generator" a real Python generator that the fuser consumes once.
    """

    def __init__(
        self, name, attrs, input_shape, *, dtype=torch.float64, device="cpu", output_style="vector"
    ):
        validate(name, attrs, input_shape)
        self.name = name
        self.attrs = dict(attrs)
        kinds_in, kinds_out = slot_kinds(name, attrs)
        self.extra_input_kinds = kinds_in
        self.extra_output_kinds = kinds_out
        self.num_extra_inputs = len(kinds_in)
        self.num_extra_outputs = len(kinds_out)
        self.params = [
            torch.zeros(shape, dtype=dtype, device=device)
            for shape in param_shapes(name, attrs, input_shape)
        ]
        if output_style not in ("vector", "generator"):
            raise InvalidArgumentError(f"{name}: unknown output style '{output_style}'")
        self.output_style = output_style
        self.input_channels = [None] * self.num_extra_inputs
        self.output_channels = [None] * self.num_extra_outputs
        self.output_to_caller = [True] * self.num_extra_outputs
        self.locked = False
        # fp8.OpQuantization under a case's FP8 recipe (or cache_quantized_input), set
        # by whoever builds the op; None: the catalog's math as it is.
        self.quantization = None
        # Set by a fuser whose fused op applies this op's factor to the gradient elsewhere
        # (the ConstantScale of a BackwardLinearScale): the value as it is, the gradient
        # passed through unchanged.
        self.gradient_passthrough = False
        # Built on "meta" and materialised (materialize), as deferred initialisation does.
        self.deferred = False

    # -- deferred initialisation (the usage script's deferred_init)

    @staticmethod
    def initial_values(params, device):
        """What reset_parameters gives `params` (their shapes and dtype) on `device`: uniform
        in +-1/sqrt(fan_in), from a generator of its own (the same values every time)."""
        generator = torch.Generator().manual_seed(0)
        out = []
        for p in params:
            fan_in = p.shape[-1] if p.dim() > 0 else 1
            bound = 1.0 / max(fan_in, 1) ** 0.5
            values = (torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound
            out.append(values.to(device=device, dtype=p.dtype))
        return out

    def materialize(self, device):
        """The second half of deferred initialisation: parameters built on "meta" (shapes, no
        storage) allocated on `device` and initialised as a module's reset_parameters does
        (uniform in +-1/sqrt(fan_in), from a generator of the op's own); the caller copies
        its values in after. Marks the op as deferred."""
        if not all(p.is_meta for p in self.params):
            raise InvalidArgumentError(f"{self.name}: materialize needs parameters on 'meta'")
        self.params = self.initial_values(self.params, device)
        self.deferred = True

    # -- a checkpoint (the usage script's round trip, docs/BACKENDS.md "Steps")

    def state_dict(self):
        """What a checkpoint saves of the op: its parameters' values and its quantizers'
        delayed-scaling state (TE's ops save theirs as extra state)."""
        state = {f"param{j}": p.detach().clone() for j, p in enumerate(self.params)}
        if self.quantization is not None:
            state["quantization"] = self.quantization.state()
        return state

    def load_state_dict(self, state):
        """A checkpoint's state into this op (parameters in place, the quantizers' state)."""
        with torch.no_grad():
            for j, p in enumerate(self.params):
                p.copy_(state[f"param{j}"])
        if self.quantization is not None and "quantization" in state:
            self.quantization.load_state(state["quantization"])

    # -- runtime.md section 1: the op's math

    def forward(self, x, extra_inputs):
        if self.quantization is not None and self.quantization.active:
            y, outs = self.quantization.apply(x, list(extra_inputs), self.params, self.attrs)
        else:
            y, outs = apply(self.name, x, list(extra_inputs), self.params, self.attrs)
        if self.gradient_passthrough:
            y = y.detach() + (x - x.detach())
        if self.output_style == "generator":
            return y, (t for t in outs)
        return y, tuple(outs)

    def writes_extra_input_in_place(self, slot):
        """AddExtraInput(in_place) adds into its extra input: the fuser hands it a copy."""
        return self.name == "AddExtraInput" and float(self.attrs.get("in_place", 0)) == 1.0

    # -- runtime.md section 2: bindings

    def _check_binding(self, direction, slot, count, channel):
        shown = "<unbound>" if channel is None else f"'{channel}'"
        if not isinstance(slot, int) or not 0 <= slot < count:
            raise SlotOutOfRangeError(
                f"{self.name}: extra {direction} slot {slot} is out of range (the op has {count} "
                f"extra {direction} slots) while binding channel {shown}"
            )
        if channel is not None and (not isinstance(channel, str) or not channel):
            raise InvalidChannelNameError(
                f"{self.name} extra {direction} slot {slot}: channel name must be a non-empty "
                f"string, got {channel!r}"
            )
        if self.locked:
            raise LockedError(
                f"{self.name} extra {direction} slot {slot}: cannot bind channel {shown}: the op "
                "is locked by a persistent fuser or Sequential; bindings must be set before it "
                "is placed in one"
            )

    def set_extra_input_channel(self, slot, channel):
        self._check_binding("input", slot, self.num_extra_inputs, channel)
        self.input_channels[slot] = channel
        return self

    def set_extra_output_channel(self, slot, channel, output_to_caller=True):
        self._check_binding("output", slot, self.num_extra_outputs, channel)
        self.output_channels[slot] = channel
        self.output_to_caller[slot] = True if channel is None else bool(output_to_caller)
        return self

    # -- runtime.md section 2, "Locking": a standalone call validates and never locks

    def __call__(self, x, *extra_inputs):
        # A standalone call runs outside the case's FP8 autocast: fp8.OpQuantization.
        quantization = self.quantization
        if quantization is not None:
            self.quantization = quantization.outside_autocast()
        try:
            outs = Fuser([self], persistent=False).forward(x, list(extra_inputs))
        finally:
            self.quantization = quantization
        return outs[0] if len(outs) == 1 else tuple(outs)


class Boundary:
    """A plain module between fusers: sees only the main tensor."""

    name = "Boundary"

    def __call__(self, x):
        return x


def _slot(ops, op, slot, direction):
    return f"{ops[op].name} (op {op}) extra {direction} slot {slot}"


# The fusions this runtime implements, by name (capabilities.fusions): their pass.
FUSIONS = {"BackwardLinearScale": "backward"}


def _linear_scale_pairs(ops):
    """Local index pairs (i, i + 1) that BackwardLinearScale fuses, left to right, as TE's
    fuse_backward_ops window scan does: a Linear quantized under a recipe (fp8.
    OpQuantization with quantizers; not tensor-parallel: the torch backend's ranks do not
    fuse) and the ConstantScale after it."""
    pairs = []
    i = 0
    while i + 1 < len(ops):
        linear, scale = ops[i], ops[i + 1]
        fusable = (
            linear.name == "Linear"
            and scale.name == "ConstantScale"
            and float(linear.attrs.get("tensor_parallel_mode", 0)) == 0
            and linear.quantization is not None
            and bool(linear.quantization.linear)
        )
        if fusable:
            pairs.append((i, i + 1))
            i += 2
        else:
            i += 1
    return pairs


class Fuser:
    """Routing tables of runtime.md section 3, built (and validated) at construction; a
    persistent fuser locks its ops. forward() follows sections 6 and 7; autograd does the
    backward of section 8, so channel gradients sum by construction and no gradient is
    ever written in place. `fusions`: the enabled names of FUSIONS (backward_groups)."""

    def __init__(self, ops, *, persistent=True, fusions=()):
        self.ops = list(ops)
        # BackwardLinearScale's pairs: the Linear's backward GEMMs take the scale as alpha,
        # the ConstantScale passes its gradient through.
        self.backward_fused = []
        if "BackwardLinearScale" in fusions:
            self.backward_fused = _linear_scale_pairs(self.ops)
            for i, j in self.backward_fused:
                scale = self.ops[j]
                self.ops[i].quantization.backward_alpha = attr_real(
                    scale.name, scale.attrs, "scale", 0.5
                )
                scale.gradient_passthrough = True
        # TE's fuser hands each op the previous op's grad_output quantizer, in every path
        # (fuser.py); the ops that cast their input gradient with it give the previous op an
        # FP8 gradient (fp8.casts_grad_input_for_previous_op). The first op has none.
        for i, op in enumerate(self.ops):
            quantization = op.quantization
            if quantization is None or not quantization.linear:
                continue
            after = self.ops[i + 1] if i + 1 < len(self.ops) else None
            quantization.gradient_cast_by_next = after is not None and (
                casts_grad_input_for_previous_op(after.name, after.attrs, quantization.recipe)
            )
        producers = {}
        for i, op in enumerate(self.ops):
            for s, channel in enumerate(op.output_channels):
                if channel is None:
                    continue
                if channel in producers:
                    first = _slot(self.ops, *producers[channel], "output")
                    second = _slot(self.ops, i, s, "output")
                    raise DuplicateProducerError(
                        f"channel '{channel}' is produced twice: by {first} and by {second}; "
                        "expected one producer per channel"
                    )
                producers[channel] = (i, s)
        self.public_inputs = []
        self.sources = {}
        self.consumers = {}
        for i, op in enumerate(self.ops):
            for s, channel in enumerate(op.input_channels):
                where = _slot(self.ops, i, s, "input")
                if channel is None:
                    self.public_inputs.append((i, s))
                    continue
                producer = producers.get(channel)
                if producer is None:
                    raise MissingProducerError(
                        f"{where} is bound to channel '{channel}' but no op "
                        "in the same fuser produces it (channels never cross a fuser boundary)"
                    )
                if producer[0] >= i:
                    raise ProducerNotEarlierError(
                        f"{where} consumes channel '{channel}' produced by "
                        f"{_slot(self.ops, *producer, 'output')}; expected the producer at an op "
                        f"index below {i}"
                    )
                self.sources[(i, s)] = producer
                self.consumers.setdefault(producer, []).append((i, s))
        self.public_outputs = [
            (i, s)
            for i, op in enumerate(self.ops)
            for s in range(op.num_extra_outputs)
            if op.output_to_caller[s]
        ]
        self.channels = {}
        if persistent:
            for op in self.ops:
                op.locked = True

    @property
    def num_public_extra_inputs(self):
        return len(self.public_inputs)

    def forward(self, x, extra_inputs):
        """[y, public extra outputs...]; records each channel's value in self.channels."""
        if len(extra_inputs) != len(self.public_inputs):
            raise ExtraInputCountError(
                f"fuser expected {len(self.public_inputs)} public extra inputs, "
                f"got {len(extra_inputs)}"
            )
        caller = dict(zip(self.public_inputs, extra_inputs))
        values = {}
        self.channels = {}
        for i, op in enumerate(self.ops):
            extras = []
            for s in range(op.num_extra_inputs):
                source = self.sources.get((i, s))
                t = values[source] if source is not None else caller[(i, s)]
                if t is not None and op.writes_extra_input_in_place(s):
                    # A private copy: no other consumer of the channel and no caller sees
                    # the write (runtime.md section 11).
                    t = t.clone()
                extras.append(t)
            x, outs = op.forward(x, extras)
            # Materialise the container exactly once (runtime.md section 7).
            outs = tuple(outs)
            if len(outs) != op.num_extra_outputs:
                raise ExtraCountError(
                    f"{op.name} returned {len(outs)} extra outputs, expected {op.num_extra_outputs}"
                )
            for s, t in enumerate(outs):
                if t is None:
                    if op.output_to_caller[s]:
                        raise PublicOutputNoneError(
                            f"{_slot(self.ops, i, s, 'output')}: public output returned none"
                        )
                    if self.consumers.get((i, s)):
                        where = _slot(self.ops, i, s, "output")
                        raise NeededOutsideFusionError(
                            f"{where} (channel '{op.output_channels[s]}') returned none but is "
                            "needed outside its fusion"
                        )
                values[(i, s)] = t
                if op.output_channels[s] is not None:
                    self.channels[op.output_channels[s]] = t
        return [x] + [values[ref] for ref in self.public_outputs]

    def plan(self, offset=0):
        """One group per op (no fusion): [{"name", "begin", "end", "fused"}]."""
        return [
            {"name": op.name, "begin": offset + i, "end": offset + i + 1, "fused": False}
            for i, op in enumerate(self.ops)
        ]

    def backward_plan(self, members):
        """The backward groups as TE's fuser reports them, in the spec op indices `members`:
        a fused BackwardLinearScale over its Linear and ConstantScale, one group per other op."""
        fused = dict(self.backward_fused)
        groups = []
        i = 0
        while i < len(self.ops):
            if i in fused:
                j = fused[i]
                groups.append(
                    {
                        "name": "BackwardLinearScale",
                        "begin": members[i],
                        "end": members[j] + 1,
                        "fused": True,
                    }
                )
                i = j + 1
                continue
            groups.append(
                {
                    "name": self.ops[i].name,
                    "begin": members[i],
                    "end": members[i] + 1,
                    "fused": False,
                }
            )
            i += 1
        return groups


class Sequential:
    """Maximal runs of BasicOps become one fuser each; anything else is a plain module.
    Construction validates every fuser first and locks only when all are valid; channels
    never cross a boundary (missing-producer at construction)."""

    def __init__(self, *modules, fusions=(), recipe=None):
        """`recipe` (recipes.parse_recipe): what the BasicOps quantize under, as TE's ops do
        under te.autocast(recipe=...): each op without an OpQuantization gets the recipe's
        where it is active."""
        self.modules = list(modules)
        if recipe is not None:
            for m in self.modules:
                quantization = (
                    OpQuantization(m.name, m.attrs, recipe) if isinstance(m, BasicOp) else None
                )
                if quantization is not None and m.quantization is None and quantization.active:
                    m.quantization = quantization
        runs, current = [], None
        for m in self.modules:
            if isinstance(m, BasicOp):
                if current is None:
                    current = []
                    runs.append(current)
                current.append(m)
            else:
                current = None
        self.fusers = [Fuser(run, persistent=False, fusions=fusions) for run in runs]
        for fuser in self.fusers:
            for op in fuser.ops:
                op.locked = True

    @property
    def num_public_extra_inputs(self):
        return sum(f.num_public_extra_inputs for f in self.fusers)

    def __call__(self, x, *extra_inputs):
        expected = self.num_public_extra_inputs
        if len(extra_inputs) != expected:
            per_fuser = ", ".join(
                f"fuser {k} takes {f.num_public_extra_inputs}" for k, f in enumerate(self.fusers)
            )
            which = "surplus" if len(extra_inputs) > expected else "shortfall"
            raise ExtraInputCountError(
                f"Sequential expected {expected} public extra inputs ({per_fuser or 'no fusers'}), "
                f"got {len(extra_inputs)} ({which})"
            )
        extra_outputs = []
        next_extra = 0
        fusers = iter(self.fusers)
        in_run = False
        for m in self.modules:
            if isinstance(m, BasicOp):
                if in_run:
                    continue
                in_run = True
                fuser = next(fusers)
                count = fuser.num_public_extra_inputs
                outs = fuser.forward(x, list(extra_inputs[next_extra : next_extra + count]))
                next_extra += count
                x = outs[0]
                extra_outputs.extend(outs[1:])
            else:
                in_run = False
                x = m(x)
        return x if not extra_outputs else (x, *extra_outputs)


from . import faults  # noqa: E402, F401  GRADFUZZ_FAULT=<name> (faults.PLANTED)
