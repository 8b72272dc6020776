"""Delayed scaling's state in plain TE around a Sequential (issues "FP8 state" and "usage
surface"): the questions the te usage campaign's fp8_state clusters raised, asked of TE alone.

    python adapter/tests/probe_te_state.py --out $OUT/probe_te_state.json   # on the GPU

TE and torch only; float32 te.ops.BasicLinear ops under DelayedScaling(amax_history_len=4),
one GPU, a few seconds. Prints one line per check; the JSON holds the same. Exits 0 whatever
it finds. What each check reads is the forward amax history and scale of each op
(op.py: BasicOperation._fp8_metas["forward"]["scaling_fwd"]), columns input and weight.

1. eval-records-amax: after a training step, a no_grad forward under autocast: does it record
   its amaxes in history slot 0 (left there: autocast_exit updates only with grad enabled)?
2. second-sequential: the same op in a second te.ops.Sequential, one training step there: is
   the recorded amax consumed by the forward update (slot 0 back to 0) in one process?
3. checkpoint-after-train (control): two ops trained a step, state_dict through torch.save,
   fresh ops, load_state_dict: does every op hold the saved history and scale?
4. checkpoint-after-eval: the same with a no_grad forward before the save (slot 0 holds the
   eval's amax): op.py set_extra_state builds a fresh op's recipe state inside an autocast of
   its own; does that autocast's exit update (roll) the histories already loaded?
   checkpoint-after-eval-repaired: the same with set_extra_state run under torch.no_grad.
5. other-model-rolls: model A evaluated (slot 0 holding its eval amax), then model B trained
   a step: is A's history rolled by B's autocast exit (quantization.py:
   reduce_and_update_fp8_tensors walks every op ever registered in the process)?
6. recipe-off-keeps-state: two training steps, then one forward and backward outside the
   autocast (FP8 off): does the op still hold its history and scale (fuser.py maybe_fuse_ops
   resets each op's recipe state when the recipe type changes, None included)?
   recipe-off-keeps-state-module: the same with te.Linear (module/base.py keeps fp8_meta
   while FP8 is off): the module's behaviour for comparison.
7. history-len-change: three training steps with amax_history_len 4, then one with 2: the
   history's first two slots kept and the scale (op.py reset_recipe_state)?
8. history-len-change-trained: the same change, a training step after it, the op alone in
   the process (the global buffer reset first): does the step run (the control of 9-11)?
9. history-len-change-two-sequentials: two Sequentials trained a step under length 4, then
   only the first trained under length 2: does the step run? reset_recipe_state writes the
   resized history into the old recipe's global buffer slot, where the other op's
   4-row history stays; the fused update (delayed_scaling.cu
   amax_and_scale_update_after_reduction) takes the first history's length for all.
   history-len-change-two-modules: the same with two te.Linear (module/base.py
   adjust_amax_history_length does the same), for comparison.
10. history-len-change-after-checkpoint: an op trained under length 4, its state_dict loaded
   into a fresh op (set_extra_state registers it in the length-4 buffer beside the first),
   the fresh op trained under length 2: does the step run (the te campaign's crash case)?
11. eval-amax-keeps-max: a training step, then two no_grad forwards, the second on inputs a
   quarter the size: does the op's input history slot 0 keep the larger amax of the two (the
   cast kernels record with an atomic max) or the last one?
   eval-amax-keeps-max-gemm-output: the same for the second of two BasicLinear ops in one
   Sequential, whose input the first op's GEMM may hand on quantized (its amax written by
   the GEMM): the te campaign's Linear -> Linear eval-pass state cluster of 2026-12-07.
"""

import argparse
import io
import json
import os
import sys
import traceback

import torch

RESULTS = {"checks": []}
DEV = "cuda"


def report(name, ok, detail, **numbers):
    entry = {"check": name, "ok": ok, "detail": detail}
    entry.update({k: v for k, v in numbers.items()})
    RESULTS["checks"].append(entry)
    flag = {True: "yes ", False: "no  ", None: "err "}[ok]
    print(f"[{flag}] {name}: {detail}", flush=True)


def te_modules():
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    recipe = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=4, amax_compute_algo="max")
    return te, recipe


def linear(te, seed):
    torch.manual_seed(seed)
    return te.ops.BasicLinear(16, 16, device=DEV, dtype=torch.float32)


def state(op):
    meta = op._fp8_metas["forward"]["scaling_fwd"]
    return meta.amax_history.detach().clone().cpu(), meta.scale.detach().clone().cpu()


