"""The torch backend's tensor and sequence parallelism: te.ops's communication ops and
column/row-parallel Linear, written independently of TE with torch.distributed (gloo on the
CPU, NCCL on CUDA), so that distributed cases run on the CPU (docs/BACKENDS.md
"Distributed cases").

A rank process (ranks.py) calls init() once its process group exists; the ops then
communicate over the default group. Every collective is a module-level function, so that a
planted fault (faults.py) can replace it, and every op raises what te.ops raises for a
split that does not divide (InvalidArgumentError with TE's wording). The math, per rank
(N ranks, slices r = 0..N-1; te.ops's own, basic_linear.py and ops/basic/*.py):

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
import torch.distributed as dist
import torch.nn.functional as F

from ..errors import InvalidArgumentError
from .runtime import BasicOp


class World:
    """The ranks this process is one of (set by ranks.py; one rank until then)."""

    rank = 0
    size = 1


WORLD = World()


def init(rank, size):
    """Records this process's rank in a world of `size` (its default process group)."""
    WORLD.rank = int(rank)
    WORLD.size = int(size)


# ----------------------------------------------------------------------------------------
# Collectives (the fault targets)


def all_gather_rows(x):
    """[rows, f] on each rank -> [N * rows, f], rank r's rows at block r."""
    if WORLD.size == 1:
        return x.clone()
    x = x.contiguous()
    out = torch.empty((WORLD.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x)
    return out


def reduce_scatter_rows(x):
    """[rows, f] summands -> rank r's block of rows/N rows of their sum. Rows must divide."""
    if WORLD.size == 1:
        return x.clone()
    rows = x.shape[0]
    if rows % WORLD.size != 0:
        # reduce_scatter.py: ReduceScatter.op_forward; distributed.py:
        # reduce_scatter_along_first_dim
        raise InvalidArgumentError(
            f"Attempted to reduce-scatter a tensor with shape={list(x.shape)} "
            f"over {WORLD.size} processes"
        )
    x = x.contiguous()
    out = torch.empty((rows // WORLD.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x)
    return out


def all_reduce_sum(x):
    """The sum of the ranks' x, on every rank (a new tensor: x is left as it was)."""
    out = x.clone()
    if WORLD.size > 1:
        dist.all_reduce(out)
    return out


def all_reduce_backward(grad_output):
    """AllReduce's backward: the gradient as it is (te.ops: all_reduce.py op_backward)."""
    return grad_output


def column_parallel_grad_input(grad_input, sequence_parallel):
    """A column-parallel Linear's dgrad, a summand per rank: summed over the ranks (all-reduce),
    or with sequence_parallel reduce-scattered into the ranks' row slices."""
    return reduce_scatter_rows(grad_input) if sequence_parallel else all_reduce_sum(grad_input)


# ----------------------------------------------------------------------------------------
# Autograd over the collectives


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_gather_rows(x)

    @staticmethod
    def backward(ctx, grad_output):
        # grad_output [N*rows, f] per rank -> rank r's rows of their sum [rows, f]
        return reduce_scatter_rows(grad_output)


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return reduce_scatter_rows(x)

    @staticmethod
    def backward(ctx, grad_output):
        # grad_output [rows/N, f] per rank -> [rows, f], the same on every rank
        return all_gather_rows(grad_output)


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_reduce_sum(x)

    @staticmethod
    def backward(ctx, grad_output):
        return all_reduce_backward(grad_output)


class _ColumnInput(torch.autograd.Function):
    """The input of a column-parallel GEMM: x itself (or its rows gathered with sequence
    parallelism); its gradient, a summand per rank, reduced over the ranks."""

    @staticmethod
    def forward(ctx, x, sequence_parallel):
        ctx.sequence_parallel = sequence_parallel
        return all_gather_rows(x) if sequence_parallel else x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        # grad_output [rows, in] summand -> [rows, in] summed (or [rows/N, in] scattered)
        return column_parallel_grad_input(grad_output, ctx.sequence_parallel), None


class _RowOutput(torch.autograd.Function):
    """The output of a row-parallel GEMM, a summand per rank: summed over the ranks (or
    reduce-scattered with sequence parallelism); its gradient the whole dy on every rank."""

    @staticmethod
    def forward(ctx, y, sequence_parallel):
        ctx.sequence_parallel = sequence_parallel
        return reduce_scatter_rows(y) if sequence_parallel else all_reduce_sum(y)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.sequence_parallel:
            return all_gather_rows(grad_output), None
        return grad_output, None


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
            return _AllGather.apply(x), ()
        if name == "ReduceScatter":
            return _ReduceScatter.apply(x), ()
        if name == "AllReduce":
            return _AllReduce.apply(x), ()
        if name == "Linear" and self.mode == 1:
            return F.linear(_ColumnInput.apply(x, self.sequence_parallel), self.params[0]), ()
        if name == "Linear" and self.mode == 2:
            return _RowOutput.apply(F.linear(x, self.params[0]), self.sequence_parallel), ()
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
