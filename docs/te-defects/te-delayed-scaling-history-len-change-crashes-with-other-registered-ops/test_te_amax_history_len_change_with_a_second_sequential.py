import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format


def test_amax_history_len_change_with_a_second_sequential(device="cuda"):
    """Two te.ops Sequentials (BasicLinear, float32) trained a step under DelayedScaling with
    amax_history_len=4, then the first trained under amax_history_len=2, as a run that
    shortens its history while another model (an EMA copy, an evaluation model) stays alive
    would. The step is expected to run and the first op to hold a 2-row history. gradfuzz:
    unexpected_error|FP8GlobalStateManager|forward (reset_recipe_state writes the resized
    history into the old recipe's global buffer slot, beside the other op's 4-row one)."""
    torch.manual_seed(1)
    op = te.ops.BasicLinear(16, 16, device=device)
    first = te.ops.Sequential(op)
    second = te.ops.Sequential(te.ops.BasicLinear(16, 16, device=device))

    def step(model, history_len):
        recipe = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=history_len)
        x = torch.randn(16, 16, device=device, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = model(x)
        y.square().sum().backward()

    step(first, 4)
    step(second, 4)
    step(first, 2)  # TE 2.20.2: RuntimeError at the autocast exit
    assert op._fp8_metas["forward"]["scaling_fwd"].amax_history.shape[0] == 2
