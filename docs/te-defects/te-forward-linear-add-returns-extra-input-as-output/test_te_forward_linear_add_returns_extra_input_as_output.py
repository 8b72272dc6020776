import torch
import transformer_engine.pytorch as te


def test_scale_make_extra_scale_linear_add_extra_dx(dtype=torch.float32, device="cuda"):
    """ConstantScale -> MakeExtraOutput -> ConstantScale -> Linear -> AddExtraInput (float32): wrong
    dx. gradfuzz: mismatch|Linear|grad_param; first diverges at op 1's extra_output in forward
    (MakeExtraOutput.fuser_forward)."""
    torch.manual_seed(107)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(16, 16, dtype=dtype)
    dy1 = torch.rand(16, 16, dtype=dtype)
    dy2 = torch.rand(16, 16, dtype=dtype)

    scale1 = te.ops.ConstantScale(0.5)
    make_extra = te.ops.MakeExtraOutput()
    scale2 = te.ops.ConstantScale(2.0)
    linear = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    add_extra = te.ops.AddExtraInput(in_place=True)
    make_extra.set_extra_output_channel(0, "c0", output_to_caller=True)
    add_extra.set_extra_input_channel(0, "c0")
    model = te.ops.Sequential(scale1, make_extra, scale2, linear, add_extra)
    with torch.no_grad():
        linear.weight.copy_(w)
    x_test = x.to(device, copy=True).requires_grad_()
    y1_test, y2_test = model(x_test)
    torch.autograd.backward((y1_test, y2_test), (dy1.to(device), dy2.to(device)))

    x_ref, w_ref = (t.double().requires_grad_() for t in (x, w))
    h = x_ref * 0.5
    y1_ref = h * 2.0 @ w_ref.T + h
    y2_ref = h
    torch.autograd.backward((y1_ref, y2_ref), (dy1.double(), dy2.double()))
    # The finding, at TE's dtype_tols(torch.float16): cuBLASLt runs float32 GEMMs in TF32
    torch.testing.assert_close(x_test.grad.double().cpu(), x_ref.grad, rtol=0.001, atol=1e-05)
