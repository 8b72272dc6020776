import io

import torch
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling


def test_load_state_dict_keeps_delayed_scaling_state(monkeypatch, device="cuda"):
    """Linear -> Linear (float32, DelayedScaling): a checkpoint saved after an evaluation pass
    loads into fresh ops with the first op's amax history rolled and its scale updated.
    gradfuzz: mismatch|Linear|fp8_state|checkpoint_updated (BasicOperation.set_extra_state)."""
    torch.manual_seed(1)
    recipe = DelayedScaling(amax_history_len=4)
    ops = [te.ops.BasicLinear(16, 16, device=device) for _ in range(2)]
    model = te.ops.Sequential(*ops)
    x = torch.randn(16, 16, device=device, requires_grad=True)
    with te.autocast(recipe=recipe):
        y = model(x)
    y.sum().backward()
    with torch.no_grad(), te.autocast(recipe=recipe):  # an eval pass records amaxes, no update
        model(3 * x)
    saved = [op._fp8_metas["forward"]["scaling_fwd"] for op in ops]
    saved = [(state.amax_history.clone(), state.scale.clone()) for state in saved]
    checkpoint = io.BytesIO()
    torch.save(model.state_dict(), checkpoint)
    checkpoint.seek(0)

    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")  # our own checkpoint
    fresh_ops = [te.ops.BasicLinear(16, 16, device=device) for _ in range(2)]
    te.ops.Sequential(*fresh_ops).load_state_dict(torch.load(checkpoint, weights_only=False))
    for op, (amax_history, scale) in zip(fresh_ops, saved):
        state = op._fp8_metas["forward"]["scaling_fwd"]
        torch.testing.assert_close(state.amax_history, amax_history, rtol=0, atol=0)
        torch.testing.assert_close(state.scale, scale, rtol=0, atol=0)
