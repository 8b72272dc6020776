"""The te backend: every case on TransformerEngine 2.20.2's te.ops (docs/BACKENDS.md).

All TE-specific code of the adapter is in this module. TE is imported lazily: by
TEBackend() (the backend starting) and by nothing else, so the exporter can import this
module and embed its functions in scripts without importing TE. Citations are to TE's
source (the 2.20.2 wheel: transformer_engine/pytorch/...), as file:function.

Layout:
- op_recipe(): which te.ops class, with which arguments, stands for each catalog op;
  param_groups()/copy_param_values()/... map the model's parameter layout to TE's;
- define_extensions(te): the catalog ops TE lacks (Dispatch, Combine, RowStat,
  DualExtraOutput) as TE users write custom ops (te.ops.BasicOperation subclasses), the
  FusedResidual fusion (a te.ops.FusedOperation) and its three fusion functions;
- fusion naming and filtering over OperationFuser's registration lists;
- classify(): TE's errors -> runtime error kinds, or "unsupported" for documented limits;
- TEBuilder/TEBackend: the driver hooks and the hello/run answers.
"""

import contextlib
import os
import platform
import re
import types

import torch

from .catalog import check_2d, check_logits, check_routing_map
from .driver import Builder, run_paths
from .errors import GradfuzzError, InvalidArgumentError

# ----------------------------------------------------------------------------------------
# Which te.ops class stands for each catalog op


class Symbol:
    """A name in generated code (DEVICE, DTYPE) that the backend replaces by a value."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


DEVICE = Symbol("DEVICE")
DTYPE = Symbol("DTYPE")

# The ops written in this module (define_extensions), not in TE.
CUSTOM_OPS = ("Dispatch", "Combine", "RowStat", "DualExtraOutput")


def _flag(attrs, name):
    return float(attrs.get(name, 0)) == 1.0


def op_recipe(name, attrs, input_shape, output_style="vector"):
    """(callee, args, kwargs) that build catalog op `name` with te.ops: callee is a dotted
    name ("te.ops.BasicLinear", or a custom class "Dispatch"); DEVICE and DTYPE stand for
    the case's device and dtype. Attrs are the catalog's with TE's option names
    (accumulate_into_main_grad, cache_quantized_input, ...) alongside."""
    features = int(input_shape[-1])
    dev = {"device": DEVICE, "dtype": DTYPE}
    if output_style != "vector" and name not in CUSTOM_OPS:
        # TE's own ops return tuples; only the adapter's custom ops have a generator style.
        raise NotImplementedError(f"te.ops has no '{output_style}' output style for {name}")
    if name == "Linear":
        # basic_linear.py: BasicLinear.__init__(in_features, out_features, *, device, dtype,
        # ..., accumulate_into_main_grad); weight [out, in] like the model's.
        return (
            "te.ops.BasicLinear",
            (features, int(attrs.get("out", 16))),
            dict(dev, accumulate_into_main_grad=_flag(attrs, "accumulate_into_main_grad")),
        )
    if name == "Bias":
        return "te.ops.Bias", (features,), dev  # bias.py: Bias.__init__(size, *, device, dtype)
    if name == "ConstantScale":
        return "te.ops.ConstantScale", (float(attrs.get("scale", 0.5)),), {}
    if name in ("ReLU", "GELU", "SReLU"):
        # activation.py: _ActivationOperation.__init__(*, cache_quantized_input)
        return (
            f"te.ops.{name}",
            (),
            {"cache_quantized_input": _flag(attrs, "cache_quantized_input")},
        )
    if name == "SwiGLU":
        # swiglu.py: SwiGLU.__init__(*, cache_quantized_input, glu_interleave_size)
        k = int(attrs.get("interleave", 0))
        return (
            "te.ops.SwiGLU",
            (),
            {
                "cache_quantized_input": _flag(attrs, "cache_quantized_input"),
                "glu_interleave_size": k or None,
            },
        )
    if name == "ScaledSwiGLU":
        # swiglu.py: _ScaledGLU.__init__(glu_interleave_size=None, *, activation_recompute_in_mlp)
        k = int(attrs.get("interleave", 0))
        return (
            "te.ops.ScaledSwiGLU",
            (),
            {
                "glu_interleave_size": k or None,
                "activation_recompute_in_mlp": _flag(attrs, "activation_recompute_in_mlp"),
            },
        )
    if name == "ScaledSReLU":
        # activation.py: _ScaledUnary.__init__(*, activation_recompute_in_mlp)
        return (
            "te.ops.ScaledSReLU",
            (),
            {"activation_recompute_in_mlp": _flag(attrs, "activation_recompute_in_mlp")},
        )
    if name in ("MakeExtraOutput", "AddExtraInput"):
        # make_extra_output.py / add_extra_input.py: __init__(*, in_place)
        return f"te.ops.{name}", (), {"in_place": _flag(attrs, "in_place")}
    if name == "GroupedLinear":
        # grouped_linear.py: GroupedLinear.__init__(num_groups, in_features, out_features, *,
        # bias, device, dtype, ..., accumulate_into_main_grad, single_grouped_weight,
        # single_grouped_bias, delay_wgrad_compute, scale_bias)
        return (
            "te.ops.GroupedLinear",
            (int(attrs.get("groups", 2)), features, int(attrs.get("out", 16))),
            dict(
                dev,
                bias=float(attrs.get("bias", 1)) == 1.0,
                accumulate_into_main_grad=_flag(attrs, "accumulate_into_main_grad"),
                single_grouped_weight=_flag(attrs, "single_grouped_weight"),
                single_grouped_bias=_flag(attrs, "single_grouped_bias"),
                delay_wgrad_compute=_flag(attrs, "delay_wgrad_compute"),
                scale_bias=_flag(attrs, "scale_bias"),
            ),
        )
    if name in ("RMSNorm", "LayerNorm"):
        # rmsnorm.py / layer_norm.py: __init__(normalized_shape, *, eps, device, dtype,
        # zero_centered_gamma, sm_margin); weight (and LayerNorm's bias) are gamma (beta).
        return (
            f"te.ops.{name}",
            (features,),
            dict(
                eps=float(attrs.get("eps", 1e-5)),
                **dev,
                zero_centered_gamma=_flag(attrs, "zero_centered_gamma"),
                sm_margin=int(attrs.get("sm_margin", 0)),
            ),
        )
    if name == "Reshape":
        target = int(attrs.get("features", 0)) or features
        return "te.ops.Reshape", ((-1, target),), {}  # reshape.py: Reshape.__init__(shape)
    if name == "Identity":
        return "te.ops.Identity", (), {}
    if name == "Dispatch":
        return "Dispatch", (int(attrs.get("groups", 2)),), {"output_style": output_style}
    if name in ("Combine", "RowStat"):
        return name, (), {"output_style": output_style}
    if name == "DualExtraOutput":
        s0, s1 = float(attrs.get("s0", 0.5)), float(attrs.get("s1", -1.5))
        return "DualExtraOutput", (s0, s1), {"output_style": output_style}
    raise NotImplementedError(f"the te backend has no mapping for catalog op '{name}'")


def render_call(callee, args, kwargs):
    """Python source of a recipe's constructor call."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{callee}({', '.join(parts)})"


