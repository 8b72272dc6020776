"""The torch backend's tensor and sequence parallelism: te.ops's communication ops and
column/row-parallel Linear, written independently of TE with torch.distributed (gloo on the
CPU, NCCL on CUDA), so that distributed cases run on the CPU (docs/BACKENDS.md
"Distributed cases").

The collectives and their autograd functions are collectives.py's (a rank process calls its
init() once its process group exists; the ops then communicate over the default group);
every op raises what te.ops raises for a split that does not divide (InvalidArgumentError
with TE's wording). The math, per rank (N ranks, slices r = 0..N-1; te.ops's own,
basic_linear.py and ops/basic/*.py):

- AllGather: y = cat_r x_r (rows); dx_r = rows r of sum_r dy_r (reduce-scatter).
- ReduceScatter: y_r = rows r of sum_r x_r; dx = cat_r dy_r (all-gather).
- AllReduce: y = sum_r x_r; dx = dy (te.ops: the output is used by computations every
  rank repeats, so their gradients are already the same on every rank).
- Linear, column (tensor_parallel_mode 1): W_r = rows r of W [out/N, in];
  y_r = x W_r^T; dx = sum_r dy_r W_r (all-reduce); with sequence_parallel the input's rows
  are gathered first and dx reduce-scattered.
- Linear, row (mode 2): W_r = columns r of W [out, in/N]; y = sum_r x_r W_r^T (all-reduce;
  with sequence_parallel reduce-scatter); dx_r = dy W_r (dy gathered first with
  sequence_parallel).
- Bias with tensor_parallel: b_r = slice r of b; y_r = x_r + b_r.
On one rank every mode is off (te.ops turns it off) and every collective is the identity.
"""

import torch
import torch.nn.functional as F

from ..errors import InvalidArgumentError
from .collectives import (
    WORLD,
    AllGatherRows,
    AllReduceSum,
    ColumnInput,
    ReduceScatterRows,
    RowOutput,
)
from .runtime import BasicOp

# ----------------------------------------------------------------------------------------
# The ops on a rank


def _flag(attrs, name):
    return float(attrs.get(name, 0)) == 1.0


def _refuse_split(message):
    raise InvalidArgumentError(f"Invalid configuration for tensor parallelism ({message})")


class ParallelOp(BasicOp):
    """A catalog op on one rank of a distributed case: its parameters are this rank's slices
    (`param_shapes`, the rank's plan), its collectives torch.distributed's. Raises at
    construction what te.ops's constructors raise for a split that does not divide
    (`global_input_shape`: the op's input on the unsharded tensors)."""

    def __init__(self, name, attrs, input_shape, global_input_shape, param_shapes, **kwargs):
        super().__init__(name, attrs, input_shape, **kwargs)
        n = WORLD.size
        features = int(global_input_shape[-1])
        self.mode = int(float(attrs.get("tensor_parallel_mode", 0))) if name == "Linear" else 0
        self.sequence_parallel = name == "Linear" and _flag(attrs, "sequence_parallel")
        if n == 1:
            self.mode, self.sequence_parallel = 0, False  # te.ops turns parallelism off
        if self.mode == 0:
            self.sequence_parallel = False
        out = int(float(attrs.get("out", 16)))
        # basic_linear.py: BasicLinear._canonicalize_tensor_parallelism; bias.py: Bias.__init__
        if self.mode == 1 and out % n != 0:
            _refuse_split(f"mode='column', out_features={out}, group_size={n}")
        if self.mode == 2 and features % n != 0:
            _refuse_split(f"mode='row', in_features={features}, group_size={n}")
        if name == "Bias" and _flag(attrs, "tensor_parallel") and n > 1 and features % n != 0:
            _refuse_split(f"size={features}, tensor_parallel_size={n}")
        if self.params:
            # This rank's slices ([out/N, in] for a column split, [out, in/N] for a row one).
            dtype, device = self.params[0].dtype, self.params[0].device
            self.params = [torch.zeros(s, dtype=dtype, device=device) for s in param_shapes]

    def forward(self, x, extra_inputs):
        name = self.name
        if name == "AllGather":
            return AllGatherRows.apply(x), ()
        if name == "ReduceScatter":
            return ReduceScatterRows.apply(x), ()
        if name == "AllReduce":
            return AllReduceSum.apply(x), ()
        if name == "Linear" and self.mode == 1:
            return F.linear(ColumnInput.apply(x, self.sequence_parallel), self.params[0]), ()
        if name == "Linear" and self.mode == 2:
            return RowOutput.apply(F.linear(x, self.params[0]), self.sequence_parallel), ()
        return super().forward(x, extra_inputs)


def needs_parallel_op(name, attrs):
    """Whether catalog op `name` with `attrs` communicates or splits on several ranks."""
    if name in ("AllGather", "ReduceScatter", "AllReduce"):
        return True
    if name == "Linear":
        return float(attrs.get("tensor_parallel_mode", 0)) != 0
    if name == "Bias":
        return _flag(attrs, "tensor_parallel")
    return False
