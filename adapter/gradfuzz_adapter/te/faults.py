"""Planted faults in TransformerEngine (`gradfuzz selftest --backend te`; issue 13 item 5,
issue 14 item 5): each replaces one TE function or method at run time (faults.planted),
for one request, with a wrapper around TE's own code that has one defect of the kind fused
kernels have: a gradient dropped, summed twice or routed to the wrong slot, a wrong scale,
a bias missing in one pass, an FP8 format or scale misread. TE's files are never edited.

Each fault must show as a wrong value or a missing gradient on float32/bfloat16 cases, not
as a crash. Where one fires:
- te-backward-linear-add-drops-extra-grad, te-forward-linear-scale-add-scale-twice,
  te-forward-linear-bias-add-drops-bias: the fusions that need in_place=True
  (MakeExtraOutput/AddExtraInput), whose cases tend to carry a known in-place finding;
- te-make-extra-output-grad-summed-twice, te-add-extra-input-grad-to-main-input: the
  channel ops themselves (unfused), te-backward-activation-bias-dbias-doubled: only under
  a recipe (the fusion needs the linear's grad_output quantizer);
- te-fuser-drops-consumer-grads, te-fuser-backward-boundary-off-by-one: OperationFuser's
  routing, in every case with a consumed channel / an input that requires grad;
- the te-fp8-* faults: Python-level quantization (quantized_tensor.py: Quantizer.quantize,
  the entry of every quantizer call in basic_linear.py / grouped_linear.py; casts done
  inside fused kernels bypass it) and DelayedScaling's update (from the second call on).
  te-fp8-columnwise-copy-off-by-one-code, te-fp8-block-columnwise-one-code-off,
  te-fp8-codes-rounded-toward-zero and te-fp8-dequantize-scale-inv-bf16 keep every value
  within FP8 error: the checks of each
  quantized tensor (invariants.py, issue 26 item 2) see them, the value oracle need not.
- te-backward-activation-bias-columnwise-one-code-off: the fused BackwardActivationBias's
  own cast (a fused kernel, not Quantizer.quantize), under DelayedScaling or current
  scaling, where a Linear, a Bias and GELU or ReLU follow each other; within FP8 error,
  only the check of what an op hands on (invariants.py: record_handed_on) sees it.

- te-reduce-scatter-wrong-shard, te-column-parallel-dgrad-not-all-reduced,
  te-all-reduce-backward-reduced: tensor parallelism (distributed cases of 2 ranks, one
  GPU each): the ReduceScatter op, a column-parallel BasicLinear's dgrad reduction (without
  sequence parallelism), the AllReduce op's backward. The same defects as torch_backend/faults.py's
  of the same names after the prefix, on TE's code.
- the te-usage-* faults: one step of the usage script each (docs/BACKENDS.md "Steps");
  te-usage-quantized-weight-stale-transpose-after-step only with quantized_params and an
  optimizer step (a quantized weight's second write), te-usage-history-len-change-zeroes-
  history only at a call that changes amax_history_len after calls that recorded amaxes,
  te-usage-recipe-off-call-computes-with-fp8-weight only at a call with the recipe off after
  quantized calls.

Targets are resolved when a fault is planted, so importing this module imports no TE.
"""

import torch

from ..faults import (
    Fault,
    eval_pass_keeps_graph,
    output_buffer_reused,
    recompute_as_eval_pass,
    wrap,
)

_E5M2_OVER_E4M3 = 57344.0 / 448.0


# ----------------------------------------------------------------------------------------
# Fused ops, basic ops and the fuser's routing


def _backward_linear_add_drops_extra_grad(original):
    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        # MakeExtraOutput is basic op 0 of the fusion: its extra output's gradient, which
        # the dgrad GEMM should accumulate into, is not handed over.
        dropped = [list(grads) for grads in basic_op_grad_extra_outputs]
        dropped[0][0] = None
        return original(self, basic_op_ctxs, grad_output, basic_op_grad_extra_outputs=dropped)

    return fuser_backward


def _forward_linear_scale_add_scale_twice(original):
    def fuser_forward(self, basic_op_ctxs, input_, **kwargs):
        scale_op = self.basic_ops[1]  # (linear, ConstantScale, AddExtraInput)
        scale = scale_op.scale
        scale_op.scale = scale * scale  # the GEMM's alpha squared; backward keeps `scale`
        try:
            return original(self, basic_op_ctxs, input_, **kwargs)
        finally:
            scale_op.scale = scale

    return fuser_forward


