"""The torch backend's planted faults (docs/BACKENDS.md Protocol 2 `fault`): defects of the
kinds FP8 kernels have, planted in the recipe emulation (recipes.py) so that `gradfuzz
selftest --backend torch` shows on the CPU that the quantization-aware oracle finds them.
Each is te/faults.py's TE fault of the same name after the prefix, on the emulation.
"""

import torch

from .faults import Fault, wrap

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
            grad_input, grad_weight, rest = backward(ctx, grad_output)
            return grad_input * _GRAD_SCALE, grad_weight, rest

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


FAULTS = {
    f.name: f
    for f in (
        Fault(
            "torch-fp8-e5m2-grad-read-as-e4m3",
            "Under HYBRID the backward's E5M2 bytes are read as E4M3 (the same bits in the "
            "other format), so every quantized gradient operand is garbled while the forward "
            "stays right (NVIDIA/TransformerEngine#3342's kind)",
            "gradfuzz_adapter.recipes.cast_to_fp8",
            _e5m2_read_as_e4m3,
        ),
        Fault(
            "torch-fp8-scale-inv-applied-twice",
            "Dequantization multiplies by the scale inverse twice, so every quantized operand "
            "is off by a factor 1/scale (amax/448 under current scaling)",
            "gradfuzz_adapter.recipes.dequantize",
            _scale_inv_twice,
        ),
        Fault(
            "torch-fp8-transposed-copy-read-rowwise",
            "The column-wise (transposed) copy of a quantized operand is read where the "
            "row-wise one belongs, with the row-wise shape",
            "gradfuzz_adapter.recipes.QuantizedTensor.rowwise",
            _transposed_copy_rowwise,
        ),
        Fault(
            "torch-fp8-dgrad-scaled-down",
            "The quantized Linear's input gradient (the dgrad GEMM's result) comes back "
            "scaled by 2^-7 while its weight gradient and the forward stay right (the size "
            "of NVIDIA/TransformerEngine#3342's error)",
            "gradfuzz_adapter.recipes.QuantizedLinearFunction.backward",
            _dgrad_scaled_down,
        ),
        Fault(
            "torch-delayed-forward-scale-e5m2-max",
            "DelayedScaling's forward scale update uses E5M2's maximum 57344 instead of "
            "E4M3's 448: from the second call on, inputs and weights saturate",
            "gradfuzz_adapter.recipes.DelayedQuantizer.update",
            _forward_scale_with_e5m2_max,
        ),
    )
}
