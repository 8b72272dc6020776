import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import Float8CurrentScaling, Format


def test_grouped_linear_dx(dtype=torch.bfloat16, device="cuda"):
    """GroupedLinear (bfloat16, Float8CurrentScaling, backward_override=high_precision): wrong dx.
    gradfuzz: mismatch|GroupedLinear|grad_input."""
    torch.manual_seed(14)
    x = torch.rand(32, 16, dtype=dtype)
    w = torch.rand(2, 32, 16, dtype=dtype)
    b = torch.rand(2, 32, dtype=dtype)
    split_sizes = torch.tensor([10, 22])
    dy = torch.rand(32, 32, dtype=dtype)
    # FP8-representable, as TE's make_reference_and_test_tensors makes them
    quantizer = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device=device)
    x, w = (quantizer(t.to(device)).dequantize().cpu() for t in (x, w))
    recipe = Float8CurrentScaling(fp8_format=Format.E4M3, backward_override="high_precision")

    grouped_linear = te.ops.GroupedLinear(2, 16, 32, device=device, dtype=dtype)
    model = te.ops.Sequential(grouped_linear)
    with torch.no_grad():
        grouped_linear.weight0.copy_(w[0])
        grouped_linear.weight1.copy_(w[1])
        grouped_linear.bias0.copy_(b[0])
        grouped_linear.bias1.copy_(b[1])
    x_test = x.to(device, copy=True).requires_grad_()
    with te.autocast(recipe=recipe):
        y_test = model(x_test, split_sizes.to(device, copy=True))
    y_test.backward(dy.to(device))

    x_ref, w_ref, b_ref = (t.double().requires_grad_() for t in (x, w, b))
    groups = x_ref.split(split_sizes.tolist())  # GroupedLinear's rows per group
    y_ref = torch.cat([xg @ w_ref[g].T + b_ref[g] for g, xg in enumerate(groups)])
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.bfloat16): backward_override=high_precision's gradients
    torch.testing.assert_close(x_test.grad.double().cpu(), x_ref.grad, rtol=0.016, atol=1e-05)
