import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import Float8CurrentScaling, Format


def test_linear_gelu_dw(dtype=torch.float32, device="cuda"):
    """Linear -> GELU (float32, Float8CurrentScaling HYBRID, backward_override=high_precision):
    wrong dw. gradfuzz: mismatch|Linear|grad_param (BasicLinear.op_backward)."""
    torch.manual_seed(105)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(16, 16, dtype=dtype)
    dy = torch.rand(16, 16, dtype=dtype)
    # FP8-representable, as TE's make_reference_and_test_tensors makes them
    quantizer = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device=device)
    x, w = (quantizer(t.to(device)).dequantize().cpu() for t in (x, w))
    recipe = Float8CurrentScaling(fp8_format=Format.HYBRID, backward_override="high_precision")

    linear = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    gelu = te.ops.GELU()
    model = te.ops.Sequential(linear, gelu)
    with torch.no_grad():
        linear.weight.copy_(w)
    x_test = x.to(device, copy=True).requires_grad_()
    with te.autocast(recipe=recipe):
        y_test = model(x_test)
    y_test.backward(dy.to(device))

    x_ref, w_ref = (t.double().requires_grad_() for t in (x, w))
    y_ref = torch.nn.functional.gelu(x_ref @ w_ref.T, approximate="tanh")
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.float32): backward_override=high_precision's gradients
    torch.testing.assert_close(
        linear.weight.grad.double().cpu(), w_ref.grad, rtol=1.3e-06, atol=1e-05
    )
