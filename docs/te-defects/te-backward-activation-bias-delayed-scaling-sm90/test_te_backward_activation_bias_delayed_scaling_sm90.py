import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format


def test_linear_bias_gelu_raises(dtype=torch.float32, device="cuda"):
    """Linear -> Bias -> GELU (float32, DelayedScaling HYBRID): raises RuntimeError in backward.
    gradfuzz: unexpected_error|BackwardActivationBias|backward|unrecognized|RuntimeError: <path>:#
    in function quantize: Not implemented scaling mode or fusion: NVTE_DELAYED_TENSOR_SCALING or
    IS_DBIAS=true on GPU with compute capability."""
    torch.manual_seed(102)
    x = torch.rand(16, 16, dtype=dtype)
    w = torch.rand(16, 16, dtype=dtype)
    b = torch.rand(16, dtype=dtype)
    dy = torch.rand(16, 16, dtype=dtype)
    # FP8-representable (E4M3 at DelayedScaling's first scale, 1), as TE's tests make them
    x, w = (t.to(torch.float8_e4m3fn).to(dtype) for t in (x, w))
    recipe = DelayedScaling(fp8_format=Format.HYBRID)

    linear = te.ops.BasicLinear(16, 16, device=device, dtype=dtype)
    bias = te.ops.Bias(16, device=device, dtype=dtype)
    gelu = te.ops.GELU()
    model = te.ops.Sequential(linear, bias, gelu)
    with torch.no_grad():
        linear.weight.copy_(w)
        bias.bias.copy_(b)
    linear.weight.requires_grad_(False)
    x_test = x.to(device, copy=True).requires_grad_()
    # gradfuzz saw RuntimeError in backward:
    # RuntimeError: /TransformerEngine/transformer_engine/common/activation/./../cast/dispatc...
    with te.autocast(recipe=recipe):
        y_test = model(x_test)
    y_test.backward(dy.to(device))
