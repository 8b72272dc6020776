import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format


def test_linear_linear_dw1(dtype=torch.float32, device="cuda"):
    """Linear -> Linear (float32, DelayedScaling HYBRID): wrong dw1. gradfuzz:
    mismatch|Linear|grad_param (BasicLinear.op_backward)."""
    torch.manual_seed(104)
    x = torch.rand(64, 64, dtype=dtype)
    w1 = torch.rand(64, 64, dtype=dtype)
    w2 = torch.rand(64, 64, dtype=dtype)
    dy = torch.rand(64, 64, dtype=dtype)
    # FP8-representable (E4M3 at DelayedScaling's first scale, 1), as TE's tests make them
    x, w1, w2 = (t.to(torch.float8_e4m3fn).to(dtype) for t in (x, w1, w2))
    recipe = DelayedScaling(fp8_format=Format.HYBRID)

    linear1 = te.ops.BasicLinear(64, 64, device=device, dtype=dtype)
    linear2 = te.ops.BasicLinear(64, 64, device=device, dtype=dtype)
    model = te.ops.Sequential(linear1, linear2)
    with torch.no_grad():
        linear1.weight.copy_(w1)
        linear2.weight.copy_(w2)
    x_test = x.to(device, copy=True).requires_grad_()
    with te.autocast(recipe=recipe):
        y_test = model(x_test)
    y_test.backward(dy.to(device))

    x_ref, w1_ref, w2_ref = (t.double().requires_grad_() for t in (x, w1, w2))
    y_ref = x_ref @ w1_ref.T @ w2_ref.T
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.float8_e5m2): HYBRID's gradients are E5M2
    torch.testing.assert_close(
        linear1.weight.grad.double().cpu(), w1_ref.grad, rtol=0.25, atol=0.125
    )
