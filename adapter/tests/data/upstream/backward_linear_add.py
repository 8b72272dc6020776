import torch
import transformer_engine.pytorch as te


def test_make_extra_linear_add_extra_dx(dtype=torch.float32, device="cuda"):
    """MakeExtraOutput -> Linear -> AddExtraInput (float32): wrong dx. gradfuzz:
    mismatch|MakeExtraOutput|grad_input; first diverges at op 1's grad_input in backward
    (BackwardLinearAdd.fuser_backward)."""
    torch.manual_seed(13)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(16, 16, dtype=dtype)
    dy = torch.rand(16, 16, dtype=dtype)

    make_extra = te.ops.MakeExtraOutput(in_place=True)
    linear = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    add_extra = te.ops.AddExtraInput(in_place=True)
    make_extra.set_extra_output_channel(0, "r", output_to_caller=False)
    add_extra.set_extra_input_channel(0, "r")
    model = te.ops.Sequential(make_extra, linear, add_extra)
    with torch.no_grad():
        linear.weight.copy_(w)
    x_test = x.to(device, copy=True).requires_grad_()
    y_test = model(x_test)
    y_test.backward(dy.to(device))

    x_ref, w_ref = (t.double().requires_grad_() for t in (x, w))
    y_ref = x_ref @ w_ref.T + x_ref
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.float16): cuBLASLt runs float32 GEMMs in TF32
    torch.testing.assert_close(x_test.grad.double().cpu(), x_ref.grad, rtol=0.001, atol=1e-05)