def listed(t):
    return [[float(v) for v in row] for row in t] if t.dim() == 2 else [float(v) for v in t]


def train(te, recipe, seq, seed):
    torch.manual_seed(seed)
    x = torch.randn(16, 16, device=DEV, requires_grad=True)
    with te.autocast(enabled=True, recipe=recipe):
        y = seq(x)
    y.float().square().sum().backward()
    torch.cuda.synchronize()


def evaluate(te, recipe, seq, seed, scale=3.0):
    torch.manual_seed(seed)
    x = scale * torch.randn(16, 16, device=DEV)
    with torch.no_grad(), te.autocast(enabled=True, recipe=recipe):
        seq(x)
    torch.cuda.synchronize()


def round_trip(te, recipe, ops):
    """state_dict of `ops` through torch.save, loaded into fresh ops (other weights)."""
    blob = io.BytesIO()
    torch.save([op.state_dict() for op in ops], blob)
    blob.seek(0)
    fresh = [linear(te, 100 + k) for k in range(len(ops))]
    saved = os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE")
    os.environ["NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"] = "1"  # the checkpoint is our own
    try:
        for op, sd in zip(fresh, torch.load(blob, weights_only=False)):
            op.load_state_dict(sd)
    finally:
        if saved is None:
            del os.environ["NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"]
        else:
            os.environ["NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"] = saved
    torch.cuda.synchronize()
    return fresh


def check(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
        report(fn.__name__, None, f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())


def eval_records_amax():
    te, recipe = te_modules()
    op = linear(te, 1)
    seq = te.ops.Sequential(op)
    train(te, recipe, seq, 2)
    before, _ = state(op)
    evaluate(te, recipe, seq, 3)
    after, _ = state(op)
    recorded = bool((after[0] != 0).any())
    report(
        "eval-records-amax",
        recorded,
        f"slot 0 after the training step {listed(before[0])}, after the no_grad forward "
        f"{listed(after[0])}",
        before=listed(before),
        after=listed(after),
    )


def second_sequential():
    te, recipe = te_modules()
    op = linear(te, 1)
    train(te, recipe, te.ops.Sequential(op), 2)
    before, scale_before = state(op)
    train(te, recipe, te.ops.Sequential(op), 3)
    after, scale_after = state(op)
    consumed = bool((after[0] == 0).all())
    report(
        "second-sequential",
        consumed,
        f"after a step in a second Sequential: slot 0 {listed(after[0])}, history rows "
        f"{listed(after)}, scale {listed(scale_before)} -> {listed(scale_after)}",
        before=listed(before),
        after=listed(after),
    )


def _checkpoint(with_eval):
    te, recipe = te_modules()
    ops = [linear(te, 1), linear(te, 2)]
    seq = te.ops.Sequential(*ops)
    train(te, recipe, seq, 3)
    if with_eval:
        evaluate(te, recipe, seq, 4)
    saved = [state(op) for op in ops]
    fresh = round_trip(te, recipe, ops)
    loaded = [state(op) for op in fresh]
    same = [
        bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])) for a, b in zip(saved, loaded)
    ]
    return same, saved, loaded


def checkpoint_after_train():
    same, saved, loaded = _checkpoint(with_eval=False)
    report(
        "checkpoint-after-train",
        all(same),
        f"each op's loaded history and scale equal the saved: {same}",
        saved=[listed(h) for h, _ in saved],
        loaded=[listed(h) for h, _ in loaded],
    )


def checkpoint_after_eval():
    same, saved, loaded = _checkpoint(with_eval=True)
    report(
        "checkpoint-after-eval",
        all(same),
        f"each op's loaded history and scale equal the saved: {same}; op 0 saved "
        f"{listed(saved[0][0])} scale {listed(saved[0][1])}, loaded {listed(loaded[0][0])} "
        f"scale {listed(loaded[0][1])}",
        saved=[listed(h) for h, _ in saved],
        loaded=[listed(h) for h, _ in loaded],
    )


