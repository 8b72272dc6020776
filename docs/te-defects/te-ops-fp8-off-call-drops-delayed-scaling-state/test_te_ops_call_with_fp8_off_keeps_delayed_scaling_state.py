import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling


def test_call_with_fp8_off_keeps_delayed_scaling_state(device="cuda"):
    """BasicLinear (float32, DelayedScaling): two training steps, then one forward and backward
    with FP8 off (outside te.autocast, as a high-precision evaluation would run). The op's
    amax history and scale are expected to be as the training steps left them, as te.Linear
    keeps its fp8_meta. gradfuzz: mismatch|Linear|fp8_state|forward.recipe_off
    (OperationFuser.maybe_fuse_ops resets the recipe state when the recipe type changes)."""
    torch.manual_seed(1)
    recipe = DelayedScaling(amax_history_len=4)
    op = te.ops.BasicLinear(16, 16, device=device)
    model = te.ops.Sequential(op)
    for _ in range(2):
        x = torch.randn(16, 16, device=device, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = model(x)
        y.sum().backward()
    state = op._fp8_metas["forward"]["scaling_fwd"]
    amax_history, scale = state.amax_history.clone(), state.scale.clone()

    x = torch.randn(16, 16, device=device, requires_grad=True)
    model(x).sum().backward()  # FP8 off

    assert op._fp8_metas is not None, "the call with FP8 off dropped the op's recipe state"
    state = op._fp8_metas["forward"]["scaling_fwd"]
    torch.testing.assert_close(state.amax_history, amax_history, rtol=0, atol=0)
    torch.testing.assert_close(state.scale, scale, rtol=0, atol=0)
