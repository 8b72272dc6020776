import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import Float8CurrentScaling, Format


def test_grouped_linear_dx(dtype=torch.float32, device="cuda"):
    """GroupedLinear (float32, Float8CurrentScaling HYBRID, backward_override=dequantized): wrong
    dx. gradfuzz: mismatch|GroupedLinear|grad_input (GroupedLinear.fuser_backward)."""
    torch.manual_seed(106)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(1, 16, 16, dtype=dtype)
    split_sizes = torch.tensor([16])
    dy = torch.rand(16, 16, dtype=dtype)
    # FP8-representable, as TE's make_reference_and_test_tensors makes them
    quantizer = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device=device)
    x, w = (quantizer(t.to(device)).dequantize().cpu() for t in (x, w))
    recipe = Float8CurrentScaling(fp8_format=Format.HYBRID, backward_override="dequantized")

    grouped_linear = te.ops.GroupedLinear(1, 16, 16, device=device, dtype=dtype, bias=False)
    model = te.ops.Sequential(grouped_linear)
    with torch.no_grad():
        grouped_linear.weight0.copy_(w[0])
    grouped_linear.weight0.requires_grad_(False)
    x_test = x.to(device, copy=True).requires_grad_()
    with te.autocast(recipe=recipe):
        y_test = model(x_test, split_sizes.to(device, copy=True))
    y_test.backward(dy.to(device))

    x_ref, w_ref = (t.double().requires_grad_() for t in (x, w))
    groups = x_ref.split(split_sizes.tolist())  # GroupedLinear's rows per group
    y_ref = torch.cat([xg @ w_ref[g].T for g, xg in enumerate(groups)])
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.float32): backward_override=dequantized's gradients
    torch.testing.assert_close(x_test.grad.double().cpu(), x_ref.grad, rtol=1.3e-06, atol=1e-05)