# ----------------------------------------------------------------------------------------
# Parameters: the model's layout (ops.md) <-> TE's parameters. Duck-typed on the op
# objects, so they import nothing and exported scripts embed them as they are.


def param_groups(op, name):
    """TE's parameters per model parameter: [[tensors], ...]; one tensor, or one per group
    (GroupedLinear's weight0..weightG-1 and bias0..biasG-1, grouped_linear.py:
    GroupedLinear.__init__; with single_grouped_weight/bias one GroupedTensor "weight"/"bias"
    of shape [G, out, in] / [G, out], grouped_linear.py: make_grouped_weights,
    _make_grouped_biases_from_packed)."""
    if name in ("Linear", "RMSNorm"):
        return [[op.weight]]
    if name == "Bias":
        return [[op.bias]]
    if name == "LayerNorm":
        return [[op.weight], [op.bias]]
    if name == "GroupedLinear":
        if op.single_grouped_weight:
            groups = [[op.weight]]
        else:
            groups = [[getattr(op, f"weight{g}") for g in range(op.num_groups)]]
        if op.has_bias:
            if op.single_grouped_bias:
                groups.append([op.bias])
            else:
                groups.append([getattr(op, f"bias{g}") for g in range(op.num_groups)])
        return groups
    return []


def _per_group(op, name, k):
    """Whether model parameter k is stored as one TE parameter per group (GroupedLinear's
    weight0.. / bias0..), so that values are split and gradients stacked along dim 0 (also
    for a single group)."""
    if name != "GroupedLinear":
        return False
    return not (op.single_grouped_weight if k == 0 else op.single_grouped_bias)


def _storage(t):
    """Where to write a parameter's values: a GroupedTensor's packed rowwise data viewed in
    its wrapper shape (as grouped_linear.py: _get_packed_bias_tensor and backward_dw read
    it), else the parameter itself."""
    data = getattr(t, "rowwise_data", None)
    return t if data is None else data.view(tuple(t.shape))


def copy_param_values(op, name, values):
    """Copies the model-layout `values` (on the op's device and dtype) into TE's parameters."""
    with torch.no_grad():
        for k, (tensors, value) in enumerate(zip(param_groups(op, name), values)):
            if _per_group(op, name, k):
                for g, t in enumerate(tensors):
                    t.copy_(value[g])
            else:
                _storage(tensors[0]).copy_(value.reshape(tuple(tensors[0].shape)))


def set_param_requires_grad(op, name, flags):
    for tensors, flag in zip(param_groups(op, name), flags):
        for t in tensors:
            t.requires_grad_(bool(flag))


def attach_main_grads(op, name):
    """accumulate_into_main_grad: what a Megatron-LM user does before backward, an fp32
    `main_grad` buffer on each weight (BasicLinear reads it in op_backward and
    GroupedLinear already in fuser_forward, through _common.py: get_main_grad_from_param;
    the wgrad GEMM accumulates into it, or overwrites with overwrite_main_grad)."""
    if not getattr(op, "_accumulate_into_main_grad", False):
        return
    for t in param_groups(op, name)[0]:
        t.main_grad = torch.zeros(tuple(t.shape), dtype=torch.float32, device=t.device)


