"""FP8 recipes: the recipes a case may carry (docs/BACKENDS.md "Recipes": TE 2.20.2's
quantization in te.ops).

The recipe table both backends offer in `capabilities.recipes` and the parser of a spec's
`recipe` (RECIPES, parse_recipe, te_kwargs); MXFP8 and NVFP4 are listed but not emulated.
The torch backend's emulation of the recipes (quantize-dequantize, the quantizers,
OpQuantization, the delayed-scaling updates) lives in torch_backend/fp8.py, with FORMATS
(the FP8 formats as torch dtypes); FORMATS and the names exported upstream tests import from
here (export/torch_dialect.py: upstream_imports) are re-exported below.
"""

from dataclasses import dataclass

# Re-exported (fp8.py imports nothing of this module, so this makes no circle).
from .torch_backend.fp8 import (  # noqa: F401
    FORMATS,
    OpQuantization,
    current_scaling_qdq,
    update_after_backward,
    update_after_forward,
)

# ----------------------------------------------------------------------------------------
# The recipe table (docs/BACKENDS.md "The recipe in a case")

BACKWARD_OVERRIDES = ("none", "high_precision", "dequantized")
# Float8BlockScaling's (x, w, grad) block dims that __post_init__ accepts (no two 2D
# operands in one GEMM), the first being TE's default.
BLOCK_SCALING_DIMS = ("1,2,1", "1,1,1", "2,1,1", "1,1,2")


@dataclass(frozen=True)
class RecipeInfo:
    """One recipe as the backends offer it: its formats, the option values the generator
    draws (strings), TE's defaults (strings) and whether the torch backend emulates it."""

    fp8_formats: tuple
    default_format: str
    options: dict
    defaults: dict
    emulated: bool


_OVERRIDE = list(BACKWARD_OVERRIDES)
RECIPES = {
    "DelayedScaling": RecipeInfo(
        ("E4M3", "HYBRID"),
        "HYBRID",
        {
            "margin": ["0", "1", "3"],
            "amax_history_len": ["1", "2", "16", "1024"],
            "amax_compute_algo": ["max", "most_recent"],
        },
        {"margin": "0", "amax_history_len": "1024", "amax_compute_algo": "max"},
        True,
    ),
    "Float8CurrentScaling": RecipeInfo(
        ("E4M3", "HYBRID"),
        "HYBRID",
        {"use_power_2_scales": ["0", "1"], "backward_override": _OVERRIDE},
        {"use_power_2_scales": "0", "backward_override": "none"},
        True,
    ),
    "Float8BlockScaling": RecipeInfo(
        ("E4M3", "HYBRID"),
        "E4M3",
        {
            "block_scaling_dims": list(BLOCK_SCALING_DIMS),
            "use_f32_scales": ["0", "1"],
            "backward_override": _OVERRIDE,
        },
        {"block_scaling_dims": "1,2,1", "use_f32_scales": "0", "backward_override": "none"},
        True,
    ),
    "MXFP8BlockScaling": RecipeInfo(
        ("E4M3", "HYBRID"),
        "E4M3",
        {"enable_2d_quantization": ["0", "1"], "backward_override": _OVERRIDE},
        {"enable_2d_quantization": "0", "backward_override": "none"},
        False,
    ),
    "NVFP4BlockScaling": RecipeInfo(
        ("E4M3",),
        "E4M3",
        {
            "disable_rht": ["0", "1"],
            "disable_stochastic_rounding": ["0", "1"],
            "disable_2d_quantization": ["0", "1"],
            "backward_override": _OVERRIDE,
        },
        {
            "disable_rht": "0",
            "disable_stochastic_rounding": "0",
            "disable_2d_quantization": "0",
            "backward_override": "none",
        },
        False,
    ),
}


def _bool(key, value):
    if value not in ("0", "1"):
        raise ValueError(f'recipe option \'{key}\' must be "0" or "1", got {value!r}')
    return value == "1"


def _int(key, value, minimum):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or str(number) != value:
        raise ValueError(f"recipe option '{key}' must be an integer >= {minimum}, got {value!r}")
    return number


def _choice(key, value, choices):
    if value not in choices:
        raise ValueError(f"recipe option '{key}' must be one of {list(choices)}, got {value!r}")
    return value


# Option -> its parser (string -> Python value), for every option any recipe has.
_PARSERS = {
    "margin": lambda k, v: _int(k, v, 0),
    "amax_history_len": lambda k, v: _int(k, v, 1),
    "amax_compute_algo": lambda k, v: _choice(k, v, ("max", "most_recent")),
    "use_power_2_scales": _bool,
    "use_f32_scales": _bool,
    "enable_2d_quantization": _bool,
    "disable_rht": _bool,
    "disable_stochastic_rounding": _bool,
    "disable_2d_quantization": _bool,
    "backward_override": lambda k, v: _choice(k, v, BACKWARD_OVERRIDES),
    "block_scaling_dims": lambda k, v: tuple(
        int(d) for d in _choice(k, v, BLOCK_SCALING_DIMS).split(",")
    ),
}


@dataclass(frozen=True)
class Recipe:
    """A case's recipe: TE's class name, "E4M3" or "HYBRID", and every option of that
    recipe parsed (defaults filled in)."""

    name: str
    fp8_format: str
    options: dict

    def format_for(self, backward):
        """The FP8 format of a forward (input, weight) or backward (grad) tensor
        (quantization.py: get_fp8_te_dtype)."""
        return "E5M2" if backward and self.fp8_format == "HYBRID" else "E4M3"

    @property
    def backward_override(self):
        override = self.options.get("backward_override", "none")
        return None if override == "none" else override


def parse_recipe(obj):
    """The Recipe of a spec's `recipe` ({"name", "fp8_format", "options"}), or None for
    none. ValueError names what is wrong (an unknown recipe, format, option or value)."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError(f"recipe must be an object or null, got {obj!r}")
    name = obj.get("name")
    info = RECIPES.get(name)
    if info is None:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}")
    fmt = obj.get("fp8_format") or info.default_format
    if fmt not in info.fp8_formats:
        raise ValueError(f"{name}: fp8_format must be one of {list(info.fp8_formats)}, got {fmt!r}")
    given = dict(obj.get("options") or {})
    unknown = sorted(set(given) - set(info.defaults))
    if unknown:
        raise ValueError(
            f"{name}: unknown recipe options {unknown}; known: {sorted(info.defaults)}"
        )
    options = {}
    for key, default in info.defaults.items():
        value = given.get(key, default)
        options[key] = _PARSERS[key](key, str(value))
    return Recipe(name, fmt, options)


def te_kwargs(recipe):
    """Keyword arguments of TE's recipe dataclass (common/recipe/__init__.py) for `recipe`,
    fp8_format excepted (the caller passes Format.<fp8_format>)."""
    out = dict(recipe.options)
    if "backward_override" in out:
        out["backward_override"] = recipe.backward_override
    dims = out.pop("block_scaling_dims", None)
    if dims is not None:
        out["x_block_scaling_dim"], out["w_block_scaling_dim"], out["grad_block_scaling_dim"] = dims
    return out
