"""Delayed scaling's state judged by the rule TE documents (issue "FP8 state" item 1).

A backend's Builder lists its delayed-scaling quantizers (Builder.delayed_states): per op, per
pass (forward: input and weight; backward: grad_output), per GroupedLinear group, the amax
history [len] and scale, as float32 copies (brought to the CPU together: to_host). The
driver snapshots them right before each call's forward (after the call's optimizer step and
checkpoint round trip) and after its backward, and judges the change here, exactly (no
tolerance), with this module's own copy of TE's rule (transformer_engine/pytorch/
quantization.py: _default_get_amax_and_update_history, _default_sf_compute; docs/BACKENDS.md
"Recipes"):

- the update at the end of a pass takes amax = max(history) ("max") or history[0]
  ("most_recent"), rolls the history by -1 (slot 0 to the end) and zeroes slot 0, and sets
  scale = (fp8_max / amax) / 2^margin where 0 < amax < inf (else the old scale; an infinite
  scale becomes float32's max);
- so after a call whose pass ran with grad (a training call: forward at autocast exit,
  backward at its end) slot 0 is 0 again: an amax recorded and left there is an update missed;
- where an update ran, the history before it was the old one with slot 0 holding what the call
  recorded, which the update rolled to the last slot: the new state must be the rule applied to
  that history;
- where none ran (an evaluation pass, a pass that quantized nothing), scale and history are the
  old ones but for slot 0, which may only grow (a max; one that went down is "eval_amax");
- a state the backend dropped at a call with the recipe off is judged there ("recipe_off")
  and afresh from then on;
- a weight's recorded amax is max|W| of the weight the call used, in float32;
- a checkpoint round trip hands the fresh ops the state the old ones had ("checkpoint"); one
  that hands them the saved state after k updates by the rule is told apart
  ("checkpoint_updated": an update ran during the load, TE 2.20.2's op.py set_extra_state).
"""

import torch

FP8_MAX = {"E4M3": 448.0, "E5M2": 57344.0}
_FP32_MAX = torch.finfo(torch.float32).max


def rule_update(history, scale, *, fp8_max, margin, algo):
    """(history, scale) after TE's documented update of one quantizer's float32 state."""
    history = history.to(torch.float32)
    amax = history.max() if algo == "max" else history[0].clone()
    rolled = torch.roll(history, -1, 0)
    rolled[0] = 0.0
    new = (torch.tensor(fp8_max, dtype=torch.float32) / amax) / (2.0**margin)
    if not (bool(amax > 0) and bool(torch.isfinite(amax))):
        new = scale.to(torch.float32).clone()
    elif bool(torch.isinf(new)):
        new = torch.tensor(_FP32_MAX, dtype=torch.float32)
    return rolled, new.reshape(())


def _same(a, b):
    return a.shape == b.shape and bool(torch.equal(a, b))


def _text(t):
    return "[" + ", ".join(f"{v:.9g}" for v in t.reshape(-1).tolist()) + "]"


def _updates_between(saved, loaded, most=8):
    """k in 1..most where `loaded` is `saved` after k updates by the rule (an update ran with
    nothing recorded since), else None."""
    history, scale = saved["history"], saved["scale"].reshape(())
    for k in range(1, most + 1):
        if not bool(history.ne(0).any()):
            return None  # the rule would only roll zeros from here on
        history, scale = rule_update(
            history, scale, fp8_max=saved["fp8_max"], margin=saved["margin"], algo=saved["algo"]
        )
        if _same(history, loaded["history"]) and _same(scale.reshape(-1), loaded["scale"]):
            return k
    return None


