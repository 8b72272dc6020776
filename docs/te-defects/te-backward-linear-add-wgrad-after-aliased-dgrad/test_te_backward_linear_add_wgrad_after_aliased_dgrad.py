import torch
import transformer_engine.pytorch as te


def test_scale_make_extra_linear_add_extra_dw(dtype=torch.float32, device="cuda"):
    """ConstantScale -> MakeExtraOutput -> Linear -> AddExtraInput (float32): wrong dw. gradfuzz:
    mismatch|in_place:AddExtraInput,MakeExtraOutput|in_place=1|grad_param
    (BackwardLinearAdd.fuser_backward)."""
    torch.manual_seed(103)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(16, 16, dtype=dtype)
    dy = torch.rand(16, 16, dtype=dtype)

    scale = te.ops.ConstantScale(0.5)
    make_extra = te.ops.MakeExtraOutput(in_place=True)
    linear = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    add_extra = te.ops.AddExtraInput(in_place=True)
    make_extra.set_extra_output_channel(0, "c0", output_to_caller=False)
    add_extra.set_extra_input_channel(0, "c0")
    model = te.ops.Sequential(scale, make_extra, linear, add_extra)
    with torch.no_grad():
        linear.weight.copy_(w)
    x_test = x.to(device, copy=True).requires_grad_()
    y_test = model(x_test)
    y_test.backward(dy.to(device))

    x_ref, w_ref = (t.double().requires_grad_() for t in (x, w))
    h = x_ref * 0.5
    y_ref = h @ w_ref.T + h
    y_ref.backward(dy.double())
    # The finding, at TE's dtype_tols(torch.float16): cuBLASLt runs float32 GEMMs in TF32
    torch.testing.assert_close(
        linear.weight.grad.double().cpu(), w_ref.grad, rtol=0.001, atol=1e-05
    )
