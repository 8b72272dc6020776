"""The torch backend's planted faults (docs/BACKENDS.md Protocol 2 `fault`): defects of the
kinds FP8 kernels have, planted in the recipe emulation (fp8.py) so that `gradfuzz
selftest --backend torch` shows on the CPU that the quantization-aware oracle finds them.
Most are te/faults.py's TE fault of the same name after the prefix, on the emulation
(not torch-fp8-block-columnwise-from-rowwise, which TE's Python layer cannot host: TE
makes both block copies in one cast kernel).

The distributed ones are planted in the ranks' communication (collectives.py), in every
rank process of a case: defects of the kind tensor-parallel code has (a collective that
hands a rank another rank's slice, a reduction left out or done twice), and two that take a
rank down (killed, or hanging in a collective) so that the harness shows it turns a lost
rank into that case's finding and leaves no process behind.
"""

import os
import signal
import time

import torch

from ..faults import (
    Fault,
    eval_pass_keeps_graph,
    output_buffer_reused,
    plant_from_environment,
    recompute_as_eval_pass,
    wrap,
)
from . import fp8
from .collectives import WORLD, all_reduce_sum

_E5M2_OVER_E4M3 = 57344.0 / 448.0
# The size of NVIDIA/TransformerEngine#3342's error: gradients scaled down by up to 2^-7.
_GRAD_SCALE = 2.0**-7


def _e5m2_read_as_e4m3(original):
    """cast_to_fp8 whose E5M2 result is handed on as E4M3 bytes (the same bits)."""

    def cast_to_fp8(x, scale, fmt):
        q = original(x, scale, fmt)
        if q.dtype == torch.float8_e5m2:
            return q.view(torch.uint8).view(torch.float8_e4m3fn)
        return q

    return cast_to_fp8


def _scale_inv_twice(original):
    def dequantize(q, scale):
        once = original(q, scale)
        return once * torch.reciprocal(scale.to(torch.float32)).to(torch.float64)

    return dequantize


def _transposed_copy_rowwise(original):
    def rowwise(self):
        # The column-wise copy's memory ([n, m], contiguous) read with the row-wise shape.
        return self.data_t.reshape(self.data.shape)

    return rowwise


def _dgrad_scaled_down(original):
    def make(backward):
        def faulty(ctx, grad_output):
            grad_input, grad_weight, *rest = backward(ctx, grad_output)
            return grad_input * _GRAD_SCALE, grad_weight, *rest

        return faulty

    return wrap(original, make)


def _alpha_dropped(original):
    """backward_gemm_alpha that returns the GEMMs' results without their alpha: a fused
    BackwardLinearScale loses the ConstantScale's factor from both gradients."""

    def backward_gemm_alpha(grad_input, grad_weight, alpha):
        return grad_input, grad_weight

    return backward_gemm_alpha


def _grouped_linear_ignores_override(original):
    """OpQuantization.__init__ whose GroupedLinear groups drop the recipe's backward_override:
    the forward is unchanged, the backward the fully quantized one (FP8 saved operands, dy
    quantized per group, the next op's cast of dy), as te.ops.GroupedLinear does in TE 2.20.2
    (adapter/tests/probe_te_open.py: its gradients under an override equal, bit for bit,
    those without one)."""

    def make(init):
        def faulty(self, name, attrs, recipe):
            init(self, name, attrs, recipe)
            if name == "GroupedLinear":
                for quantizers in self.linear:
                    quantizers.backward_override = None

        return faulty

    return wrap(original, make)


def _forward_scale_with_e5m2_max(original):
    def make(update):
        def faulty(self):
            before = self.scale.clone()
            update(self)
            if self.role != "grad_output" and not torch.equal(self.scale, before):
                self.scale = self.scale * _E5M2_OVER_E4M3

        return faulty

    return wrap(original, make)