def _forward_linear_bias_add_drops_bias(original):
    def fuser_forward(self, basic_op_ctxs, input_, **kwargs):
        from transformer_engine.pytorch.ops.basic.basic_linear import BasicLinear

        gemm = vars(BasicLinear)["_functional_forward"]

        def without_bias(*args, **gemm_kwargs):
            gemm_kwargs["bias"] = None  # the GEMM epilogue forgets the bias
            return gemm.__func__(*args, **gemm_kwargs)

        BasicLinear._functional_forward = staticmethod(without_bias)
        try:
            return original(self, basic_op_ctxs, input_, **kwargs)
        finally:
            BasicLinear._functional_forward = gemm

    return fuser_forward


def _backward_activation_bias_dbias_doubled(original):
    def fuser_backward(self, basic_op_ctxs, grad_output, **kwargs):
        dx, grad_params, grad_extra_inputs = original(self, basic_op_ctxs, grad_output, **kwargs)
        (db,), activation_grads = grad_params  # basic ops (Bias, activation)
        return dx, [(db + db,), activation_grads], grad_extra_inputs

    return fuser_backward


def _make_extra_output_grad_summed_twice(original):
    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        grad_input, grad_params, grad_extra_inputs = original(
            self,
            basic_op_ctxs,
            grad_output,
            basic_op_grad_extra_outputs=basic_op_grad_extra_outputs,
        )
        if basic_op_grad_extra_outputs[0][0] is not None:
            grad_input = grad_input + grad_output  # the main gradient added a second time
        return grad_input, grad_params, grad_extra_inputs

    return fuser_backward


def _add_extra_input_grad_to_main_input(original):
    def fuser_backward(self, basic_op_ctxs, grad_output, **kwargs):
        original(self, basic_op_ctxs, grad_output, **kwargs)
        # The extra input's gradient lands in the main input's slot.
        return grad_output + grad_output, [()], [(None,)]

    return fuser_backward


