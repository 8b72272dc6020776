"""FP8 recipes on TE (docs/BACKENDS.md "Recipes"): which recipes this machine runs, TE's
recipe object for a case's recipe, and the autocast a path's calls run under.

The recipe table and the spec parser are gradfuzz_adapter/recipes.py's (shared with the
torch backend's emulation); this module only asks TE. Functions take the imported
`transformer_engine.pytorch` module, so nothing here imports TE by itself.
"""

import contextlib
import dataclasses

from ..recipes import RECIPES, te_kwargs

# Recipe -> TE's availability check (quantization.py, exported by pytorch/__init__.py);
# each returns (available, reason) with return_reason=True.
AVAILABILITY = {
    "DelayedScaling": "is_fp8_available",
    "Float8CurrentScaling": "is_fp8_available",
    "Float8BlockScaling": "is_fp8_block_scaling_available",
    "MXFP8BlockScaling": "is_mxfp8_available",
    "NVFP4BlockScaling": "is_nvfp4_available",
}


def availability(te, name):
    """(available, reason) for recipe `name` as TE reports it. A check that itself fails
    (no CUDA driver: the checks read the device's compute capability) is "not available",
    with the failure as the reason."""
    check = getattr(te, AVAILABILITY[name], None)
    if check is None:
        return False, f"this TE has no {AVAILABILITY[name]}()"
    try:
        available, reason = check(return_reason=True)
    except Exception as exc:  # noqa: BLE001 - the check's own failure is the reason
        return False, f"{AVAILABILITY[name]}() failed: {type(exc).__name__}: {exc}"
    return bool(available), "" if available else str(reason)


# Recipe options that choose the quantizers' power-of-2 scales, and the value -> whether the
# recipe's docstring says the scales are powers of 2. te.ops configures its quantizers from
# the recipe's class attributes fp8_quant_fwd_inp / fp8_quant_fwd_weight /
# fp8_quant_bwd_grad (ops/basic/basic_linear.py and grouped_linear.py: reset_recipe_state;
# quantization.py: Float8BlockScalingRecipeState.make_quantizers), which
# common/recipe/__init__.py computes once, at import, from an environment variable: the
# dataclass field does not reach them (TE 2.20.2).
POWER_OF_2_OPTIONS = {
    ("Float8CurrentScaling", "use_power_2_scales"): lambda value: value == "1",
    ("Float8BlockScaling", "use_f32_scales"): lambda value: value == "0",
}
_QUANTIZER_PARAMS = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")


def honoured_values(name, option, values):
    """The values of a power-of-2 option (POWER_OF_2_OPTIONS) whose documented meaning is
    what TE's quantizers then do, read from the recipe objects TE builds for each value;
    the other options' values unchanged. A value TE ignores is left out: the reference
    quantizes as the option documents, so such a case would hold TE to scales it never
    uses (docs/TE.md, "What TE does that the reference did not"). Returns (kept, left out)."""
    documented = POWER_OF_2_OPTIONS.get((name, option))
    if documented is None:
        return list(values), []
    from transformer_engine.common import recipe as te_recipe

    cls = getattr(te_recipe, name)
    kept, left_out = [], []
    for value in values:
        try:
            obj = cls(**{option: value == "1"})
            powers = {getattr(obj, attr).power_2_scale for attr in _QUANTIZER_PARAMS}
        except Exception:  # noqa: BLE001 - a recipe TE cannot build keeps its values
            return list(values), []
        (kept if powers == {documented(value)} else left_out).append(value)
    return (kept, left_out) if kept else (list(values), [])


def capabilities(te):
    """capabilities.recipes (docs/BACKENDS.md Protocol 2), one entry per recipe of
    recipes.RECIPES, available where TE says so, with the option values TE honours
    (`not_honoured`: the values left out)."""
    out = []
    for name, info in RECIPES.items():
        available, reason = availability(te, name)
        options, not_honoured = {}, {}
        for option, values in info.options.items():
            options[option], left_out = honoured_values(name, option, values)
            if left_out:
                not_honoured[option] = left_out
        entry = {
            "name": name,
            "available": available,
            "reason": reason,
            "fp8_formats": list(info.fp8_formats),
            "options": options,
        }
        if not_honoured:
            entry["not_honoured"] = not_honoured
        out.append(entry)
    return out