def finish_weight_gradients(op):
    """delay_wgrad_compute: the user runs the delayed weight-gradient GEMMs after backward
    (grouped_linear.py: GroupedLinear.need_backward_dw / backward_dw, which set each
    weight's .grad, or accumulate into main_grad)."""
    if getattr(op, "need_backward_dw", None) is not None and op.need_backward_dw():
        op.backward_dw()


def param_leaves(op, name):
    """TE's parameters of the op that autograd should differentiate (those requiring grad)."""
    return [t for tensors in param_groups(op, name) for t in tensors if t.requires_grad]


def model_param_grads(op, name, autograd_grads):
    """Parameter gradients in the model's layout. `autograd_grads` maps id(parameter) to
    what torch.autograd.grad returned for it. A weight with accumulate_into_main_grad has
    its gradient in main_grad (the returned one is a dummy or None: _common.py:
    get_dummy_wgrads_for_params); with delay_wgrad_compute in .grad after backward_dw."""
    out = []
    for k, tensors in enumerate(param_groups(op, name)):
        grads = []
        for t in tensors:
            if not t.requires_grad:
                grads.append(None)
            elif k == 0 and getattr(op, "_accumulate_into_main_grad", False):
                grads.append(getattr(t, "main_grad", None))
            elif (
                k == 0
                and getattr(op, "need_backward_dw", None) is not None
                and op.need_backward_dw()
            ):
                grads.append(t.grad)
            else:
                grads.append(autograd_grads.get(id(t)))
        if any(g is None for g in grads):
            out.append(None)  # a group without its gradient: the whole tensor has none
        elif _per_group(op, name, k):
            out.append(torch.stack([g.reshape(tuple(t.shape)) for g, t in zip(grads, tensors)]))
        else:
            out.append(_storage(grads[0]).reshape(tuple(tensors[0].shape)))
    return out


# ----------------------------------------------------------------------------------------
# Fusion names: each registered fusion function is named after the fused op it builds


# Module-level fusion functions whose owning class their name does not show
# (ops/fused/grouped_mlp.py, registered at import when supported).
FUNCTION_OWNERS = {
    "fuse_glu_ops": "GroupedMLP_CuTeGEMMGLU",
    "fuse_unary_activation_ops": "GroupedMLP_CuTeGEMMUnary",
}
FUSION_PASSES = (
    ("forward_backward_fusion_functions", "joint"),
    ("forward_fusion_functions", "forward"),
    ("backward_fusion_functions", "backward"),
)


def fusion_name(func):
    """ "ForwardLinearBiasAdd" for ForwardLinearBiasAdd.fuse_forward_ops; our own fusion
    functions carry their name ("FusedResidual.joint")."""
    explicit = getattr(func, "gradfuzz_fusion_name", None)
    if explicit:
        return explicit
    parts = getattr(func, "__qualname__", repr(func)).split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        return parts[-2]  # the class whose (static) method it is
    return FUNCTION_OWNERS.get(parts[-1], parts[-1])


@contextlib.contextmanager
def only_fusions(operation_fuser, names):
    """Runs the body with OperationFuser's registration lists (fuser.py: class attributes
    forward_backward_fusion_functions, forward_fusion_functions, backward_fusion_functions,
    read by OperationFuser.maybe_fuse_ops at a fuser's first forward) narrowed to the
    fusions called `names`; restores them afterwards, also on error."""
    names = set(names)
    saved = {attr: getattr(operation_fuser, attr) for attr, _ in FUSION_PASSES}
    try:
        for attr, _ in FUSION_PASSES:
            setattr(operation_fuser, attr, [f for f in saved[attr] if fusion_name(f) in names])
        yield
    finally:
        for attr, funcs in saved.items():
            setattr(operation_fuser, attr, funcs)


# ----------------------------------------------------------------------------------------
# The ops TE lacks and the FusedResidual fusion, as a TE user writes them


