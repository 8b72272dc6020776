import torch
import transformer_engine.pytorch as te


def test_scale_make_extra_linear_add_extra_y2(dtype=torch.float32, device="cuda"):
    """ConstantScale -> MakeExtraOutput -> Linear -> AddExtraInput (float32): wrong y2. gradfuzz:
    mismatch|in_place:AddExtraInput,MakeExtraOutput|in_place=1|extra_output
    (MakeExtraOutput.fuser_forward)."""
    torch.manual_seed(107)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(16, 16, dtype=dtype)

    scale = te.ops.ConstantScale(0.5)
    make_extra = te.ops.MakeExtraOutput(in_place=True)
    linear = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    add_extra = te.ops.AddExtraInput(in_place=True)
    make_extra.set_extra_output_channel(0, "c0", output_to_caller=True)
    add_extra.set_extra_input_channel(0, "c0")
    model = te.ops.Sequential(scale, make_extra, linear, add_extra)
    with torch.no_grad():
        linear.weight.copy_(w)
    x_test = x.to(device, copy=True)
    y1_test, y2_test = model(x_test)

    h = x.double() * 0.5
    y1_ref = h @ w.double().T + h
    y2_ref = h
    # The finding, at TE's dtype_tols(torch.float16): cuBLASLt runs float32 GEMMs in TF32
    torch.testing.assert_close(y2_test.double().cpu(), y2_ref, rtol=0.001, atol=1e-05)
