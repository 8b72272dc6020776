"""The torch backend's collectives over torch.distributed (gloo on the CPU, NCCL on CUDA) and
the autograd functions over them, as te.ops's communication ops and parallel Linear use them
(parallel.py holds those ops). A rank process (ranks.py) calls init() once its process group
exists. Every collective is a module-level function that the autograd functions look up when
they run, so that a planted fault (faults.py) can replace it; nothing here imports the runtime.
On one rank every collective is the identity.
"""

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError


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


class AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_gather_rows(x)

    @staticmethod
    def backward(ctx, grad_output):
        # grad_output [N*rows, f] per rank -> rank r's rows of their sum [rows, f]
        return reduce_scatter_rows(grad_output)


class ReduceScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return reduce_scatter_rows(x)

    @staticmethod
    def backward(ctx, grad_output):
        # grad_output [rows/N, f] per rank -> [rows, f], the same on every rank
        return all_gather_rows(grad_output)


class AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_reduce_sum(x)

    @staticmethod
    def backward(ctx, grad_output):
        return all_reduce_backward(grad_output)


class ColumnInput(torch.autograd.Function):
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


class RowOutput(torch.autograd.Function):
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