def define_extensions(te):
    """The adapter's te.ops extensions, defined against the imported TE module `te`.

    Custom ops follow TE's own extra-tensor ops (ops/basic/make_extra_output.py,
    add_extra_input.py, swiglu.py: _ScaledGLU): class attributes num_extra_inputs /
    num_extra_outputs, the work in fuser_forward / fuser_backward, and, as TE's convention,
    an extra input's gradient computed when that tensor's requires_grad was set in forward.
    Output style "generator" hands the extra outputs (and, in backward, the extra-input
    gradients) back as a Python generator instead of a tuple.
    """

    def pack(style, tensors):
        """An op's extra outputs or extra-input gradients in its output style."""
        if style == "generator":
            return (t for t in tensors)
        return tuple(tensors)

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
        BasicOperation and unused by ops that override fuser_forward/fuser_backward."""

        def __init__(self, *, output_style="vector"):
            super().__init__()
            self.output_style = output_style

        def op_forward(self, *args, **kwargs):
            raise RuntimeError(f"{type(self).__name__} overrides fuser_forward, not op_forward")

        def op_backward(self, *args, **kwargs):
            raise RuntimeError(f"{type(self).__name__} overrides fuser_backward, not op_backward")

    class RowStat(CustomOp):
        """y = x; extra output: the mean of squares of each row [rows], a fresh tensor."""

        num_extra_outputs = 1

        def fuser_forward(
            self,
            basic_op_ctxs,
            input_,
            *,
            basic_op_extra_inputs,
            prev_op_grad_output_quantizer,
            next_op_input_quantizer,
            basic_op_kwargs,
        ):
            x = opmath(input_)
            stat = (x * x).mean(-1).to(input_.dtype)
            if basic_op_ctxs[0].requires_grad:
                # A detached alias, not input_ itself: input_ is also this op's output, so
                # the next op may save the same tensor and free it in its backward (e.g.
                # activation.py: _ActivationOperation.op_backward calls utils.py:
                # clear_tensor_data on it), which runs before this op's backward.
                basic_op_ctxs[0].save_for_backward(input_.detach())
            return input_, [pack(self.output_style, (stat,))]

        def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
            (grad_stat,) = basic_op_grad_extra_outputs[0]
            grad_input = grad_output
            if grad_stat is not None:
                (x,) = basic_op_ctxs[0].saved_tensors
                # grad_output [rows, n] + grad_stat [rows, 1] * 2 x [rows, n] / n
                grad_input = opmath(grad_output) + opmath(grad_stat).unsqueeze(-1) * (
                    2.0 / x.shape[-1]
                ) * opmath(x)
                grad_input = grad_input.to(grad_output.dtype)
            return grad_input, [()], [pack(self.output_style, ())]

    class DualExtraOutput(CustomOp):
        """y = x; extra outputs s0 * x and s1 * x."""

        num_extra_outputs = 2

        def __init__(self, s0, s1, *, output_style="vector"):
            super().__init__(output_style=output_style)
            self.s0 = s0
            self.s1 = s1

        def fuser_forward(
            self,
            basic_op_ctxs,
            input_,
            *,
            basic_op_extra_inputs,
            prev_op_grad_output_quantizer,
            next_op_input_quantizer,
            basic_op_kwargs,
        ):
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

        def fuser_forward(
            self,
            basic_op_ctxs,
            input_,
            *,
            basic_op_extra_inputs,
            prev_op_grad_output_quantizer,
            next_op_input_quantizer,
            basic_op_kwargs,
        ):
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

        def fuser_forward(
            self,
            basic_op_ctxs,
            input_,
            *,
            basic_op_extra_inputs,
            prev_op_grad_output_quantizer,
            next_op_input_quantizer,
            basic_op_kwargs,
        ):
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

        def fuser_forward(
            self,
            basic_op_ctxs,
            input_,
            *,
            basic_op_extra_inputs,
            prev_op_grad_output_quantizer,
            next_op_input_quantizer,
            basic_op_kwargs,
        ):
            if self.fusion_name == "FusedResidual.backward":
                raise RuntimeError("FusedResidual.backward is backward-only; its forward ran")
            producer, inner, consumer = self.basic_ops
            # The inner op runs its own forward and fills its own context. Its neighbours'
            # quantizers are what the fuser would pass it (fuser.py: prev_op/next_op).
            y, inner_extra_outputs = inner.fuser_forward(
                [basic_op_ctxs[1]],
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
        if any(op.is_fused_op for op in window):
            return False
        if not isinstance(producer, te.ops.MakeExtraOutput):
            return False
        if not isinstance(consumer, te.ops.AddExtraInput):
            return False
        if inner.num_extra_inputs or inner.num_extra_outputs:
            return False
        channel = producer._extra_output_channels[0]
        return channel is not None and consumer._extra_input_channels[0] == channel

    def fuse_residual(ops, fusion_name):
        out = []
        i = 0
        while i < len(ops):
            window = ops[i : i + 3]
            if len(window) == 3 and residual_pattern(window):
                producer, inner, consumer = window
                channel = producer._extra_output_channels[0]
                basic = [b for op in ops for b in (op.basic_ops if op.is_fused_op else [op])]
                consumed_elsewhere = any(
                    b is not consumer and channel in b._extra_input_channels for b in basic
                )
                returns_channel = producer._extra_output_to_caller[0] or consumed_elsewhere
                out.append(
                    FusedResidual(
                        producer,
                        inner,
                        consumer,
                        fusion_name=fusion_name,
                        returns_channel=returns_channel,
                    )
                )
                i += 3
            else:
                out.append(ops[i])
                i += 1
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
        """ops/__init__.py exports fuser.py's register_* functions."""
        te.ops.register_forward_fusion(fuse_residual_forward)
        te.ops.register_backward_fusion(fuse_residual_backward)
        te.ops.register_forward_backward_fusion(fuse_residual_joint)

    return types.SimpleNamespace(
        Boundary=Boundary,
        Dispatch=Dispatch,
        Combine=Combine,
        RowStat=RowStat,
        DualExtraOutput=DualExtraOutput,
        FusedResidual=FusedResidual,
        fuse_residual_forward=fuse_residual_forward,
        fuse_residual_backward=fuse_residual_backward,
        fuse_residual_joint=fuse_residual_joint,
        register_fusions=register_fusions,
    )


