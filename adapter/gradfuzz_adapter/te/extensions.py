"""The catalog ops TE lacks (Dispatch, Combine, RowStat, DualExtraOutput), the Boundary
module and the FusedResidual fusion, written as TE users write them.

Custom ops follow TE's own extra-tensor ops (ops/basic/make_extra_output.py,
add_extra_input.py, swiglu.py: _ScaledGLU): te.ops.BasicOperation subclasses with class
attributes num_extra_inputs / num_extra_outputs, the work in fuser_forward / fuser_backward,
and, as TE's convention, an extra input's gradient computed when that tensor's
requires_grad was set in forward. Output style "generator" hands the extra outputs (and, in
backward, the extra-input gradients) back as a Python generator instead of a tuple.
FusedResidual is a te.ops.FusedOperation registered in all three fusion passes
(register_fusions).

Importing this module imports TransformerEngine: the adapter imports it only when the te
backend starts (te/backend.py: TEBackend), and the exporter embeds its text whole without
importing it (te/embed.py). The scripts that embed it define `te`, `torch`, the catalog's
checks and the error classes before it.
"""

import torch
import transformer_engine.pytorch as te

from ..catalog import check_2d, check_logits, check_routing_map
from ..errors import InvalidArgumentError


def pack(style, tensors):
    """An op's extra outputs or extra-input gradients in its output style."""
    return (t for t in tensors) if style == "generator" else tuple(tensors)


def opmath(t):
    """fp32 for fp16/bf16 arithmetic, as TE's kernels compute."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class Boundary(torch.nn.Module):
    """A plain module: te.ops.Sequential (sequential.py: _make_module_groups) ends the
    current OperationFuser at it and passes it only the main tensor (which it keeps as
    last_input: the previous fuser's main output)."""

    def forward(self, x):
        self.last_input = x
        return x


class CustomOp(te.ops.BasicOperation):
    """Base of the custom ops: op_forward/op_backward are abstract in op.py:
    BasicOperation and unused by ops that override fuser_forward/fuser_backward. Their
    fuser_forward takes the quantizers and basic_op_kwargs the fuser passes as `unused`:
    they quantize nothing."""

    def __init__(self, *, output_style="vector"):
        super().__init__()
        self.output_style = output_style

    def op_forward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} runs fuser_forward and fuser_backward")

    op_backward = op_forward


class RowStat(CustomOp):
    """y = x; extra output: the mean of squares of each row [rows], a fresh tensor."""

    num_extra_outputs = 1

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        x = opmath(input_)
        stat = (x * x).mean(-1).to(input_.dtype)
        if basic_op_ctxs[0].requires_grad:
            # A detached alias: input_ is also this op's output, which the next op may save
            # and free in its backward, before this op's (activation.py: op_backward calls
            # utils.py: clear_tensor_data on it).
            basic_op_ctxs[0].save_for_backward(input_.detach())
        return input_, [pack(self.output_style, (stat,))]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        (grad_stat,) = basic_op_grad_extra_outputs[0]
        grad_input = grad_output
        if grad_stat is not None:
            (x,) = basic_op_ctxs[0].saved_tensors
            # grad_output [rows, n] + grad_stat [rows, 1] * 2 x [rows, n] / n
            grad_stat = opmath(grad_stat).unsqueeze(-1) * (2.0 / x.shape[-1])
            grad_input = (opmath(grad_output) + grad_stat * opmath(x)).to(grad_output.dtype)
        return grad_input, [()], [pack(self.output_style, ())]


class DualExtraOutput(CustomOp):
    """y = x; extra outputs s0 * x and s1 * x."""

    num_extra_outputs = 2

    def __init__(self, s0, s1, *, output_style="vector"):
        super().__init__(output_style=output_style)
        self.s0 = s0
        self.s1 = s1

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        return input_, [pack(self.output_style, (input_ * self.s0, input_ * self.s1))]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        grad0, grad1 = basic_op_grad_extra_outputs[0]
        # grad_output + s0 grad0 + s1 grad1, all [rows, n]
        grad_input = grad_output
        if grad0 is not None:
            grad_input = grad_input + grad0 * self.s0
        if grad1 is not None:
            grad_input = grad_input + grad1 * self.s1
        return grad_input, [()], [pack(self.output_style, ())]