def _wrong_shard(original):
    """reduce_scatter_rows that sums the right summands but hands rank r the rows of rank
    r+1 (mod N): the row blocks are rotated by one block before the reduction."""

    def reduce_scatter_rows(x):
        if WORLD.size > 1 and x.shape[0] % WORLD.size == 0:
            x = torch.roll(x, shifts=-(x.shape[0] // WORLD.size), dims=0)
        return original(x)

    return reduce_scatter_rows


def _dgrad_not_reduced(original):
    """column_parallel_grad_input that leaves out the sum over the ranks: each rank keeps
    its own summand of the dgrad (with sequence parallelism, its rows of it)."""

    def column_parallel_grad_input(grad_input, sequence_parallel):
        if not sequence_parallel or WORLD.size == 1:
            return grad_input.clone()
        rows = grad_input.shape[0] // WORLD.size
        return grad_input[WORLD.rank * rows : (WORLD.rank + 1) * rows].clone()

    return column_parallel_grad_input


def _all_reduce_backward_reduced(original):
    """AllReduce's backward that all-reduces the gradient too (TE's unused
    reduce_in_backward=True taken at its word): every rank's dx is N times dy."""

    def all_reduce_backward(grad_output):
        return all_reduce_sum(original(grad_output))

    return all_reduce_backward


def _on_rank_one(action):
    """all_gather_rows that, on rank 1, does `action` before communicating."""

    def make(original):
        def all_gather_rows(x):
            if WORLD.rank == 1:
                action()
            return original(x)

        return all_gather_rows

    return make


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _hang():
    time.sleep(3600)


# ----------------------------------------------------------------------------------------
# The usage script's faults (issue "usage surface"): each reachable through one step.


def _weights_cached_at_first_call(original):
    """BasicOp.forward with the parameter values of its first call in a Sequential kept and
    used from then on (gradients still reach the parameters): stale after an optimizer step."""

    def forward(self, x, extra_inputs):
        if not self.locked or not self.params:
            return original(self, x, extra_inputs)
        cache = getattr(self, "_fault_first_values", None)
        if cache is None:
            cache = self._fault_first_values = [p.detach().clone() for p in self.params]
        live = self.params
        self.params = [c + (p - p.detach()) for c, p in zip(cache, live)]
        try:
            return original(self, x, extra_inputs)
        finally:
            self.params = live

    return forward


def _last_param_not_loaded(original):
    """BasicOp.load_state_dict that leaves the op's last parameter (a bias, a beta) as the
    fresh op holds it, where the op has more than one."""

    def load_state_dict(self, state):
        kept = self.params[-1].detach().clone() if len(self.params) > 1 else None
        original(self, state)
        if kept is not None:
            with torch.no_grad():
                self.params[-1].copy_(kept)

    return load_state_dict


def _inference_copy_reused(original):
    """BasicOp.forward that, in an inference_mode pass, keeps a copy of its parameters and
    computes every later call with that copy (an inference tensor autograd cannot save)."""

    def forward(self, x, extra_inputs):
        if torch.is_inference_mode_enabled() and self.params:
            self._fault_inference_copy = [p.detach().clone() for p in self.params]
            return original(self, x, extra_inputs)
        copy = getattr(self, "_fault_inference_copy", None)
        if copy is None:
            return original(self, x, extra_inputs)
        live = self.params
        self.params = copy
        try:
            return original(self, x, extra_inputs)
        finally:
            self.params = live

    return forward


def _deferred_reinitialised_at_first_forward(original):
    """BasicOp.forward that initialises a deferred op's parameters again at its first call
    (it tells "not initialised yet" by how the op was built, not by where its parameters
    are), overwriting the values copied in after materialisation."""

    def forward(self, x, extra_inputs):
        if self.deferred and not getattr(self, "_fault_initialised", False):
            self._fault_initialised = True
            with torch.no_grad():
                for p, value in zip(self.params, self.initial_values(self.params, x.device)):
                    p.copy_(value)
        return original(self, x, extra_inputs)

    return forward


def _recipe_off_records_amax(original):
    """OpQuantization.apply that, in a call with the recipe off, still runs each Linear's
    input and weight through their delayed-scaling quantizers (their amaxes recorded into
    history slot 0) while it computes in high precision."""

    def apply(self, x, extras, params, attrs):
        if fp8.recipe_is_off() and self.name == "Linear" and self.linear:
            for q, t in ((self.linear[0].input, x), (self.linear[0].weight, params[0])):
                if q.delayed:
                    q(t)
        return original(self, x, extras, params, attrs)

    return apply


def _recipe_off_call_uses_fp8_weight(original):
    """OpQuantization.apply that, in a call with the recipe off after calls that quantized,
    computes each Linear with its weight as the quantized calls cast it (E4M3, the scale from
    the weight's amax): the high-precision call reads a stale FP8 weight cache, off by FP8's
    error in its output and its input's gradient (its weight's gradient does not read it)."""

    def apply(self, x, extras, params, attrs):
        if not (self.name == "Linear" and self.linear):
            return original(self, x, extras, params, attrs)
        if not fp8.recipe_is_off():
            self._fault_quantized = True
            return original(self, x, extras, params, attrs)
        if not getattr(self, "_fault_quantized", False):
            return original(self, x, extras, params, attrs)
        w = params[0]
        cached = fp8.current_scaling_qdq(w, "E4M3").to(w.dtype)
        # The cast values forward and into dgrad; the weight's gradient as without the cache.
        stale = w + (cached - w).detach()
        return original(self, x, extras, [stale, *params[1:]], attrs)

    return apply


def _history_len_change_zeroes(original):
    """DelayedQuantizer.resize_history that starts the new length from an empty history
    (the scale kept), as if the recipe's state were made afresh."""

    def resize_history(self, length):
        self.history = torch.zeros(length, dtype=self.history.dtype)

    return resize_history


def _transpose_kept_after_write(original):
    """OpQuantization.write_weight that, on a weight already quantized, makes the row-wise
    copy from the new values but keeps the column-wise copy of the old ones (the transpose
    cache not invalidated on an in-place write; TE issue #1596's kind)."""

    def write_weight(self, weight):
        old = self.quantized_weight
        q = original(self, weight)
        if old is not None:
            q.data_t = old.data_t
        return q

    return write_weight


def _dequantize_detached(original):
    """HeldQuantizedWeight.dequantize handing back the values without the parameter's
    autograd (a plain copy of the codes times the scale)."""

    def dequantize(self):
        return original(self).detach()

    return dequantize


def _forward_update_per_sequential(original):
    """TorchBuilder.forward that runs the autocast's forward delayed-scaling update at the
    exit of each Sequential of a chain (several_sequentials), over every op of the autocast,
    rather than once at the autocast's exit: the earlier Sequentials' ops update twice."""

    def forward(self, seq, x, extras):
        parts = getattr(seq, "parts", None)
        if parts is None or fp8.recipe_is_off():
            return original(self, seq, x, extras)
        quantizations = [
            m.quantization for m in seq.modules if getattr(m, "quantization", None) is not None
        ]
        outputs = []
        taken = 0
        for part, count in parts:
            if count is None:
                x = part(x)
                continue
            out = part(x, *extras[taken : taken + count])
            taken += count
            x, more = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
            outputs.extend(more)
            fp8.update_after_forward(quantizations)
        return [x, *outputs]

    return forward


# ----------------------------------------------------------------------------------------
# Delayed scaling's state (issue "FP8 state"): faults that keep every value within FP8's
# error, which only the state check (fp8_state.py) sees.


def _backward_update_skipped(original):
    """DelayedQuantizer.update that does nothing for a grad-output quantizer: the backward
    update never happens, the scale stays 1 and the recorded amaxes pile up in slot 0."""

    def make(update):
        def faulty(self):
            if self.role != "grad_output":
                update(self)

        return faulty

    return wrap(original, make)


def _scale_from_older_amaxes(original):
    """DelayedQuantizer.update whose scale comes from the history without slot 0 (the amax
    this step recorded), an off-by-one slot: the scale lags a step behind the tensors."""

    def make(update):
        def faulty(self):
            recorded = self.history[0].clone()
            self.history[0] = 0.0
            update(self)
            self.history[-1] = recorded

        return faulty

    return wrap(original, make)


def _delayed_state_not_loaded(original):
    """OpQuantization.load_state that loads nothing: after a checkpoint round trip the ops
    quantize with fresh delayed-scaling state (scale 1, an empty history)."""

    def load_state(self, state):
        return None

    return load_state


def _columnwise_one_code_off(result, scale, fmt):
    """`result`'s column-wise copy (a per-tensor quantization with `scale`) with its first
    element below the format's largest magnitude moved one FP8 step away from zero (the
    next code of the same sign)."""
    t = result.data_t
    if t.numel() == 0 or scale is None:
        return
    dtype, fp8_max = fp8.FORMATS[fmt]
    scale = scale.to(torch.float32)
    inv = torch.reciprocal(scale).to(torch.float64)
    codes = (t.reshape(-1) / inv).to(torch.float32).to(dtype)
    below = (codes.to(torch.float32).abs() < fp8_max).nonzero()
    if below.numel():
        k = int(below[0])
        bumped = (codes[k : k + 1].view(torch.uint8) + 1).view(dtype)
        flat = t.reshape(-1).clone()
        flat[k] = bumped.to(torch.float64)[0] * inv
        result.data_t = flat.reshape(t.shape)


def _columnwise_copy_off_by_one_code(original):
    """per_tensor_copies whose column-wise copy is one code off (_columnwise_one_code_off)."""

    def per_tensor_copies(data, scale, fmt):
        result = original(data, scale, fmt)
        _columnwise_one_code_off(result, scale, fmt)
        return result

    return per_tensor_copies


def _fused_gradient_cast_columnwise_off_by_one_code(original):
    """fused_gradient_cast whose per-tensor result has its column-wise copy one code off
    (_columnwise_one_code_off): the quantizers' own casts stay right."""

    def fused_gradient_cast(quantizer, grad):
        result = original(quantizer, grad)
        _columnwise_one_code_off(result, quantizer.scale_of(grad), quantizer.fmt)
        return result

    return fused_gradient_cast


def _codes_rounded_toward_zero(original):
    """cast_to_fp8 that rounds toward zero: every code the round-to-nearest-even cast made
    larger in magnitude than the scaled value is moved one step back."""

    def cast_to_fp8(x, scale, fmt):
        q = original(x, scale, fmt)
        scaled = x.to(torch.float32) * scale
        up = q.to(torch.float32).abs() > scaled.abs()
        codes = q.view(torch.uint8)
        back = torch.where(up & ((codes & 0x7F) > 0), codes - 1, codes)
        return back.view(q.dtype)

    return cast_to_fp8


def _block_columnwise_from_rowwise(original):
    """BlockQuantizer.columnwise_copy whose 1D copy (128x1 blocks) is made by quantizing
    the row-wise copy's dequantized values again instead of x: each value is within FP8
    error of the right one, but not the quantization of x."""

    def columnwise_copy(self, x2, data):
        if self.block_dim != 1:
            return original(self, x2, data)
        return original(self, data, data)

    return columnwise_copy


FAULTS = {
    f.name: f
    for f in (
        Fault(
            "torch-fp8-e5m2-grad-read-as-e4m3",
            "Under HYBRID the backward's E5M2 bytes are read as E4M3 (the same bits in the "
            "other format), so every quantized gradient operand is garbled while the forward "
            "stays right (NVIDIA/TransformerEngine#3342's kind)",
            "gradfuzz_adapter.torch_backend.fp8.cast_to_fp8",
            _e5m2_read_as_e4m3,
        ),
        Fault(
            "torch-fp8-scale-inv-applied-twice",
            "Dequantization multiplies by the scale inverse twice, so every quantized operand "
            "is off by a factor 1/scale (amax/448 under current scaling)",
            "gradfuzz_adapter.torch_backend.fp8.dequantize",
            _scale_inv_twice,
        ),
        Fault(
            "torch-fp8-transposed-copy-read-rowwise",
            "The column-wise (transposed) copy of a quantized operand is read where the "
            "row-wise one belongs, with the row-wise shape",
            "gradfuzz_adapter.torch_backend.fp8.QuantizedTensor.rowwise",
            _transposed_copy_rowwise,
        ),
        Fault(
            "torch-fp8-columnwise-copy-off-by-one-code",
            "A per-tensor quantization's column-wise copy has one element one FP8 step away "
            "from the row-wise one: within FP8 error, only the column-wise copy check sees it",
            "gradfuzz_adapter.torch_backend.fp8.per_tensor_copies",
            _columnwise_copy_off_by_one_code,
        ),
        Fault(
            "torch-fused-gradient-cast-columnwise-off-by-one-code",
            "The FP8 gradient an op casts for the GroupedLinear before it in the kernel that "
            "computes it (TE: a fused dact + cast or dbias + cast, BackwardActivationBias) has "
            "its column-wise copy one FP8 step off in one element, per-tensor recipes: within "
            "FP8 error, only the column-wise copy check of that cast's output sees it",
            "gradfuzz_adapter.torch_backend.fp8.fused_gradient_cast",
            _fused_gradient_cast_columnwise_off_by_one_code,
        ),
        Fault(
            "torch-fp8-codes-rounded-toward-zero",
            "The FP8 cast rounds toward zero instead of to nearest even, in every "
            "quantizer: within one FP8 step, only the codes check sees it",
            "gradfuzz_adapter.torch_backend.fp8.cast_to_fp8",
            _codes_rounded_toward_zero,
        ),
        Fault(
            "torch-fp8-block-columnwise-from-rowwise",
            "1D block scaling: the column-wise copy (128x1 blocks) is the re-quantization of "
            "the row-wise copy's dequantized values instead of x's: within FP8 error, only "
            "the column-wise copy check sees it",
            "gradfuzz_adapter.torch_backend.fp8.BlockQuantizer.columnwise_copy",
            _block_columnwise_from_rowwise,
        ),
        Fault(
            "torch-fp8-dgrad-scaled-down",
            "The quantized Linear's input gradient (the dgrad GEMM's result) comes back "
            "scaled by 2^-7 while its weight gradient and the forward stay right (the size "
            "of NVIDIA/TransformerEngine#3342's error)",
            "gradfuzz_adapter.torch_backend.fp8.QuantizedLinearFunction.backward",
            _dgrad_scaled_down,
        ),
        Fault(
            "torch-backward-linear-scale-alpha-dropped",
            "The fused BackwardLinearScale runs its dgrad and wgrad GEMMs without their alpha "
            "(the ConstantScale's scale), so both gradients of its Linear, and everything "
            "upstream, miss that factor while the forward stays right",
            "gradfuzz_adapter.torch_backend.fp8.backward_gemm_alpha",
            _alpha_dropped,
        ),
        Fault(
            "torch-grouped-linear-ignores-backward-override",
            "GroupedLinear ignores the recipe's backward_override (high_precision, "
            "dequantized) and runs the fully quantized backward: TE 2.20.2's open defect "
            "te-groupedlinear-ignores-backward-override, planted in the emulation so that it "
            "reproduces TE's values on the CPU",
            "gradfuzz_adapter.torch_backend.fp8.OpQuantization.__init__",
            _grouped_linear_ignores_override,
        ),
        Fault(
            "torch-delayed-forward-scale-e5m2-max",
            "DelayedScaling's forward scale update uses E5M2's maximum 57344 instead of "
            "E4M3's 448: from the second call on, inputs and weights saturate",
            "gradfuzz_adapter.torch_backend.fp8.DelayedQuantizer.update",
            _forward_scale_with_e5m2_max,
        ),
        Fault(
            "torch-fp8-backward-update-skipped",
            "DelayedScaling's backward update never runs: grad-output quantizers keep scale 1 "
            "and their amaxes pile up in history slot 0 (values stay within FP8's error)",
            "gradfuzz_adapter.torch_backend.fp8.DelayedQuantizer.update",
            _backward_update_skipped,
        ),
        Fault(
            "torch-fp8-scale-from-older-amaxes",
            "DelayedScaling's update computes the scale from the history without slot 0, the "
            "amax the step just recorded: the scale lags a step behind its tensors",
            "gradfuzz_adapter.torch_backend.fp8.DelayedQuantizer.update",
            _scale_from_older_amaxes,
        ),
        Fault(
            "torch-usage-checkpoint-drops-delayed-state",
            "Loading a checkpoint restores the parameters but not the quantizers' delayed-"
            "scaling state: the fresh ops go on with scale 1 and an empty amax history",
            "gradfuzz_adapter.torch_backend.fp8.OpQuantization.load_state",
            _delayed_state_not_loaded,
        ),
        Fault(
            "torch-usage-stale-weights-after-step",
            "Each op computes with the parameter values of its first call in a Sequential "
            "(gradients still reach the parameters): after an optimizer step writes them in "
            "place, its outputs are those of the old values",
            "gradfuzz_adapter.torch_backend.runtime.BasicOp.forward",
            _weights_cached_at_first_call,
        ),
        Fault(
            "torch-usage-checkpoint-drops-last-param",
            "Loading a checkpoint leaves each op's last parameter (a bias, a beta) as the "
            "fresh op holds it, where the op has more than one",
            "gradfuzz_adapter.torch_backend.runtime.BasicOp.load_state_dict",
            _last_param_not_loaded,
        ),
        Fault(
            "torch-usage-eval-pass-keeps-graph",
            "A Sequential called with grad mode off runs its ops with grad mode on: the "
            "evaluation pass hands the caller outputs with an autograd graph",
            "gradfuzz_adapter.torch_backend.runtime.Sequential.__call__",
            eval_pass_keeps_graph,
        ),
        Fault(
            "torch-usage-inference-copy-reused",
            "An op keeps the copy of its parameters made in an inference_mode pass and "
            "computes every later call with it: a training call after an inference pass "
            "cannot save it for backward, and its parameters get no gradient",
            "gradfuzz_adapter.torch_backend.runtime.BasicOp.forward",
            _inference_copy_reused,
        ),
        Fault(
            "torch-usage-output-buffer-reused",
            "The Sequential writes each call's main output into the tensor it returned at the "
            "previous call (a reused output buffer): what the caller holds from that call "
            "changes",
            "gradfuzz_adapter.torch_backend.runtime.Sequential.__call__",
            output_buffer_reused,
        ),
        Fault(
            "torch-usage-deferred-init-reinitialised-at-first-forward",
            "An op built on 'meta' and materialised initialises its parameters again at its "
            "first call (it goes by how it was built, not by where its parameters are), "
            "overwriting the values the caller copied in after materialisation",
            "gradfuzz_adapter.torch_backend.runtime.BasicOp.forward",
            _deferred_reinitialised_at_first_forward,
        ),
        Fault(
            "torch-usage-recompute-as-eval-pass",
            "The forward that activation recompute runs inside the backward runs with grad "
            "mode off (taken for an evaluation pass): it saves nothing for backward",
            "gradfuzz_adapter.torch_backend.runtime.Sequential.__call__",
            recompute_as_eval_pass,
        ),
        Fault(
            "torch-usage-recipe-off-call-records-amax",
            "A call with the recipe off (outside the autocast) computes in high precision but "
            "still records each Linear's input and weight amax into its delayed-scaling "
            "history: the next training step's update consumes amaxes of a call that "
            "quantized nothing",
            "gradfuzz_adapter.torch_backend.fp8.OpQuantization.apply",
            _recipe_off_records_amax,
        ),
        Fault(
            "torch-usage-recipe-off-call-uses-fp8-weight",
            "A call with the recipe off (outside the autocast) after quantized calls computes "
            "each Linear with the FP8 weight those calls cast: its output and its input's "
            "gradient are off by FP8's error where they must be the high-precision values",
            "gradfuzz_adapter.torch_backend.fp8.OpQuantization.apply",
            _recipe_off_call_uses_fp8_weight,
        ),
        Fault(
            "torch-usage-history-len-change-zeroes-history",
            "A DelayedScaling recipe that comes back with another amax_history_len starts "
            "every history afresh (zeros) instead of keeping its first slots or padding it: "
            "the calibrated amaxes are lost at the change",
            "gradfuzz_adapter.torch_backend.fp8.DelayedQuantizer.resize_history",
            _history_len_change_zeroes,
        ),
        Fault(
            "torch-usage-quantized-weight-stale-transpose-after-step",
            "Writing new values into a quantized weight (an optimizer step, a checkpoint "
            "load) remakes its row-wise copy but keeps the column-wise copy of the old "
            "values: the dgrad GEMM after the step reads the old weight",
            "gradfuzz_adapter.torch_backend.fp8.OpQuantization.write_weight",
            _transpose_kept_after_write,
        ),
        Fault(
            "torch-usage-held-weight-dequantize-detached",
            "dequantize() of a quantized weight hands the caller its values without the "
            "parameter's autograd: a loss built on it never reaches the weight",
            "gradfuzz_adapter.torch_backend.fp8.HeldQuantizedWeight.dequantize",
            _dequantize_detached,
        ),
        Fault(
            "torch-usage-several-sequentials-update-per-sequential",
            "The forward delayed-scaling update runs at the exit of each Sequential of an "
            "autocast (over every op the autocast ran) instead of once at the autocast's "
            "exit: with several Sequentials the earlier ones' quantizers update twice",
            "gradfuzz_adapter.torch_backend.backend.TorchBuilder.forward",
            _forward_update_per_sequential,
        ),
        Fault(
            "torch-reduce-scatter-wrong-shard",
            "The reduce-scatter sums the ranks' summands but hands rank r the rows of rank "
            "r+1: ReduceScatter's output, a sequence-parallel row Linear's output and "
            "AllGather's input gradient come back as another rank's slice",
            "gradfuzz_adapter.torch_backend.collectives.reduce_scatter_rows",
            _wrong_shard,
            world_size=2,
        ),
        Fault(
            "torch-column-parallel-dgrad-not-all-reduced",
            "A column-parallel Linear's input gradient is not summed over the ranks (the "
            "all-reduce, or with sequence parallelism the reduce-scatter, after the dgrad "
            "GEMM left out): each rank keeps its own summand",
            "gradfuzz_adapter.torch_backend.collectives.column_parallel_grad_input",
            _dgrad_not_reduced,
            world_size=2,
        ),
        Fault(
            "torch-all-reduce-backward-reduced",
            "AllReduce's backward all-reduces the gradient as well, so its input gradient is "
            "N times too large on every rank",
            "gradfuzz_adapter.torch_backend.collectives.all_reduce_backward",
            _all_reduce_backward_reduced,
            world_size=2,
        ),
        Fault(
            "torch-rank-killed",
            "Rank 1 is killed (SIGKILL) in its first all-gather: the case must be a crash "
            "finding with every rank cleaned up",
            "gradfuzz_adapter.torch_backend.collectives.all_gather_rows",
            _on_rank_one(_kill_self),
            world_size=2,
        ),
        Fault(
            "torch-rank-hangs",
            "Rank 1 sleeps an hour in its first all-gather, the other ranks wait for it in "
            "the collective: the case must be a timeout finding with every rank cleaned up",
            "gradfuzz_adapter.torch_backend.collectives.all_gather_rows",
            _on_rank_one(_hang),
            world_size=2,
        ),
    )
}

# GRADFUZZ_FAULT=<name>: one of these planted for the whole process at import (the
# adapter's faults.py: plant_from_environment); runtime.py imports this module last, so an exported
# upstream test that imports the runtime runs under the fault the variable names.
PLANTED = plant_from_environment(FAULTS, "torch-")