# ----------------------------------------------------------------------------------------
# TE's errors


# Errors that are TE declining a valid case (status "unsupported"), with where TE raises
# them. Anything else TE raises is an error of the path. NotImplementedError always counts.
UNSUPPORTED = (
    (
        r"Supported dtypes are float32, float16, bfloat16",
        "basic_linear.py: BasicLinear.__init__/_functional_forward, "
        "grouped_linear.py: GroupedLinear.__init__ (no float64 GEMMs)",
    ),
    (
        r"^Unsupported dtype \(",
        "activation.py: _ActivationOperation.op_forward, swiglu.py: SwiGLU.op_forward",
    ),
    (
        r"Single grouped parameters require the native grouped-tensor GroupedLinear path",
        "grouped_linear.py: GroupedLinear.fuser_forward (single_grouped_weight/bias need "
        "bf16/fp16 on sm90+ with cuBLASLt >= 13.4: is_op_fuser_grouped_tensor_path_supported)",
    ),
    (
        r"has requires_grad=(True|False), but expected requires_grad=",
        "grouped_linear.py: GroupedLinear.pre_first_fuser_forward (every weight and bias of "
        "one GroupedLinear must share requires_grad)",
    ),
    (
        # Seen on the H200 with TE 2.20.2 (the common library's source is not in the wheels):
        # "Assertion failed: glu_interleave_size % 32 == 0. nvte_scaled_swiglu: nonzero
        # glu_interleave_size must be a multiple of 32."
        r"glu_interleave_size must be a multiple of 32",
        "common/activation/scaled_activation.cu: check_gated_forward_tensors "
        "(ScaledSwiGLU's kernel; SwiGLU deinterleaves in Python and takes any size)",
    ),
    (
        r"does not support activation recomputation in the fused grouped MLP",
        "swiglu.py: _ScaledGLU.__init__ (activation_recompute_in_mlp=True)",
    ),
    (
        r"\(activation_recompute_in_mlp=True\) requires the fused grouped MLP path",
        "swiglu.py: _ScaledGLU.fuser_forward",
    ),
)

# TE's messages -> runtime error kinds (ops/errors.h), checked in order.
KINDS = (
    (r"has multiple producers", "duplicate-producer"),  # fuser.py: OperationFuser.__init__
    (r"has no earlier producer", "producer-not-earlier"),  # fuser.py: OperationFuser.__init__
    (r"has no producer", "missing-producer"),  # fuser.py: OperationFuser.__init__
    (r"Cannot change extra tensor channels", "locked"),  # op.py: _check_..._unlocked
    (r"Expected \d+ extra inputs but got \d+", "extra-input-count"),  # fuser.py: __call__
    (r"Extra (input|output) index -?\d+ is out of range", "slot-out-of-range"),  # op.py: set_*
    (r"Extra (input|output) channel must be a non-empty string", "invalid-channel-name"),
    (r"Expected op \d+ to generate \d+ extra outputs", "extra-count"),  # fuser.py: forward
    (r"to generate extra outputs for \d+ basic operations", "extra-count"),
    (r"Expected op \d+ to generate grads for \d+ extra inputs", "extra-count"),  # backward
    (r"Expected grads for \d+ extra tensor outputs", "extra-count"),
    (r"Expected op \d+ to generate \d+ param grads", "extra-count"),
    (r"is public, but \w+ returned None", "public-output-returned-none"),  # fuser.py: forward
    (r"required by an operation outside its forward fusion", "needed-outside-its-fusion"),
    (r"Found mismatch after fusing", "plan-mismatch"),  # fuser.py: _map_to_basic_ops
    # Review finding 2: fuser.py applies len() and indexing to an op's extra outputs.
    (r"object of type 'generator' has no len\(\)", "generator-misuse"),
    (r"'generator' object is not subscriptable", "generator-misuse"),
    # Wrong tensor arguments (the C++ ops' InvalidArgumentError).
    (r"Expected \d+ splits, but got \d+", "invalid-argument"),  # grouped_linear.py
    (r"split_with_sizes expects split_sizes to sum exactly", "invalid-argument"),  # torch.split
    (r"scaled d?activation expects one scale per input row", "invalid-argument"),  # csrc
    (
        r"Input tensor \(shape=.*\) and weight tensor \(shape=.*\) are not compatible",
        "invalid-argument",
    ),  # rmsnorm.py, layer_norm.py: op_forward
    (r"The size of tensor a \(\d+\) must match the size of tensor b", "invalid-argument"),
    (r"Invalid matrix dimensions for GEMM", "invalid-argument"),  # csrc/extensions/gemm.cpp
)


