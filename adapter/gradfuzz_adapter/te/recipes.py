"""FP8 recipes on TE (docs/BACKENDS.md "Recipes"): which recipes this machine runs, TE's
recipe object for a case's recipe, and the autocast a path's calls run under.

The recipe table and the spec parser are gradfuzz_adapter/recipes.py's (shared with the
torch backend's emulation); this module only asks TE. Functions take the imported
`transformer_engine.pytorch` module, so nothing here imports TE by itself.
"""

import contextlib

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


def capabilities(te):
    """capabilities.recipes (docs/BACKENDS.md Protocol 2), one entry per recipe of
    recipes.RECIPES, available where TE says so."""
    out = []
    for name, info in RECIPES.items():
        available, reason = availability(te, name)
        out.append(
            {
                "name": name,
                "available": available,
                "reason": reason,
                "fp8_formats": list(info.fp8_formats),
                "options": {k: list(v) for k, v in info.options.items()},
            }
        )
    return out


def make_recipe(recipe):
    """TE's recipe object for a recipes.Recipe, as a user writes it:
    transformer_engine.common.recipe.<name>(fp8_format=Format.<fp8_format>, **options)."""
    from transformer_engine.common import recipe as te_recipe

    cls = getattr(te_recipe, recipe.name)
    return cls(fp8_format=te_recipe.Format[recipe.fp8_format], **te_kwargs(recipe))


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