# How Hopper's FP8 MMA accumulates (docs/BACKENDS.md "FP8 GEMM accumulation"; measured on
# the H200: ops/quantization.h emulate_fp8_gemm reproduces TE's fprop, dgrad and wgrad
# values bit for bit): 32 products per step, 13 fraction bits, truncation. cuBLASLt's split
# accumulation promotes into fp32 at the latest every 128 products (block scaling's K
# blocks); for per-tensor scaling the interval is not documented (BACKENDS.md "Not pinned").
HOPPER_FP8_ACCUMULATION = {"fraction_bits": 13, "products_per_step": 32, "promotion_products": 128}


def gemm_accumulation(device_capability):
    """capabilities.fp8_gemm_accumulation for a device of `device_capability` ((major,
    minor), or None without a GPU): Hopper's (9, 0) with the GEMMs te.ops runs with fast
    accumulation per recipe, or None where the accumulation is not pinned. te.ops passes
    module/base.py's _2X_ACC_FPROP / _DGRAD / _WGRAD as use_split_accumulator whatever the
    recipe's fp8_gemm_* say (basic_linear.py, grouped_linear.py), and general_gemm forces
    split accumulation for block-scaled operands (cpp_extensions/gemm.py)."""
    if device_capability is None or tuple(device_capability) != (9, 0):
        return None
    from transformer_engine.pytorch.module import base

    split = {"fprop": base._2X_ACC_FPROP, "dgrad": base._2X_ACC_DGRAD, "wgrad": base._2X_ACC_WGRAD}
    fast = [gemm for gemm, is_split in split.items() if not is_split]
    return dict(
        HOPPER_FP8_ACCUMULATION,
        fast_accumulation={
            "DelayedScaling": fast,
            "Float8CurrentScaling": fast,
            "Float8BlockScaling": [],
        },
    )


def make_recipe(recipe):
    """TE's recipe object for a recipes.Recipe, as a user writes it:
    transformer_engine.common.recipe.<name>(fp8_format=Format.<fp8_format>, **options)."""
    from transformer_engine.common import recipe as te_recipe

    cls = getattr(te_recipe, recipe.name)
    return cls(fp8_format=te_recipe.Format[recipe.fp8_format], **te_kwargs(recipe))


def with_amax_history_len(te_recipe, length):
    """A recipe object of `te_recipe`'s class with the same field values but
    amax_history_len=`length` (spec.repeat_calls[k].amax_history_len), built anew, as a user
    who changes the option writes it: TE's recipes are dataclasses
    (common/recipe/__init__.py), their __post_init__ checks run again. Only DelayedScaling
    has the option (ValueError for another recipe)."""
    if te_recipe is None or not te_recipe.delayed():
        name = type(te_recipe).__name__ if te_recipe is not None else "no recipe"
        raise ValueError(f"amax_history_len is an option of DelayedScaling, not of {name}")
    return dataclasses.replace(te_recipe, amax_history_len=int(length))


def quantized_model_init(te, te_recipe):
    """The context under which TE's modules are built holding quantized parameters of
    `te_recipe` (quantization.py: quantized_model_init, exported by pytorch/__init__.py;
    fp8_model_init is its deprecated name): a BasicLinear built inside it keeps its weight
    as a quantized tensor (basic_linear.py: __init__ reads with_fp8_parameters() into
    _with_quantized_weight, reset_parameters quantizes)."""
    init = getattr(te, "quantized_model_init", None)
    if init is None:
        from transformer_engine.pytorch.quantization import quantized_model_init as init
    return init(enabled=True, recipe=te_recipe)


@contextlib.contextmanager
def fp8_state(state):
    """Runs the body with `state` as TE's process-global quantization state
    (quantization.py: FP8GlobalStateManager.quantization_state, which holds every delayed-
    scaling op's amax history that an update walks), restoring the previous one after."""
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    saved = FP8GlobalStateManager.quantization_state
    FP8GlobalStateManager.quantization_state = state
    try:
        yield
    finally:
        FP8GlobalStateManager.quantization_state = saved


def fresh_fp8_state():
    """A new, empty quantization state (what FP8GlobalStateManager.reset() installs)."""
    from transformer_engine.pytorch.quantization import FP8GlobalState

    return FP8GlobalState()