# What TE raises for each error kind a case can expect: exception types and a message
# pattern for the exported scripts' pytest.raises (None: any message of those types).
RAISES = {
    "duplicate-producer": (("ValueError",), r"has multiple producers"),
    "missing-producer": (("ValueError",), r"has no producer"),
    "producer-not-earlier": (("ValueError",), r"has no earlier producer"),
    "extra-input-count": (("ValueError",), r"Expected \d+ extra inputs but got \d+"),
    "slot-out-of-range": (("IndexError",), r"is out of range"),
    "invalid-channel-name": (("ValueError",), r"channel must be a non-empty string"),
    "locked": (("RuntimeError",), r"Cannot change extra tensor channels"),
    "extra-count": (("RuntimeError",), r"Expected .* to generate"),
    "invalid-argument": (("ValueError", "RuntimeError"), None),
}


def classify(exc):
    """("unsupported", reason) for a documented TE limit, else ("error", kind)."""
    if isinstance(exc, NotImplementedError):
        return "unsupported", "NotImplementedError"
    if isinstance(exc, GradfuzzError):
        return "error", exc.kind
    message = str(exc)
    for pattern, where in UNSUPPORTED:
        if re.search(pattern, message):
            return "unsupported", where
    for pattern, kind in KINDS:
        if re.search(pattern, message):
            return "error", kind
    return "error", "unrecognized"


# ----------------------------------------------------------------------------------------
# The backend


def te_options(single_grouped_params=True):
    """Per catalog op: the options the generator draws for TE (catalog attrs and TE's own
    constructor options, with the values that keep a case valid for TE).
    `single_grouped_params`: whether this machine runs GroupedLinear's single grouped
    weight/bias (else only 0 is drawn for them)."""
    # cache_quantized_input=1 keeps the activation's input for backward as FP8 E4M3
    # (activation.py: _ActivationOperation.op_forward, swiglu.py: SwiGLU.op_forward): the
    # gradients then carry FP8 rounding that no float64 reference means (measured on the H200:
    # GELU's input gradient 0.840 against 0.886). A documented difference (docs/TE.md), not
    # drawn.
    activation = {"cache_quantized_input": [0]}
    single = [0, 1] if single_grouped_params else [0]
    return {
        "Linear": {"accumulate_into_main_grad": [0, 1]},
        "ReLU": activation,
        "GELU": activation,
        "SReLU": activation,
        # SwiGLU deinterleaves in Python (swiglu.py: SwiGLU.op_forward): any block size.
        "SwiGLU": dict(activation, interleave=[0, 1, 2, 4]),
        # ScaledSwiGLU's kernel takes multiples of 32 only (see UNSUPPORTED); and
        # swiglu.py: _ScaledGLU.__init__ rejects activation_recompute_in_mlp=True ("Must be
        # False" in ScaledSwiGLU's docstring), so only 0 is drawn.
        "ScaledSwiGLU": {"interleave": [0, 32], "activation_recompute_in_mlp": [0]},
        "ScaledSReLU": {"activation_recompute_in_mlp": [0, 1]},
        "MakeExtraOutput": {"in_place": [0, 1]},
        "AddExtraInput": {"in_place": [0, 1]},
        "GroupedLinear": {
            "bias": [0, 1],
            "scale_bias": [0, 1],
            "accumulate_into_main_grad": [0, 1],
            "single_grouped_weight": single,
            "single_grouped_bias": single,
            "delay_wgrad_compute": [0, 1],
        },
        "RMSNorm": {"zero_centered_gamma": [0, 1], "sm_margin": [0, 1]},
        "LayerNorm": {"zero_centered_gamma": [0, 1], "sm_margin": [0, 1]},
    }


TE_CLASSES = {
    "Linear": "te.ops.BasicLinear",
    "Bias": "te.ops.Bias",
    "ConstantScale": "te.ops.ConstantScale",
    "ReLU": "te.ops.ReLU",
    "GELU": "te.ops.GELU",
    "SReLU": "te.ops.SReLU",
    "SwiGLU": "te.ops.SwiGLU",
    "ScaledSwiGLU": "te.ops.ScaledSwiGLU",
    "ScaledSReLU": "te.ops.ScaledSReLU",
    "MakeExtraOutput": "te.ops.MakeExtraOutput",
    "AddExtraInput": "te.ops.AddExtraInput",
    "GroupedLinear": "te.ops.GroupedLinear",
    "RMSNorm": "te.ops.RMSNorm",
    "LayerNorm": "te.ops.LayerNorm",
    "Reshape": "te.ops.Reshape",
    "Identity": "te.ops.Identity",
}


