"""fp8_state.py: delayed scaling's state judged by TE's rule, without a backend."""

import pytest
import torch

from gradfuzz_adapter.fp8_state import StateCheck, rule_update, state_entry, to_host


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


def evaluated(before, after):
    """The verdict of an evaluation pass (no_grad: no update) from `before` to `after`."""
    check = StateCheck()
    check.before({"q": before})
    check.after({"q": after}, forward_trained=False, backward_trained=False, weights={})
    return check.take()


def test_an_evaluation_pass_keeps_the_larger_amax_in_slot_0():
    # The last update left [0, 3.75]; an eval recorded 3.75, a second eval 1.9: a max keeps
    # 3.75 (TE's cast kernels); a last-wins record (the H100's GEMM-fed input quantizer,
    # probe_te_state.py eval-amax-keeps-max-gemm-output) is told apart from a wrong update.
    assert evaluated(entry([3.75, 3.75], 119.5), entry([3.75, 3.75], 119.5))["violations"] == []
    assert evaluated(entry([0.0, 3.75], 119.5), entry([1.9, 3.75], 119.5))["violations"] == []
    replaced = evaluated(entry([3.75, 3.75], 119.5), entry([1.9, 3.75], 119.5))["violations"]
    assert [v["what"] for v in replaced] == ["eval_amax"]
    assert "went from 3.75 down to 1.8999" in replaced[0]["note"]
    # An update with the rule's result in a call that should have run none is still judged
    # by the rule, and a wrong scale with it is a rule violation, not eval_amax.
    wrong = evaluated(entry([3.75, 3.75], 119.5), entry([1.9, 3.75], 64.0))["violations"]
    assert [v["what"] for v in wrong] == ["rule"]


def test_a_state_dropped_at_a_call_with_the_recipe_off_is_judged_afresh_after_it():
    check = StateCheck()
    check.before({"q": entry([0.0, 3.0], 149.0)})
    check.untouched({})  # TE 2.20.2: the op's _fp8_metas gone after the FP8-off call
    assert [v["what"] for v in check.take()["violations"]] == ["recipe_off"]
    # The next (eval) call builds the state afresh: scale 1, its amax in slot 0. Judged as a
    # new state, not once more against the dropped one.
    check.before({})
    check.after(
        {"q": entry([0.93], 1.0)}, forward_trained=False, backward_trained=False, weights={}
    )
    assert check.take() == {"checked": 1, "violations": []}


def _states(device):
    history = torch.arange(12, dtype=torch.float32, device=device).reshape(4, 3) / 7
    scale = torch.tensor([1.5, 2.5, 3.5], device=device)
    return {
        k: state_entry(0, "forward", "input", k, history[:, k], scale[k], **OPTIONS)
        for k in range(3)
    }


OPTIONS = {"fp8_max": 448.0, "margin": 0, "algo": "max"}


def test_a_snapshot_on_the_host_stays_as_it_is():
    states = _states("cpu")
    same = {k: (e["history"], e["scale"]) for k, e in states.items()}
    assert to_host(states) is states
    for k, entry in states.items():
        assert entry["history"] is same[k][0] and entry["scale"] is same[k][1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_snapshot_on_the_device_comes_over_in_one_copy_with_each_value():
    on_device = _states("cuda")
    want = _states("cpu")
    got = to_host(on_device)
    for k, entry in got.items():
        for name in ("history", "scale"):
            assert entry[name].device.type == "cpu"
            assert torch.equal(entry[name], want[k][name])
        # Each its own storage: a check that edits one copy leaves the others.
        entry["history"][0] = -1.0
        assert all(bool(e["history"][0] != -1.0) for j, e in got.items() if j != k)
        entry["history"][0] = want[k]["history"][0]
