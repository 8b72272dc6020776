"""fp8_state.py: delayed scaling's state judged by TE's rule, without a backend."""

import torch

from gradfuzz_adapter.fp8_state import StateCheck, rule_update, state_entry


def entry(history, scale, *, algo="max", margin=0, pass_="forward", role="input"):
    return state_entry(
        0,
        pass_,
        role,
        0,
        torch.tensor(history, dtype=torch.float32),
        torch.tensor([scale], dtype=torch.float32),
        fp8_max=448.0,
        margin=margin,
        algo=algo,
    )


def test_the_rule_rolls_the_history_and_scales_to_its_amax():
    history = torch.tensor([4.0, 0.0, 2.0])
    rolled, scale = rule_update(history, torch.tensor(1.0), fp8_max=448.0, margin=1, algo="max")
    assert rolled.tolist() == [0.0, 2.0, 4.0]
    assert float(scale) == 448.0 / 4.0 / 2.0
    rolled, scale = rule_update(
        torch.tensor([1.0, 0.0, 8.0]),
        torch.tensor(1.0),
        fp8_max=448.0,
        margin=0,
        algo="most_recent",
    )
    assert float(scale) == 448.0  # history[0], not the max
    # Nothing recorded anywhere: the old scale stays.
    _, scale = rule_update(torch.zeros(3), torch.tensor(5.0), fp8_max=448.0, margin=0, algo="max")
    assert float(scale) == 5.0


def checked(saved, loaded):
    check = StateCheck()
    check.before({"q": loaded}, checkpointed={"q": saved})
    return check.take()["violations"]


def test_a_checkpoint_that_keeps_the_state_passes():
    saved = entry([3.0, 0.0, 0.0, 1.0], 112.0)
    assert checked(saved, entry([3.0, 0.0, 0.0, 1.0], 112.0)) == []


def test_a_checkpoint_that_loses_the_state_is_told_from_one_updated_while_loading():
    # An eval pass recorded 3.0 in slot 0 before the save (no update: grad disabled).
    saved = entry([3.0, 0.0, 0.0, 1.0], 448.0)
    lost = checked(saved, entry([0.0, 0.0, 0.0, 0.0], 1.0))
    assert [v["what"] for v in lost] == ["checkpoint"]
    # The same state after one update by the rule: rolled, scale from max(history).
    updated = checked(saved, entry([0.0, 0.0, 1.0, 3.0], 448.0 / 3.0))
    assert [v["what"] for v in updated] == ["checkpoint_updated"]
    assert "after 1 update(s)" in updated[0]["note"]
    twice = checked(saved, entry([0.0, 1.0, 3.0, 0.0], 448.0 / 3.0))
    assert [v["what"] for v in twice] == ["checkpoint_updated"]
    assert "after 2 update(s)" in twice[0]["note"]
    # Another history is not an update of the saved one.
    other = checked(saved, entry([0.0, 0.0, 3.0, 1.0], 448.0 / 3.0))
    assert [v["what"] for v in other] == ["checkpoint"]


def trained(before, after):
    """The verdict of a training call (forward and backward with grad) from state `before`
    to state `after` of one quantizer."""
    check = StateCheck()
    check.before({"q": before})
    check.after({"q": after}, forward_trained=True, backward_trained=True, weights={})
    return check.take()


def test_a_training_call_must_consume_the_recorded_amax():
    # The forward recorded 4.0 and its update at autocast exit rolled it: the rule's state.
    ok = trained(entry([0.0, 0.0, 2.0], 224.0), entry([0.0, 2.0, 4.0], 112.0))
    assert ok == {"checked": 1, "violations": []}
    # The amax left in slot 0: the update was missed.
    missed = trained(entry([0.0, 2.0, 4.0], 112.0), entry([4.0, 2.0, 4.0], 112.0))
    assert [v["what"] for v in missed["violations"]] == ["update"]