class TEBuilder(Builder):
    """Driver hooks for te.ops. Each path builds fresh ops and a fresh Sequential (TE ops
    and fusers keep state); per-path state lives in self.path."""

    name = "te"

    def __init__(self, te, ext, operation_fuser, device=None):
        self.te = te
        self.ext = ext
        self.operation_fuser = operation_fuser
        self.fixed_device = device
        self.path = None

    def device(self, case):
        if self.fixed_device is not None:
            return torch.device(self.fixed_device)
        return torch.device("cuda", torch.cuda.current_device())

    @contextlib.contextmanager
    def fusion_scope(self, fusions):
        self.path = types.SimpleNamespace(names={}, channel_grads=None, dtype=None)
        with only_fusions(self.operation_fuser, fusions):
            yield

    def _resolve(self, callee):
        if callee.startswith("te."):
            target = self.te
            for part in callee.split(".")[1:]:
                target = getattr(target, part)
            return target
        return getattr(self.ext, callee)

    def create_op(self, op_case, case, device):
        callee, args, kwargs = op_recipe(
            op_case.name, op_case.attrs, op_case.input_shape, op_case.output_style
        )
        values = {DEVICE: device, DTYPE: case.dtype}
        kwargs = {k: values.get(v, v) if isinstance(v, Symbol) else v for k, v in kwargs.items()}
        op = self._resolve(callee)(*args, **kwargs)
        params = [p.to(device=device, dtype=case.dtype) for p in op_case.params]
        copy_param_values(op, op_case.name, params)
        set_param_requires_grad(op, op_case.name, op_case.param_requires_grad)
        attach_main_grads(op, op_case.name)
        self.path.names[id(op)] = op_case.name
        return op

    def make_boundary(self):
        return self.ext.Boundary()

    def call_standalone(self, op, x, extras):
        op(x, *extras)  # op.py: BasicOperation.forward builds a transient OperationFuser

    def bind_input(self, op, slot, channel):
        op.set_extra_input_channel(slot, channel)  # op.py: BasicOperation.set_extra_input_channel

    def bind_output(self, op, slot, channel, output_to_caller):
        op.set_extra_output_channel(slot, channel, output_to_caller=output_to_caller)

    def is_locked(self, op):
        return bool(getattr(op, "_extra_tensor_channels_locked", False))  # op.py: __init__

    def make_sequential(self, modules):
        return self.te.ops.Sequential(*modules)

    def forward(self, seq, x, extras):
        out = seq(x, *extras)
        return list(out) if isinstance(out, tuple) else [out]

    def _fusers(self, seq):
        """The OperationFusers te.ops.Sequential built at its first forward
        (sequential.py: Sequential._module_groups)."""
        groups = getattr(seq, "_module_groups", None) or []
        return [g for g in groups if isinstance(g, self.operation_fuser)]

    def _returned_twice(self, seq, outputs):
        """Per fuser, the (op, slot) public extra outputs whose tensor the fuser returned more
        than once (as its main output too, or as another public extra output): TE returns
        the very tensor again (fuser.py: _OperationFuserAutogradFunction.forward, `return
        x, *extra_outputs_flat`; MakeExtraOutput hands back its input), and PyTorch then
        delivers the cotangents of all those outputs to the last of them, so no such slot
        receives its own gradient."""
        groups = getattr(seq, "_module_groups", None) or []
        extras = iter(outputs[1:])
        out = []
        for k, group in enumerate(groups):
            if not isinstance(group, self.operation_fuser):
                continue
            after = groups[k + 1] if k + 1 < len(groups) else None
            main = getattr(after, "last_input", None) if after is not None else outputs[0]
            slots = list(group._public_extra_output_slots)  # fuser.py: OperationFuser.__init__
            public = [next(extras, None) for _ in slots]
            returned = [main] + public
            twice = {
                slot
                for slot, t in zip(slots, public)
                if t is not None and sum(r is t for r in returned) > 1
            }
            out.append(twice)
        return out

    def after_forward(self, seq, case, ops, outputs):
        """Observes the gradient each channel producer's slot receives: the fuser sums the
        caller's gradient and every consumer's into basic_op_grad_extra_outputs before the
        producer's backward group runs (fuser.py: _OperationFuserAutogradFunction.backward).
        That total is visible only where the producer's group contains none of the
        channel's consumers (a fused op owning both ends applies it internally), and where
        the slot's tensor was not returned twice (see _returned_twice)."""
        recorded = [dict() for _ in case.fusers]
        self.path.channel_grads = recorded
        returned_twice = self._returned_twice(seq, outputs)
        for f, (fuser, members) in enumerate(zip(self._fusers(seq), case.fusers)):
            twice = returned_twice[f] if f < len(returned_twice) else set()
            for op, idxs in fuser._backward_ops:
                records = []
                for p in idxs:
                    kinds = case.ops[members[p]].extra_output_kinds
                    for s, channel in enumerate(fuser._basic_op_extra_output_channels[p]):
                        if channel is None or kinds[s] != "float" or (p, s) in twice:
                            continue
                        if any(c in idxs for c in fuser._basic_op_extra_output_consumers[p][s]):
                            continue
                        records.append((idxs.index(p), s, channel))
                if records:
                    self._observe(op, records, recorded[f])

    @staticmethod
    def _observe(op, records, store):
        original = op.fuser_backward

        def observed(basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
            for k, s, channel in records:
                grad = basic_op_grad_extra_outputs[k][s]
                if grad is not None:
                    # A copy: MakeExtraOutput(in_place) adds into this tensor afterwards.
                    store[channel] = grad.detach().clone()
            return original(
                basic_op_ctxs, grad_output, basic_op_grad_extra_outputs=basic_op_grad_extra_outputs
            )

        op.fuser_backward = observed

    def param_leaves(self, op, op_case):
        return param_leaves(op, op_case.name)

    def param_grads(self, op, op_case, leaf_grads):
        leaves = param_leaves(op, op_case.name)
        return model_param_grads(op, op_case.name, {id(t): g for t, g in zip(leaves, leaf_grads)})

    def after_backward(self, ops):
        for op in ops:
            if op is not None and hasattr(op, "need_backward_dw"):
                finish_weight_gradients(op)

    def recorded_channel_grads(self, case):
        return self.path.channel_grads

    def plans(self, seq, case, ops):
        out = []
        for fuser, members in zip(self._fusers(seq), case.fusers):
            entry = {}
            for key, attr in (("forward", "_forward_ops"), ("backward", "_backward_ops")):
                groups = []
                for op, idxs in getattr(fuser, attr, None) or []:
                    fused = bool(op.is_fused_op)
                    name = (
                        getattr(op, "fusion_name", type(op).__name__)
                        if fused
                        else case.ops[members[idxs[0]]].name
                    )
                    groups.append(
                        {
                            "name": name,
                            "begin": members[idxs[0]],
                            "end": members[idxs[-1]] + 1,
                            "fused": fused,
                        }
                    )
                entry[key] = groups
            out.append(entry)
        return out

    def classify(self, exc):
        return classify(exc)

    def left_locked(self, seq, ops, locked_before, phase):
        # te.ops.Sequential builds its fusers at the first forward (lazy_fuser_construction);
        # _make_module_groups constructs them in order and each OperationFuser.__init__ locks
        # its ops once it validated, so a later fuser's routing error leaves the earlier
        # fusers' ops locked. _module_groups stays None when that happened.
        if phase != "forward" or seq is None or getattr(seq, "_module_groups", None) is not None:
            return []
        return [
            i
            for i, op in enumerate(ops)
            if op is not None
            and self.is_locked(op)
            and not locked_before[i]
            and isinstance(op, self.te.ops.BasicOperation)
        ]


class TEBackend:
    name = "te"

    def __init__(self, device=None):
        """`device`: where te.ops run, CUDA's current device unless given (the tests run TE's
        Python code on the CPU over a stubbed extension; see tests/te_stub.py)."""
        # grouped_linear.py: GroupedLinear.__init__ honours single_grouped_weight/bias only
        # when this variable is set (utils.py: resolve_grouped_linear_single_param_flags);
        # the option is a dimension of the case, so it is set for the whole process.
        os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
        import transformer_engine
        import transformer_engine.pytorch as te
        from transformer_engine.pytorch.ops.fuser import OperationFuser

        self.te = te
        self.te_version = getattr(transformer_engine, "__version__", "unknown")
        self.ext = define_extensions(te)
        self.ext.register_fusions()
        self.operation_fuser = OperationFuser
        self.builder = TEBuilder(te, self.ext, OperationFuser, device)

    def fusions(self):
        out = []
        for attr, pass_name in FUSION_PASSES:
            for func in getattr(self.operation_fuser, attr):
                name = fusion_name(func)
                if getattr(func, "gradfuzz_fusion_name", None):
                    implementation = "gradfuzz_adapter.te_backend.FusedResidual"
                else:
                    implementation = f"te.ops.fused.{name}"
                out.append({"name": name, "pass": pass_name, "implementation": implementation})
        return out

    def single_grouped_params(self):
        """Whether GroupedLinear's single grouped parameters run here: they need the
        grouped-tensor path (grouped_linear.py: GroupedLinear.fuser_forward raises
        otherwise), which grouped_linear.py: is_op_fuser_grouped_tensor_path_supported
        allows for bf16/fp16 on sm90+ with a recent enough cuBLASLt (not the H200 image of
        2026-11, whose cuBLASLt is older than 13.4)."""
        check = getattr(self.te.ops, "is_op_fuser_grouped_tensor_path_supported", None)
        if check is None or not torch.cuda.is_available():
            return False
        try:
            return any(check(None, dtype) for dtype in (torch.bfloat16, torch.float16))
        except Exception:  # noqa: BLE001 - it queries the device; no answer means no
            return False

    def hello(self):
        options = te_options(self.single_grouped_params())
        ops = {}
        for name, cls in TE_CLASSES.items():
            ops[name] = {
                "implementation": cls,
                "options": options.get(name, {}),
                "output_styles": ["vector"],
            }
        for name in CUSTOM_OPS:
            ops[name] = {
                "implementation": f"gradfuzz_adapter.te_backend.{name} (a te.ops.BasicOperation)",
                "options": {},
                "output_styles": ["vector", "generator"],
            }
        return {
            "backend": "te",
            "protocol": 1,
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformer_engine": self.te_version,
            },
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "capabilities": {
                "devices": ["cuda"],
                "dtypes": ["float32", "bfloat16", "float16"],
                "ops": ops,
                "fusions": self.fusions(),
                "deviations": ["surplus_extra_inputs_ignored", "lazy_fuser_construction"],
            },
        }

    def run(self, case, paths, tensors):
        return run_paths(self.builder, case, paths, tensors)
