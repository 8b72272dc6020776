import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format


def test_gemm_output_amax_keeps_max_between_updates(device="cuda"):
    """Two BasicLinear ops in one te.ops.Sequential (float32, DelayedScaling, amax_history_len
    4), one training step, then two no_grad forwards (no update between them), the second on
    inputs a quarter the size. The second op's input amax history slot 0 is expected to keep
    the larger amax, as it does for an input TE's cast kernels quantize; the first op's FP8
    GEMM output replaces it instead. gradfuzz: mismatch|Linear|fp8_state|forward.eval_amax."""
    torch.manual_seed(41)
    recipe = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=4)
    second = te.ops.BasicLinear(16, 16, device=device)
    model = te.ops.Sequential(te.ops.BasicLinear(16, 16, device=device), second)
    x = torch.randn(16, 16, device=device, requires_grad=True)
    with te.autocast(recipe=recipe):
        y = model(x)
    y.square().sum().backward()

    def slot0(scale):
        with torch.no_grad(), te.autocast(recipe=recipe):
            model(scale * torch.randn(16, 16, device=device))
        return float(second._fp8_metas["forward"]["scaling_fwd"].amax_history[0, 0])

    larger = slot0(4.0)
    assert slot0(1.0) == larger  # TE 2.20.2: the smaller forward's amax (3.82 -> 1.82)