def _fuser_drops_consumer_grads(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        # The routing table forgets every channel's consumers: their gradients are never
        # added to the producer's slot in backward (fuser.py:
        # _OperationFuserAutogradFunction.backward reads basic_op_extra_output_consumers).
        self._basic_op_extra_output_consumers = [
            [[] for _ in slots] for slots in self._basic_op_extra_output_consumers
        ]

    return __init__


def _fuser_backward_boundary_off_by_one(original):
    def maybe_fuse_ops(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # The backward boundary one op too late, where op 0 runs as its own group in both
        # passes (elsewhere the fused op would run on an op that saved nothing): op 0's
        # backward never runs, so the input and op 0's parameters get no gradient.
        if (
            self.first_op_requiring_backward == 0
            and self._num_basic_ops > 1
            and self._forward_ops[0][1] == [0]
            and self._backward_ops[0][1] == [0]
        ):
            self.first_op_requiring_backward = 1
        return result

    return maybe_fuse_ops


# ----------------------------------------------------------------------------------------
# Quantization


def _float8_storage():
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import (
        Float8TensorStorage,
    )

    return Float8TensorStorage


def _after_quantize(transform):
    """A Quantizer.quantize that applies `transform` to each per-tensor FP8 result."""

    def replace(original):
        def quantize(self, tensor, **kwargs):
            result = original(self, tensor, **kwargs)
            if isinstance(result, _float8_storage()):
                transform(result)
            return result

        return quantize

    return replace


def _read_e5m2_as_e4m3(result):
    from transformer_engine.pytorch.constants import DType  # mirrors tex.DType by value

    if int(result._fp8_dtype) == int(DType.kFloat8E5M2):
        result._fp8_dtype = DType.kFloat8E4M3


def _scale_inv_twice(result):
    if result._scale_inv is not None:
        result._scale_inv = result._scale_inv * result._scale_inv


def _transposed_copy_rowwise(result):
    data, transpose = result._data, result._transpose
    if data is not None and transpose is not None and not result._transpose_invalid:
        result._data = transpose.reshape(data.shape)  # same bytes count, wrong layout


_GRAD_SCALE = 2.0**-7


def _columnwise_one_code_off(result):
    """The first column-wise code below the format's largest magnitude moved one FP8 step
    away from zero (FP8 codes of one sign are ordered by magnitude in their low 7 bits)."""
    transpose = result._transpose
    if transpose is None or result._transpose_invalid or transpose.numel() == 0:
        return
    _first_code_one_step_up(transpose)


def _first_code_one_step_up(codes):
    """The first FP8 code (uint8) below the format's largest magnitude moved one FP8 step away
    from zero, in place (codes of one sign are ordered by magnitude in their low 7 bits)."""
    flat = codes.view(-1)
    below = ((flat & 0x7F) < 0x7E).nonzero()
    if below.numel():
        k = int(below[0])
        flat[k : k + 1] += 1


def _backward_activation_bias_columnwise_one_code_off(original):
    """BackwardActivationBias.fuser_backward whose FP8 input gradient (what the fused dact +
    dbias + cast kernel writes with the previous op's grad-output quantizer) has its
    column-wise copy one code off (_columnwise_one_code_off); the row-wise copy and the bias
    gradient stay right."""

    def fuser_backward(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if isinstance(result[0], _float8_storage()):
            with torch.no_grad():
                _columnwise_one_code_off(result[0])
        return result

    return fuser_backward


def _after_block_quantize(transform):
    """A Quantizer.quantize that applies `transform` to each block-scaled FP8 result."""

    def replace(original):
        def quantize(self, tensor, **kwargs):
            result = original(self, tensor, **kwargs)
            from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import (
                Float8BlockwiseQTensorStorage,
            )

            if isinstance(result, Float8BlockwiseQTensorStorage):
                transform(result)
            return result

        return quantize

    return replace


def _block_columnwise_one_code_off(result):
    """A block-scaled tensor's column-wise data (Float8BlockwiseQTensorStorage:
    _columnwise_data, [in, out] with the 128x1 or 128x128 block scales of its own layout)
    with its first code below the format's largest magnitude moved one FP8 step away from
    zero: the block layout's check sees it, a value within FP8 error need not."""
    data = getattr(result, "_columnwise_data", None)
    if data is None or data.numel() == 0 or not hasattr(result, "_is_2D_scaled"):
        return
    _first_code_one_step_up(data)


def _codes_rounded_toward_zero(original):
    """A Quantizer.quantize whose per-tensor FP8 codes are rounded toward zero: every code
    the cast rounded up in magnitude is moved one step back (the cast's multiplier taken as
    1/scale_inv), in the row-wise data and its transpose alike."""

    def quantize(self, tensor, **kwargs):
        result = original(self, tensor, **kwargs)
        data = getattr(result, "_data", None)
        if not isinstance(result, _float8_storage()) or data is None or data.numel() == 0:
            return result
        from transformer_engine.pytorch.constants import TE_DType_To_Torch

        with torch.no_grad():
            fp8 = TE_DType_To_Torch[result._fp8_dtype]
            scaled = tensor.detach().to(torch.float32).reshape(data.shape) / result._scale_inv
            up = data.view(fp8).to(torch.float32).abs() > scaled.abs()
            nonzero = (data & 0x7F) > 0
            data.copy_(torch.where(up & nonzero, data - 1, data))
            transpose = result._transpose
            if transpose is not None and not result._transpose_invalid:
                n = data.shape[-1] if data.dim() else 1
                transpose.copy_(data.reshape(-1, n).t().reshape(transpose.shape))
        return result

    return quantize


def _dequantize_scale_inv_bf16(original):
    def make(forward):
        def dequantize(ctx, tensor, dtype):
            scale_inv = tensor._scale_inv
            if scale_inv is None:
                return forward(ctx, tensor, dtype)
            tensor._scale_inv = scale_inv.to(torch.bfloat16).to(scale_inv.dtype)
            try:
                return forward(ctx, tensor, dtype)
            finally:
                tensor._scale_inv = scale_inv

        return dequantize

    return wrap(original, make)


def _dgrad_scaled_down(original):
    def make(functional_backward):
        def backward(*args, **kwargs):
            grad_input, grad_weight = functional_backward(*args, **kwargs)
            # A plain tensor only (a dgrad the previous op wants quantized is left alone); in
            # place, since a fused op that accumulates into its own buffer reads that one.
            if kwargs.get("with_quantized_compute") and type(grad_input) is torch.Tensor:
                with torch.no_grad():
                    grad_input.mul_(_GRAD_SCALE)
            return grad_input, grad_weight

        return backward

    return wrap(original, make)


def _delayed_forward_scale_e5m2_max(original):
    def make(update):
        def reduce_and_update_fp8_tensors(cls, forward=True):
            state = cls.quantization_state
            keys = [k for k in state.global_scale_buffer if cls.split_key_in_buffer(k)[0]]
            before = {k: [s.clone() for s in state.global_scale_buffer[k]] for k in keys}
            update(cls, forward)
            if not forward:
                return
            # Every forward scale the update changed is computed with E5M2's maximum.
            for key in keys:
                for scale, old in zip(state.global_scale_buffer[key], before[key]):
                    with torch.no_grad():
                        scale.copy_(torch.where(scale != old, scale * _E5M2_OVER_E4M3, scale))

        return reduce_and_update_fp8_tensors

    return wrap(original, make)


_OPS = "transformer_engine.pytorch.ops"
# ----------------------------------------------------------------------------------------
# Tensor parallelism (te.ops's communication ops and BasicLinear's tensor_parallel_mode)


def _reduce_scatter_wrong_shard(original):
    def op_forward(self, ctx, input_, prev_op_grad_output_quantizer, next_op_input_quantizer):
        # The row blocks rotated by one block: rank r receives the sum of block r+1.
        n = getattr(self, "process_group_size", 1)
        if n > 1 and input_.dim() > 0 and input_.shape[0] % n == 0:
            input_ = torch.roll(input_, shifts=-(input_.shape[0] // n), dims=0)
        return original(self, ctx, input_, prev_op_grad_output_quantizer, next_op_input_quantizer)

    return op_forward


def _column_dgrad_not_all_reduced(original):
    def make(backward):
        def faulty(*args, **kwargs):
            # basic_linear.py: _functional_backward all-reduces a column-parallel dgrad
            # (without sequence parallelism) after the dgrad GEMM; without the mode it
            # computes the same local GEMMs and leaves the sum out.
            if kwargs.get("tensor_parallel_mode") == "column" and not kwargs.get(
                "sequence_parallel"
            ):
                kwargs = dict(kwargs, tensor_parallel_mode=None)
            return backward(*args, **kwargs)

        return faulty

    return wrap(original, make)


def _all_reduce_backward_reduced(original):
    def op_backward(self, ctx, grad_output):
        dx, rest = original(self, ctx, grad_output)
        dx = dx.clone()
        if torch.distributed.get_world_size(self.process_group) > 1:
            torch.distributed.all_reduce(dx, group=self.process_group)
        return dx, rest

    return op_backward


# ----------------------------------------------------------------------------------------
# The usage script's faults (issue "usage surface"): each reachable through one step.


def _linear_weight_of_first_call(original):
    """BasicLinear.op_forward computing with the weight values of its first call (the
    Parameter keeps its own values and gets its gradient): stale after an optimizer step."""

    def op_forward(self, ctx, input_, *args, **kwargs):
        cache = getattr(self, "_gradfuzz_fault_first_weight", None)
        if cache is None:
            self._gradfuzz_fault_first_weight = self.weight.detach().clone()
            return original(self, ctx, input_, *args, **kwargs)
        live = self.weight.data
        self.weight.data = cache
        try:
            return original(self, ctx, input_, *args, **kwargs)
        finally:
            self.weight.data = live

    return op_forward


def _deferred_reinitialised_at_first_forward(original):
    """BasicLinear.__init__ whose op, built on "meta", initialises its weight again at its
    first fuser forward whatever happened since (it goes by how it was built, not by where
    its weight is, as pre_first_fuser_forward should): the values a caller copied in after
    materialising the op are overwritten."""

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.weight.device.type != "meta":
            return
        first = self.pre_first_fuser_forward

        def pre_first_fuser_forward():
            first()
            self.reset_parameters()

        self.pre_first_fuser_forward = pre_first_fuser_forward

    return __init__


def _parameters_not_loaded(original):
    """BasicOperation._load_from_state_dict that loads the extra state (FP8 metadata) and
    returns without the base class's load: the fresh op keeps its own parameter values."""

    def load(self, *args, **kwargs):
        state_dict, prefix = args[0], args[1]
        key = prefix + torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX
        if key in state_dict:
            self.set_extra_state(state_dict[key])

    return load


def _backward_update_skipped(original):
    """FP8GlobalStateManager.reduce_and_update_fp8_tensors that skips the backward update:
    grad-output quantizers keep their scale and their amaxes pile up in history slot 0."""

    def make(update):
        def reduce_and_update_fp8_tensors(cls, forward=True):
            if forward:
                update(cls, forward)

        return reduce_and_update_fp8_tensors

    return wrap(original, make)


def _extra_state_not_loaded(original):
    """BasicOperation.set_extra_state that loads nothing: a checkpoint's FP8 metadata (scales,
    amax histories) never reaches the fresh op."""

    def set_extra_state(self, state):
        return None

    return set_extra_state


# The column-wise copy of each quantized storage class (float8_tensor_storage.py: the
# transpose cache; the block-scaled and MXFP8 storages: column-wise data and scales).
_COLUMNWISE = ("_transpose", "_columnwise_data", "_columnwise_scale_inv")


def _quantized_write_leaves_columnwise(original):
    """QuantizedTensorStorage.quantize_ (a high-precision tensor written into a quantized one
    in place: QuantizedTensor's copy_, an optimizer's step) that updates the row-wise data
    but puts the column-wise copy back as it was before the write, still marked valid
    (NVIDIA/TransformerEngine#1596's kind). Every tensor's first write goes through
    unharmed, so a weight gets its initial values into both copies (quantized_params:
    copy_param_values at op creation); from its second on (set_params) the column-wise
    copy lags one write behind."""

    def quantize_(self, tensor, **kwargs):
        writes = getattr(self, "_gradfuzz_fault_writes", 0)
        self._gradfuzz_fault_writes = writes + 1
        if writes == 0:
            return original(self, tensor, **kwargs)
        kept = {}
        for name in _COLUMNWISE:
            t = getattr(self, name, None)
            if isinstance(t, torch.Tensor):
                kept[name] = t.detach().clone()
        transpose_invalid = getattr(self, "_transpose_invalid", None)
        result = original(self, tensor, **kwargs)
        with torch.no_grad():
            for name, old in kept.items():
                t = getattr(self, name, None)
                if isinstance(t, torch.Tensor) and t.shape == old.shape:
                    t.copy_(old)
        if transpose_invalid is not None:
            self._transpose_invalid = transpose_invalid
        return result

    return quantize_


def _history_len_change_zeroes_history(original):
    """BasicOperation.reset_recipe_state that, when a DelayedScaling recipe of the same type
    comes with another amax_history_len (its else-branch: the history truncated or padded
    with zeros), then zeroes the resized history: what the op recorded before is lost. In
    place, so the quantizers and the global amax buffers TE re-points at the new tensor
    see the zeros."""

    def reset_recipe_state(self, *, recipe):
        lengths = {}
        metas = getattr(self, "_fp8_metas", None)
        if recipe is not None and recipe.delayed() and metas is not None:
            for mode in ("forward", "backward"):
                meta = metas.get(mode)
                state = (meta or {}).get(_meta_key(mode))
                if state is not None and isinstance(recipe, type(state.recipe)):
                    lengths[mode] = (state, state.amax_history.size(0))
        original(self, recipe=recipe)
        metas = getattr(self, "_fp8_metas", None) or {}
        for mode, (state, length) in lengths.items():
            now = (metas.get(mode) or {}).get(_meta_key(mode))
            if now is state and state.amax_history.size(0) != length:
                with torch.no_grad():
                    state.amax_history.zero_()

    return reset_recipe_state


def _meta_key(mode):
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    return FP8GlobalStateManager.get_meta_tensor_key(forward=mode == "forward")


def _recipe_off_call_computes_with_fp8_weight(original):
    """BasicLinear.op_forward that, in a call with FP8 disabled after calls that quantized,
    computes with its weight cast to E4M3 and back (one scale, from the weight's amax), as a
    cached FP8 weight of the quantized calls would be: the call outside the autocast is off
    by FP8's error. Only a call outside the autocast after quantized calls has such a cache
    (TE's own defect there, te-ops-fp8-off-call-drops-delayed-scaling-state, is of the
    recipe state, so this one shows apart from it: in the call's values)."""

    def op_forward(self, ctx, input_, *args, **kwargs):
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager

        if FP8GlobalStateManager.is_fp8_enabled():
            self._gradfuzz_fault_quantized = True
            return original(self, ctx, input_, *args, **kwargs)
        weight = getattr(self, "weight", None)
        cached = getattr(self, "_gradfuzz_fault_quantized", False)
        if not cached or type(weight) is not torch.nn.Parameter:
            return original(self, ctx, input_, *args, **kwargs)
        live = weight.data
        weight.data = _e4m3_round_trip(live)
        try:
            return original(self, ctx, input_, *args, **kwargs)
        finally:
            weight.data = live

    return op_forward


def _e4m3_round_trip(w):
    """w cast to E4M3 with the scale 448 / amax(w) and back, in w's dtype."""
    with torch.no_grad():
        amax = w.abs().max().to(torch.float32)
        if not bool(amax > 0) or not bool(torch.isfinite(amax)):
            return w
        scale = 448.0 / amax
        codes = (w.to(torch.float32) * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return (codes.to(torch.float32) / scale).to(w.dtype)


FAULTS = {
    f.name: f
    for f in (
        Fault(
            "te-backward-linear-add-drops-extra-grad",
            "BackwardLinearAdd (MakeExtraOutput(in_place) + BasicLinear backward): the dgrad "
            "GEMM no longer accumulates into the extra output's gradient, so the gradient "
            "that reached MakeExtraOutput's extra output is dropped from grad_input",
            f"{_OPS}.fused.backward_linear_add.BackwardLinearAdd.fuser_backward",
            _backward_linear_add_drops_extra_grad,
        ),
        Fault(
            "te-forward-linear-scale-add-scale-twice",
            "ForwardLinearScaleAdd (BasicLinear + ConstantScale + AddExtraInput(in_place)): "
            "the GEMM's alpha is the scale squared, in forward only",
            f"{_OPS}.fused.forward_linear_scale_add.ForwardLinearScaleAdd.fuser_forward",
            _forward_linear_scale_add_scale_twice,
        ),
        Fault(
            "te-forward-linear-bias-add-drops-bias",
            "ForwardLinearBiasAdd (BasicLinear + Bias + AddExtraInput(in_place)): the GEMM "
            "epilogue forgets the bias in forward; the bias gradient is still computed",
            f"{_OPS}.fused.forward_linear_bias_add.ForwardLinearBiasAdd.fuser_forward",
            _forward_linear_bias_add_drops_bias,
        ),
        Fault(
            "te-backward-activation-bias-dbias-doubled",
            "BackwardActivationBias (fused dact + dbias + cast, under a recipe): the bias "
            "gradient is summed twice",
            f"{_OPS}.fused.backward_activation_bias.BackwardActivationBias.fuser_backward",
            _backward_activation_bias_dbias_doubled,
        ),
        Fault(
            "te-backward-activation-bias-columnwise-one-code-off",
            "BackwardActivationBias (fused dact + dbias + cast, under a per-tensor recipe): "
            "the FP8 gradient it hands the Linear before it has its column-wise copy one FP8 "
            "step off in one element: within FP8 error, only the check of what the fused op "
            "hands on sees it",
            f"{_OPS}.fused.backward_activation_bias.BackwardActivationBias.fuser_backward",
            _backward_activation_bias_columnwise_one_code_off,
        ),
        Fault(
            "te-make-extra-output-grad-summed-twice",
            "MakeExtraOutput: when its extra output has a gradient, grad_input adds the "
            "main gradient twice",
            f"{_OPS}.basic.make_extra_output.MakeExtraOutput.fuser_backward",
            _make_extra_output_grad_summed_twice,
        ),
        Fault(
            "te-add-extra-input-grad-to-main-input",
            "AddExtraInput: the extra input's gradient is routed into the main input's slot "
            "(grad_input twice the gradient, the extra input none)",
            f"{_OPS}.basic.add_extra_input.AddExtraInput.fuser_backward",
            _add_extra_input_grad_to_main_input,
        ),
        Fault(
            "te-fuser-drops-consumer-grads",
            "OperationFuser's routing forgets each channel's consumers, so their gradients "
            "never reach the producer's slot in backward",
            f"{_OPS}.fuser.OperationFuser.__init__",
            _fuser_drops_consumer_grads,
        ),
        Fault(
            "te-fuser-backward-boundary-off-by-one",
            "OperationFuser puts the first op requiring backward one op too late: op 0's "
            "backward never runs, so the input and op 0's parameters get no gradient",
            f"{_OPS}.fuser.OperationFuser.maybe_fuse_ops",
            _fuser_backward_boundary_off_by_one,
        ),
        Fault(
            "te-fp8-e5m2-grad-read-as-e4m3",
            "Under HYBRID, a quantized gradient's E5M2 bytes are read as E4M3 "
            "(NVIDIA/TransformerEngine#3342's kind): the backward GEMMs are garbled, the "
            "forward stays right",
            "transformer_engine.pytorch.quantized_tensor.Quantizer.quantize",
            _after_quantize(_read_e5m2_as_e4m3),
        ),
        Fault(
            "te-fp8-scale-inv-applied-twice",
            "A per-tensor FP8 tensor carries its scale inverse squared, so every GEMM on it "
            "is off by a factor 1/scale",
            "transformer_engine.pytorch.quantized_tensor.Quantizer.quantize",
            _after_quantize(_scale_inv_twice),
        ),
        Fault(
            "te-fp8-transposed-copy-read-rowwise",
            "The cast-transpose's transposed copy is used where the row-major data belongs "
            "(the same bytes with the row-major shape), wherever quantize made both",
            "transformer_engine.pytorch.quantized_tensor.Quantizer.quantize",
            _after_quantize(_transposed_copy_rowwise),
        ),
        Fault(
            "te-fp8-columnwise-copy-off-by-one-code",
            "A per-tensor FP8 tensor's transposed copy (_transpose, made with the row-wise "
            "data by the cast-transpose) has one code one FP8 step away from the row-wise "
            "one: the values stay within FP8 error, only the column-wise copy check sees it",
            "transformer_engine.pytorch.quantized_tensor.Quantizer.quantize",
            _after_quantize(_columnwise_one_code_off),
        ),
        Fault(
            "te-fp8-block-columnwise-one-code-off",
            "A block-scaled FP8 tensor's column-wise data (its own block layout: 128x1 blocks "
            "for 1D scaling, the row-wise 128x128 blocks transposed for 2D) has one code one "
            "FP8 step away from what its scale gives: only the block layout's check sees it",
            "transformer_engine.pytorch.quantized_tensor.Quantizer.quantize",
            _after_block_quantize(_block_columnwise_one_code_off),
        ),
        Fault(
            "te-fp8-codes-rounded-toward-zero",
            "Per-tensor FP8 casts round toward zero instead of to nearest even (row-wise "
            "data and transpose alike): every value within one FP8 step, only the codes "
            "check sees it",
            "transformer_engine.pytorch.quantized_tensor.Quantizer.quantize",
            _codes_rounded_toward_zero,
        ),
        Fault(
            "te-fp8-dequantize-scale-inv-bf16",
            "A per-tensor FP8 tensor's dequantize() multiplies by its scale inverse rounded "
            "to bfloat16 (relative error up to 2^-9, within FP8 error; none where the scale "
            "is a power of two): only the dequantize check sees it",
            "transformer_engine.pytorch.tensor.storage.float8_tensor_storage."
            "_FromFloat8Func.forward",
            _dequantize_scale_inv_bf16,
        ),
        Fault(
            "te-fp8-dgrad-scaled-down",
            "BasicLinear's quantized backward (with_quantized_compute): the dgrad GEMM's "
            "result scaled by 2^-7 while the weight gradient and the forward stay right (the "
            "size of NVIDIA/TransformerEngine#3342's error)",
            f"{_OPS}.basic.basic_linear.BasicLinear._functional_backward",
            _dgrad_scaled_down,
        ),
        Fault(
            "te-delayed-forward-scale-e5m2-max",
            "DelayedScaling's forward scale update uses E5M2's maximum 57344 instead of "
            "E4M3's 448: from the second call on, inputs and weights saturate",
            "transformer_engine.pytorch.quantization.FP8GlobalStateManager."
            "reduce_and_update_fp8_tensors",
            _delayed_forward_scale_e5m2_max,
        ),
        Fault(
            "te-fp8-backward-update-skipped",
            "DelayedScaling's backward amax and scale update never runs "
            "(FP8GlobalStateManager.reduce_and_update_fp8_tensors(forward=False) returns): "
            "grad-output scales stay put, their amaxes pile up in history slot 0",
            "transformer_engine.pytorch.quantization.FP8GlobalStateManager."
            "reduce_and_update_fp8_tensors",
            _backward_update_skipped,
        ),
        Fault(
            "te-usage-checkpoint-drops-fp8-state",
            "BasicOperation.set_extra_state loads nothing: after a checkpoint round trip the "
            "ops' delayed-scaling scales and amax histories are fresh ones",
            f"{_OPS}.op.BasicOperation.set_extra_state",
            _extra_state_not_loaded,
        ),
        Fault(
            "te-usage-stale-weights-after-step",
            "BasicLinear computes with the weight values of its first call (the Parameter "
            "keeps its own and gets its gradient): after an optimizer step writes the weight "
            "in place, the op's forward uses the old one",
            f"{_OPS}.basic.basic_linear.BasicLinear.op_forward",
            _linear_weight_of_first_call,
        ),
        Fault(
            "te-usage-deferred-init-reinitialised-at-first-forward",
            "A BasicLinear built on 'meta' initialises its weight again at its first fuser "
            "forward (it goes by how it was built, not by where its weight is): the values "
            "the caller copied in after materialising the op are overwritten",
            f"{_OPS}.basic.basic_linear.BasicLinear.__init__",
            _deferred_reinitialised_at_first_forward,
        ),
        Fault(
            "te-usage-quantized-weight-stale-transpose-after-step",
            "A high-precision tensor written in place into a quantized tensor (copy_ -> "
            "quantize_) updates its row-wise FP8 data but leaves its column-wise copy (the "
            "per-tensor transpose, the block-scaled column-wise data and scales) as it was, "
            "still marked valid (NVIDIA/TransformerEngine#1596's kind); each tensor's first "
            "write is right. Reached by quantized_params with an optimizer step: the weight's "
            "dgrad and wgrad GEMMs, and the held weight's column-wise copy, use the values "
            "before the step",
            "transformer_engine.pytorch.quantized_tensor.QuantizedTensorStorage.quantize_",
            _quantized_write_leaves_columnwise,
        ),
        Fault(
            "te-usage-history-len-change-zeroes-history",
            "When a DelayedScaling recipe of the same type comes with another "
            "amax_history_len, BasicOperation.reset_recipe_state replaces each amax history "
            "by zeros of the new length instead of keeping its first rows (or padding it): "
            "the amaxes recorded before are lost. Reached by a repeat call that changes "
            "amax_history_len",
            f"{_OPS}.op.BasicOperation.reset_recipe_state",
            _history_len_change_zeroes_history,
        ),
        Fault(
            "te-usage-recipe-off-call-computes-with-fp8-weight",
            "A call with FP8 disabled (outside the autocast) after quantized calls computes "
            "each Linear with its weight cast to E4M3 and back, as a cached FP8 weight would "
            "be: the call's values are off by FP8's error where they should be those of high "
            "precision",
            f"{_OPS}.basic.basic_linear.BasicLinear.op_forward",
            _recipe_off_call_computes_with_fp8_weight,
        ),
        Fault(
            "te-usage-checkpoint-params-not-loaded",
            "BasicOperation._load_from_state_dict loads the extra state and returns without "
            "the base class's load: a checkpoint's parameters never reach the fresh ops",
            f"{_OPS}.op.BasicOperation._load_from_state_dict",
            _parameters_not_loaded,
        ),
        Fault(
            "te-usage-eval-pass-keeps-graph",
            "te.ops.Sequential called with grad mode off runs with grad mode on: the "
            "evaluation pass hands the caller outputs with an autograd graph",
            f"{_OPS}.sequential.Sequential.forward",
            eval_pass_keeps_graph,
        ),
        Fault(
            "te-usage-output-buffer-reused",
            "te.ops.Sequential writes each call's main output into the tensor it returned at "
            "the previous call (a reused output buffer): what the caller holds changes",
            f"{_OPS}.sequential.Sequential.forward",
            output_buffer_reused,
        ),
        Fault(
            "te-usage-recompute-as-eval-pass",
            "The forward that activation recompute runs inside the backward runs with grad "
            "mode off (taken for an evaluation pass): it saves nothing for backward",
            f"{_OPS}.sequential.Sequential.forward",
            recompute_as_eval_pass,
        ),
        Fault(
            "te-reduce-scatter-wrong-shard",
            "te.ops.ReduceScatter sums the ranks' summands but hands rank r the rows of rank "
            "r+1 (its input's row blocks rotated by one block)",
            f"{_OPS}.basic.reduce_scatter.ReduceScatter.op_forward",
            _reduce_scatter_wrong_shard,
            world_size=2,
        ),
        Fault(
            "te-column-parallel-dgrad-not-all-reduced",
            "A column-parallel BasicLinear's input gradient is not all-reduced after the "
            "dgrad GEMM (without sequence parallelism): each rank keeps its own summand",
            f"{_OPS}.basic.basic_linear.BasicLinear._functional_backward",
            _column_dgrad_not_all_reduced,
            world_size=2,
        ),
        Fault(
            "te-all-reduce-backward-reduced",
            "te.ops.AllReduce's backward all-reduces the gradient as well (its unused "
            "reduce_in_backward=True taken at its word): N times the input gradient",
            f"{_OPS}.basic.all_reduce.AllReduce.op_backward",
            _all_reduce_backward_reduced,
            world_size=2,
        ),
    )
}