class Dispatch(CustomOp):
    """Rows go to argmax(router logits) and are reordered by group (stable sort).
    Extra input: logits [rows, G]. Extra outputs: split sizes (int64 [G]), each token's
    softmax probability for its group in the new order ([rows], a fresh tensor that is
    differentiable w.r.t. the logits), the routing map (int64 [rows])."""

    num_extra_inputs = 1
    num_extra_outputs = 3

    def __init__(self, groups, *, output_style="vector"):
        super().__init__(output_style=output_style)
        self.groups = groups

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        (logits,) = basic_op_extra_inputs[0]
        check_2d("Dispatch", input_)
        check_logits("Dispatch", logits, input_.shape[0], self.groups)
        probs_full = torch.softmax(opmath(logits), dim=1)
        group = torch.argmax(logits, dim=1)
        routing_map = torch.sort(group, stable=True).indices
        split_sizes = torch.bincount(group, minlength=self.groups).to(torch.int64)
        token_probs = probs_full.gather(1, group.unsqueeze(1)).squeeze(1)
        token_probs = token_probs.index_select(0, routing_map).to(logits.dtype)
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.save_for_backward(routing_map, probs_full, group)
            # TE's convention (swiglu.py: _ScaledGLU.fuser_forward): the extra input's
            # requires_grad says whether its gradient is wanted.
            ctx.logits_requires_grad = logits.requires_grad
            ctx.logits_dtype = logits.dtype
        extra = (split_sizes, token_probs, routing_map)
        return input_.index_select(0, routing_map), [pack(self.output_style, extra)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        routing_map, probs_full, group = ctx.saved_tensors
        # grad_output [rows, n] scattered back: grad_input[map[i]] = grad_output[i]
        grad_input = torch.empty_like(grad_output).index_copy_(0, routing_map, grad_output)
        grad_probs = basic_op_grad_extra_outputs[0][1]
        grad_logits = None
        if ctx.logits_requires_grad and grad_probs is not None:
            rows = probs_full.shape[0]
            # back to the original row order, then d p_k / d l_j = p_k (delta_jk - p_j)
            gp = torch.zeros(rows, dtype=probs_full.dtype, device=probs_full.device)
            gp = gp.index_copy_(0, routing_map, grad_probs.to(probs_full.dtype)).unsqueeze(1)
            p_k = probs_full.gather(1, group.unsqueeze(1))
            one_hot = torch.zeros_like(probs_full).scatter_(1, group.unsqueeze(1), 1.0)
            grad_logits = (gp * p_k * (one_hot - probs_full)).to(ctx.logits_dtype)
        return grad_input, [()], [pack(self.output_style, (grad_logits,))]


class Combine(CustomOp):
    """Undoes Dispatch's reordering; extra input: the routing map (never a gradient)."""

    num_extra_inputs = 1

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        (routing_map,) = basic_op_extra_inputs[0]
        check_2d("Combine", input_)
        check_routing_map("Combine", routing_map, input_.shape[0])
        routing_map = routing_map.to(torch.int64)
        if basic_op_ctxs[0].requires_grad:
            basic_op_ctxs[0].save_for_backward(routing_map)
        # output[map[i]] = input[i]
        output = torch.empty_like(input_).index_copy_(0, routing_map, input_)
        return output, [pack(self.output_style, ())]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        (routing_map,) = basic_op_ctxs[0].saved_tensors
        # grad_input[i] = grad_output[map[i]]; the map gets no gradient
        grad_input = grad_output.index_select(0, routing_map)
        return grad_input, [()], [pack(self.output_style, (None,))]


class FusedResidual(te.ops.FusedOperation):
    """MakeExtraOutput bound to channel C, any one basic op without extra tensors, and
    AddExtraInput bound to C, as one fused op that owns C (ops/fused/fused_residual.cc
    in gradfuzz). Forward: the fuser hands AddExtraInput's slot over as None because the
    producer is in the same group (fuser.py: _OperationFuserAutogradFunction.forward),
    so the op adds x itself; it returns C's value only when the caller or a consumer
    outside the group needs it. Backward: the fuser does not route a gradient between
    two ops of one group (fuser.py: _OperationFuserAutogradFunction.backward, "Producer
    already ran inside this fusion"), so the op adds AddExtraInput's gradient of C to the
    producer's itself, and still returns it in AddExtraInput's slot as the basic op does.
    One class for the three registrations; `fusion_name` says which."""

    def __init__(self, producer, inner, consumer, *, fusion_name, returns_channel):
        super().__init__((producer, inner, consumer))
        self.fusion_name = fusion_name
        self.returns_channel = returns_channel

    def fuser_forward(self, ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs, **unused):
        if self.fusion_name == "FusedResidual.backward":
            raise RuntimeError("FusedResidual.backward is backward-only; its forward ran")
        producer, inner, consumer = self.basic_ops
        # The inner op runs its own forward and fills its own context. Its neighbours'
        # quantizers are what the fuser would pass it (fuser.py: prev_op/next_op).
        y, inner_extra_outputs = inner.fuser_forward(
            [ctxs[1]],
            input_,
            basic_op_extra_inputs=[basic_op_extra_inputs[1]],
            prev_op_grad_output_quantizer=producer.get_grad_output_quantizer(),
            next_op_input_quantizer=consumer.get_input_quantizer(),
            basic_op_kwargs=[basic_op_kwargs[1]],
        )
        if tuple(y.shape) != tuple(input_.shape):
            raise InvalidArgumentError(
                f"AddExtraInput slot 0: extra input must have the input's shape "
                f"{list(y.shape)}, got {list(input_.shape)}"
            )
        # y [rows, n] + x [rows, n], out of place: x is still C's value
        output = y + input_
        channel = input_ if self.returns_channel else None
        return output, [(channel,), inner_extra_outputs[0], ()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        if self.fusion_name == "FusedResidual.forward":
            raise RuntimeError("FusedResidual.forward is forward-only; its backward ran")
        inner = self.basic_ops[1]
        grad_inner, inner_grad_params, inner_grad_extra_inputs = inner.fuser_backward(
            [basic_op_ctxs[1]],
            grad_output,
            basic_op_grad_extra_outputs=[basic_op_grad_extra_outputs[1]],
        )
        # AddExtraInput: d(inner output) = d(C) = grad_output [rows, n]; MakeExtraOutput:
        # dx = inner dx + d(C) from AddExtraInput + d(C) from everyone else.
        grad_input = grad_output if grad_inner is None else grad_inner + grad_output
        (grad_extra_output,) = basic_op_grad_extra_outputs[0]
        if grad_extra_output is not None:
            grad_input = grad_input + grad_extra_output
        return (
            grad_input,
            [(), inner_grad_params[0], ()],
            [(), inner_grad_extra_inputs[0], (grad_output,)],
        )


def residual_pattern(window):
    """MakeExtraOutput -> basic op without extra tensors -> AddExtraInput, the producer's
    slot and the consumer's slot bound to the same channel (op.py: BasicOperation keeps
    bindings in _extra_output_channels / _extra_input_channels, as fuser.py reads them)."""
    producer, inner, consumer = window
    if any(op.is_fused_op for op in window) or inner.num_extra_inputs or inner.num_extra_outputs:
        return False
    if not isinstance(producer, te.ops.MakeExtraOutput):
        return False
    if not isinstance(consumer, te.ops.AddExtraInput):
        return False
    channel = producer._extra_output_channels[0]
    return channel is not None and consumer._extra_input_channels[0] == channel


def fuse_residual(ops, fusion_name):
    """`ops` with every residual_pattern window replaced by one FusedResidual; it returns
    the channel's value when the caller or an op outside the window reads it."""
    out, i = [], 0
    while i < len(ops):
        window = ops[i : i + 3]
        if len(window) < 3 or not residual_pattern(window):
            out.append(ops[i])
            i += 1
            continue
        producer, _, consumer = window
        channel = producer._extra_output_channels[0]
        basic = [b for op in ops for b in (op.basic_ops if op.is_fused_op else [op])]
        elsewhere = any(b is not consumer and channel in b._extra_input_channels for b in basic)
        returns = producer._extra_output_to_caller[0] or elsewhere
        out.append(FusedResidual(*window, fusion_name=fusion_name, returns_channel=returns))
        i += 3
    return out


# fuser.py: a fusion function is called as func(ops, *, recipe) (OperationFuser._apply_fusions)
def fuse_residual_forward(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.forward")


def fuse_residual_backward(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.backward")


def fuse_residual_joint(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.joint")


fuse_residual_forward.gradfuzz_fusion_name = "FusedResidual.forward"
fuse_residual_backward.gradfuzz_fusion_name = "FusedResidual.backward"
fuse_residual_joint.gradfuzz_fusion_name = "FusedResidual.joint"


def register_fusions():
    """Registers FusedResidual in the three passes (ops/__init__.py exports fuser.py's
    register_* functions), once per process: a second call registers nothing."""
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    registered = OperationFuser.forward_backward_fusion_functions
    if fuse_residual_joint in registered:
        return
    te.ops.register_forward_fusion(fuse_residual_forward)
    te.ops.register_backward_fusion(fuse_residual_backward)
    te.ops.register_forward_backward_fusion(fuse_residual_joint)