def checkpoint_after_eval_repaired():
    """Check 4 with set_extra_state run under torch.no_grad (a repair: its autocast's exit then
    runs no forward update, quantization.py autocast_exit)."""
    te, _ = te_modules()
    cls = te.ops.BasicOperation
    original = cls.set_extra_state

    def no_update(self, state):
        with torch.no_grad():
            original(self, state)

    cls.set_extra_state = no_update
    try:
        same, saved, loaded = _checkpoint(with_eval=True)
    finally:
        cls.set_extra_state = original
    report(
        "checkpoint-after-eval-repaired",
        all(same),
        f"set_extra_state under no_grad: each op's loaded history and scale equal the saved: "
        f"{same}",
        saved=[listed(h) for h, _ in saved],
        loaded=[listed(h) for h, _ in loaded],
    )


def other_model_rolls():
    te, recipe = te_modules()
    a, b = linear(te, 1), linear(te, 2)
    seq_a, seq_b = te.ops.Sequential(a), te.ops.Sequential(b)
    train(te, recipe, seq_a, 3)
    evaluate(te, recipe, seq_a, 4)
    before, _ = state(a)
    train(te, recipe, seq_b, 5)
    after, _ = state(a)
    untouched = bool(torch.equal(before, after))
    report(
        "other-model-rolls",
        not untouched,
        f"model A's history before model B's step {listed(before)}, after {listed(after)}",
        before=listed(before),
        after=listed(after),
    )


def recipe_off_keeps_state():
    te, recipe = te_modules()
    op = linear(te, 1)
    seq = te.ops.Sequential(op)
    train(te, recipe, seq, 2)
    train(te, recipe, seq, 3)
    before = state(op)
    torch.manual_seed(4)
    x = torch.randn(16, 16, device=DEV, requires_grad=True)
    seq(x).square().sum().backward()  # FP8 off: no autocast
    torch.cuda.synchronize()
    metas = op._fp8_metas
    if metas is None or metas.get("forward") is None:
        report(
            "recipe-off-keeps-state",
            False,
            f"after the call with FP8 off the op's _fp8_metas is {metas!r}; before it "
            f"history {listed(before[0])}, scale {listed(before[1])}",
        )
    else:
        after = state(op)
        kept = bool(torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]))
        report(
            "recipe-off-keeps-state",
            kept,
            f"history {listed(before[0])} -> {listed(after[0])}, scale {listed(before[1])} -> "
            f"{listed(after[1])}",
        )
    train(te, recipe, seq, 5)
    report(
        "recipe-off-next-step",
        True,
        f"after the next training step: history {listed(state(op)[0])}, scale "
        f"{listed(state(op)[1])} (the state the step started from decides the scale it used)",
    )


def recipe_off_keeps_state_module():
    te, recipe = te_modules()
    torch.manual_seed(1)
    module = te.Linear(16, 16, bias=False, device=DEV, params_dtype=torch.float32)
    train(te, recipe, module, 2)
    train(te, recipe, module, 3)
    meta = module.fp8_meta["scaling_fwd"]
    before = meta.amax_history.detach().clone().cpu(), meta.scale.detach().clone().cpu()
    torch.manual_seed(4)
    x = torch.randn(16, 16, device=DEV, requires_grad=True)
    module(x).square().sum().backward()
    torch.cuda.synchronize()
    meta = module.fp8_meta.get("scaling_fwd")
    if meta is None:
        report("recipe-off-keeps-state-module", False, "te.Linear dropped its fp8_meta")
        return
    after = meta.amax_history.detach().clone().cpu(), meta.scale.detach().clone().cpu()
    kept = bool(torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]))
    report(
        "recipe-off-keeps-state-module",
        kept,
        f"te.Linear: history {listed(before[0])} -> {listed(after[0])}, scale "
        f"{listed(before[1])} -> {listed(after[1])}",
    )


def history_len_change():
    te, recipe = te_modules()
    from transformer_engine.common.recipe import DelayedScaling, Format

    op = linear(te, 1)
    seq = te.ops.Sequential(op)
    for seed in (2, 3, 4):
        train(te, recipe, seq, seed)
    before = state(op)
    shorter = DelayedScaling(fp8_format=Format.E4M3, amax_history_len=2, amax_compute_algo="max")
    torch.manual_seed(5)
    x = torch.randn(16, 16, device=DEV)
    with torch.no_grad(), te.autocast(enabled=True, recipe=shorter):
        seq(x)  # no update (no grad): what the resize left, plus this call's amax in slot 0
    torch.cuda.synchronize()
    after = state(op)
    kept = bool(
        after[0].shape[0] == 2
        and torch.equal(after[0][1:], before[0][1:2])
        and torch.equal(after[1], before[1])
    )
    report(
        "history-len-change",
        kept,
        f"history {listed(before[0])} -> {listed(after[0])}, scale {listed(before[1])} -> "
        f"{listed(after[1])}",
    )