class StateCheck:
    """One path's delayed-scaling states across its calls: `before(states)` right before a
    call, `after(states, trained, weights)` after it; `violations` and `checked` accumulate
    for the call that `take()` hands out."""

    def __init__(self):
        self.previous = None
        self.violations = []
        self.checked = 0
        # The states a history-length change makes of the last call's (resize), until the
        # next call's `before`.
        self.resized = None

    def before(self, states, checkpointed=None):
        """`states` before the call's forward; `checkpointed`: the states the ops had when the
        checkpoint this call's ops were loaded from was saved (a round trip must keep them)."""
        if checkpointed is not None:
            for key, saved in checkpointed.items():
                loaded = states.get(key)
                if loaded is None or not (
                    _same(loaded["history"], saved["history"])
                    and _same(loaded["scale"], saved["scale"])
                ):
                    updates = None if loaded is None else _updates_between(saved, loaded)
                    note = (
                        f"the checkpoint held scale {_text(saved['scale'])} and amax history "
                        f"{_text(saved['history'])}; the loaded op has "
                        + (
                            "no such quantizer"
                            if loaded is None
                            else f"scale {_text(loaded['scale'])} and history "
                            f"{_text(loaded['history'])}"
                        )
                    )
                    if updates:
                        # Not lost but moved on: an update ran between the load and the call.
                        note += (
                            f": the saved state after {updates} update(s) by the rule, so an "
                            "amax and scale update ran while the checkpoint loaded"
                        )
                    self._violate(saved, "checkpoint_updated" if updates else "checkpoint", note)
        self.previous = states
        if self.resized is not None:
            self._judge_resized(states)

    def after(self, states, *, forward_trained, backward_trained, weights):
        """Judges `states` after the call against the states before it. `forward_trained`:
        the forward ran with grad (its update at autocast exit is due); `backward_trained`: a
        backward ran. `weights`: {(op, group): weight tensor the call used}."""
        before = self.previous or {}
        for key, s1 in states.items():
            # A state this call made (TE builds an op's lazily, at its first forward) started
            # as every recipe state starts: scale 1, an empty history.
            s0 = before.get(key) or dict(
                s1, history=torch.zeros_like(s1["history"]), scale=torch.ones_like(s1["scale"])
            )
            self.checked += 1
            trained = forward_trained if s1["pass"] == "forward" else backward_trained
            self._judge(s0, s1, trained, weights)
        self.previous = states

    def untouched(self, states):
        """Judges `states` after a call that ran with the recipe off: every state from before
        it is there and exactly as it was (a call outside the autocast quantizes nothing,
        records no amax and runs no update); the calls after it go on from these states."""
        before = self.previous or {}
        for key, s0 in before.items():
            self.checked += 1
            s1 = states.get(key)
            if s1 is None:
                self._violate(
                    s0,
                    "recipe_off",
                    f"after a call with the recipe off the op has no such quantizer any more "
                    f"(before it: scale {_text(s0['scale'])}, history {_text(s0['history'])}): "
                    "its delayed-scaling state was dropped",
                )
            elif not (_same(s1["history"], s0["history"]) and _same(s1["scale"], s0["scale"])):
                self._violate(
                    s0,
                    "recipe_off",
                    f"a call with the recipe off changed the state: scale "
                    f"{_text(s0['scale'])} -> {_text(s1['scale'])}, history "
                    f"{_text(s0['history'])} -> {_text(s1['history'])}",
                )
        # The calls after it go on from the states the backend has: a state it dropped is
        # made afresh at its next quantized call (TE builds it lazily), judged from scale 1
        # and an empty history as any new one, not held to the dropped one a second time.
        self.previous = dict(states)

    def resize(self, length):
        """DelayedScaling's amax_history_len becomes `length` before the next call: the states
        that call starts from are the ones after the last call with each history's first
        `length` slots kept or zeros appended (op.py: reset_recipe_state for a recipe of the
        same type), the scale kept. A backend may resize at once or at the call's forward:
        `before` judges a state already resized against this one."""
        resized = {}
        for key, s in (self.previous or {}).items():
            h = s["history"]
            if h.numel() >= length:
                kept = h[:length].clone()
            else:
                kept = torch.cat([h, torch.zeros(length - h.numel(), dtype=h.dtype)])
            resized[key] = dict(s, history=kept)
        self.resized = resized

    def _judge_resized(self, states):
        """`before` with a pending resize: the states already of the new length must be the
        resized ones; the call then starts from those."""
        resized, self.resized = self.resized, None
        for key, want in resized.items():
            got = states.get(key)
            if got is None or got["history"].shape != want["history"].shape:
                continue  # resized at the call's forward (TE): judged after the call
            self.checked += 1
            if not (_same(got["history"], want["history"]) and _same(got["scale"], want["scale"])):
                self._violate(
                    want,
                    "history_len",
                    f"amax_history_len changed to {want['history'].numel()}: the state became "
                    f"scale {_text(got['scale'])}, history {_text(got['history'])}; keeping the "
                    f"history's first slots (or padding it) gives scale {_text(want['scale'])}, "
                    f"history {_text(want['history'])}",
                )
        self.previous = {**states, **resized}

    def _judge(self, s0, s1, trained, weights):
        h0, h1 = s0["history"], s1["history"]
        if h0.shape != h1.shape:
            self._violate(
                s1, "history", f"the amax history changed length: {h0.numel()} -> {h1.numel()}"
            )
            return
        unchanged = (
            _same(s1["scale"], s0["scale"]) and _same(h1[1:], h0[1:]) and bool(h1[0] >= h0[0])
        )
        if trained and bool(h1[0] != 0):
            self._violate(
                s1,
                "update",
                f"after a call whose {s1['pass']} pass ran with grad, amax history slot 0 still "
                f"holds {float(h1[0]):.9g}: the recorded amax was not consumed by the "
                f"{s1['pass']} update "
                f"(scale {_text(s1['scale'])}, before the call {_text(s0['scale'])})",
            )
            return
        if unchanged:
            return
        if (
            not trained
            and _same(s1["scale"], s0["scale"])
            and _same(h1[1:], h0[1:])
            and bool(h1[0] < h0[0])
        ):
            # No update ran (the rest of the state is as it was), yet slot 0 went down: the
            # call's amax replaced the larger one recorded since the last update instead of
            # joining it as a max (TE's cast kernels record with an atomic max).
            self._violate(
                s1,
                "eval_amax",
                f"in a call that ran no {s1['pass']} update, amax history slot 0 went from "
                f"{float(h0[0]):.9g} down to {float(h1[0]):.9g} (scale {_text(s1['scale'])} "
                "and the other slots unchanged): the amax this call recorded replaced the "
                "larger one recorded before it since the last update, where a max of the two "
                "is kept",
            )
            return
        w = weights.get((s1["op"], s1["group"])) if s1["role"] == "weight" else None
        w_amax = None if w is None else w.detach().abs().max().to(torch.float32).cpu()
        if h1.numel() > 1:
            recorded = h1[-1].clone()
        elif w_amax is not None and bool(h0[0] == 0):
            recorded = w_amax.clone()
        else:
            return  # a one-slot history keeps no trace of the amax it consumed
        pre = h0.clone()
        pre[0] = recorded
        want_h, want_s = rule_update(
            pre, s0["scale"], fp8_max=s1["fp8_max"], margin=s1["margin"], algo=s1["algo"]
        )
        if not (_same(h1, want_h) and _same(s1["scale"].reshape(()), want_s)):
            self._violate(
                s1,
                "rule",
                f"the update gave scale {_text(s1['scale'])} and history {_text(h1)}; from the "
                f"history "
                f"{_text(pre)} (slot 0 the amax the call recorded) the rule gives scale "
                f"{_text(want_s)} and history {_text(want_h)}",
            )
            return
        if w_amax is not None and bool(h0[0] == 0):
            amax = w_amax
            if not bool(recorded == amax):
                self._violate(
                    s1,
                    "amax",
                    f"the weight's recorded amax is {float(recorded):.9g}; max|W| of the weight "
                    f"the call used is {float(amax):.9g}",
                )

    def _violate(self, s, what, note):
        self.violations.append(
            {
                "op": s["op"],
                "quantizer": f"{s['role']}[{s['group']}]",
                "what": what,
                "note": note,
            }
        )

    def take(self):
        """The call's verdict ({"checked", "violations"}), and a fresh tally for the next."""
        out = {"checked": self.checked, "violations": self.violations}
        self.checked, self.violations = 0, []
        return out


def state_entry(op, pass_, role, group, history, scale, *, fp8_max, margin, algo):
    """One quantizer's state as Builder.delayed_states lists it: float32 copies taken now,
    on the state's device (to_host brings a snapshot's copies to the CPU together)."""
    return {
        "op": op,
        "pass": pass_,
        "role": role,
        "group": group,
        "history": history.detach().to(dtype=torch.float32).clone().reshape(-1),
        "scale": scale.detach().to(dtype=torch.float32).clone().reshape(-1),
        "fp8_max": fp8_max,
        "margin": margin,
        "algo": algo,
    }


def to_host(states):
    """`states` ({key: state_entry}) with every history and scale on the CPU, those on a
    device brought over in one copy: a snapshot of n quantizers waits for the device once,
    not 2n times (issue 27 item 4)."""
    parts = [
        (entry, name)
        for entry in states.values()
        for name in ("history", "scale")
        if entry[name].device.type != "cpu"
    ]
    if not parts:
        return states
    flat = torch.cat([entry[name] for entry, name in parts]).cpu()
    for (entry, name), value in zip(
        parts, flat.split([entry[name].numel() for entry, name in parts])
    ):
        entry[name] = value.clone()  # a storage of its own, as each copy had before
    return states
