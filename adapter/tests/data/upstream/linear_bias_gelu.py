import torch
import transformer_engine.pytorch as te


def test_linear_bias_gelu_dw(dtype=torch.float32, device="cuda"):
    """Linear -> Bias -> GELU (float32): wrong dw. gradfuzz: mismatch|Linear|grad_param."""
    torch.manual_seed(11)
    x = torch.rand(16, 32, dtype=dtype)
    w = torch.rand(32, 32, dtype=dtype)
    b = torch.rand(32, dtype=dtype)
    dy = torch.rand(16, 32, dtype=dtype)

    linear = te.ops.BasicLinear(32, 32, device=device, dtype=dtype)
    bias = te.ops.Bias(32, device=device, dtype=dtype)
    gelu = te.ops.GELU()
    model = te.ops.Sequential(linear, bias, gelu)
    with torch.no_grad():
        linear.weight.copy_(w)
        bias.bias.copy_(b)
    x_test = x.to(device, copy=True).requires_grad_()
    y_test = model(x_test)
    y_test.backward(dy.to(device))

    x_ref, w_ref, b_ref = (t.double().requires_grad_() for t in (x, w, b))
    y_ref = torch.nn.functional.gelu(x_ref @ w_ref.T + b_ref, approximate="tanh")
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.float16): cuBLASLt runs float32 GEMMs in TF32
    torch.testing.assert_close(
        linear.weight.grad.double().cpu(), w_ref.grad, rtol=0.001, atol=1e-05
    )