def fresh_process_state():
    """Forget every op registered in the global FP8 buffers by the checks before."""
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    FP8GlobalStateManager.reset()


def _shorter():
    from transformer_engine.common.recipe import DelayedScaling, Format

    return DelayedScaling(fp8_format=Format.E4M3, amax_history_len=2, amax_compute_algo="max")


def _step_runs(name, detail, fn):
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the answer is whether it raises
        report(name, False, f"{detail}: {type(exc).__name__}: {str(exc)[:300]}")
        return
    report(name, True, f"{detail}: the step ran")


def history_len_change_trained():
    fresh_process_state()
    te, recipe = te_modules()
    op = linear(te, 1)
    seq = te.ops.Sequential(op)
    train(te, recipe, seq, 2)
    _step_runs(
        "history-len-change-trained",
        "one op, length 4 then a training step under length 2",
        lambda: train(te, _shorter(), seq, 3),
    )


def _change_beside_a_second_model(te, recipe, name, detail, first, second):
    """Both models trained a step under `recipe` (length 4), then the first under length 2."""
    train(te, recipe, first, 3)
    train(te, recipe, second, 4)
    _step_runs(name, detail, lambda: train(te, _shorter(), first, 5))


def history_len_change_two_sequentials():
    fresh_process_state()
    te, recipe = te_modules()
    _change_beside_a_second_model(
        te,
        recipe,
        "history-len-change-two-sequentials",
        "two te.ops Sequentials trained under length 4, the first then trained under length 2",
        te.ops.Sequential(linear(te, 1)),
        te.ops.Sequential(linear(te, 2)),
    )


def history_len_change_two_modules():
    fresh_process_state()
    te, recipe = te_modules()
    torch.manual_seed(1)
    _change_beside_a_second_model(
        te,
        recipe,
        "history-len-change-two-modules",
        "two te.Linear trained under length 4, the first then trained under length 2",
        te.Linear(16, 16, device=DEV, params_dtype=torch.float32),
        te.Linear(16, 16, device=DEV, params_dtype=torch.float32),
    )


def history_len_change_after_checkpoint():
    fresh_process_state()
    te, recipe = te_modules()
    op = linear(te, 1)
    train(te, recipe, te.ops.Sequential(op), 2)
    (fresh,) = round_trip(te, recipe, [op])
    _step_runs(
        "history-len-change-after-checkpoint",
        "an op trained under length 4, loaded into a fresh op, the fresh op trained under length 2",
        lambda: train(te, _shorter(), te.ops.Sequential(fresh), 3),
    )


def _eval_amax_keeps_max(name, two_ops):
    fresh_process_state()
    te, recipe = te_modules()
    first = linear(te, 41)
    ops = [first, linear(te, 42)] if two_ops else [first]
    seq = te.ops.Sequential(*ops)
    watched = ops[-1]
    train(te, recipe, seq, 43)
    evaluate(te, recipe, seq, 44, scale=4.0)
    large, _ = state(watched)
    evaluate(te, recipe, seq, 45, scale=1.0)
    after, _ = state(watched)
    kept = bool(after[0][0] >= large[0][0])
    report(
        name,
        kept,
        f"input history slot 0 after the larger eval {float(large[0][0]):.6g}, after the smaller "
        f"{float(after[0][0]):.6g} (history {listed(after[:, 0])})",
    )


def eval_amax_keeps_max():
    _eval_amax_keeps_max("eval-amax-keeps-max", two_ops=False)


def eval_amax_keeps_max_gemm_output():
    _eval_amax_keeps_max("eval-amax-keeps-max-gemm-output", two_ops=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import transformer_engine

    RESULTS["versions"] = {"torch": torch.__version__, "te": transformer_engine.__version__}
    RESULTS["device"] = torch.cuda.get_device_name()
    for fn in (
        eval_records_amax,
        second_sequential,
        checkpoint_after_train,
        checkpoint_after_eval,
        checkpoint_after_eval_repaired,
        other_model_rolls,
        recipe_off_keeps_state,
        recipe_off_keeps_state_module,
        history_len_change,
        history_len_change_trained,
        history_len_change_two_sequentials,
        history_len_change_two_modules,
        history_len_change_after_checkpoint,
        eval_amax_keeps_max,
        eval_amax_keeps_max_gemm_output,
    ):
        check(fn)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(RESULTS, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
