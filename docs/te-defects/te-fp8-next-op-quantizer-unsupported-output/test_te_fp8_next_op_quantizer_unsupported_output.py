import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import Float8CurrentScaling, Format


def test_linear_linear_raises(dtype=torch.float32, device="cuda"):
    """Linear -> Linear (float32, Float8CurrentScaling): raises RuntimeError in forward. gradfuzz:
    unexpected_error|BasicLinear|forward|unrecognized|RuntimeError: Attempting to generate quantized
    output tensor with unsupported quantizer."""
    torch.manual_seed(101)
    x = torch.rand(16, 16, dtype=dtype)
    w1 = torch.rand(16, 16, dtype=dtype)
    w2 = torch.rand(16, 16, dtype=dtype)
    # FP8-representable, as TE's make_reference_and_test_tensors makes them
    quantizer = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device=device)
    x, w1, w2 = (quantizer(t.to(device)).dequantize().cpu() for t in (x, w1, w2))
    recipe = Float8CurrentScaling(fp8_format=Format.E4M3)

    linear1 = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    linear2 = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    model = te.ops.Sequential(linear1, linear2)
    with torch.no_grad():
        linear1.weight.copy_(w1)
        linear2.weight.copy_(w2)
    x_test = x.to(device, copy=True)
    # gradfuzz saw RuntimeError in forward:
    # RuntimeError: Attempting to generate quantized output tensor with unsupported quantizer
    with te.autocast(recipe=recipe):
        y_test = model(x_test)
