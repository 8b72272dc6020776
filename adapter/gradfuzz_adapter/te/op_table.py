"""The one table of the te backend's ops: which te.ops class stands for each catalog op, with
which constructor arguments, and which of its options the generator draws.

Everything per op derives from OPS: op_recipe() (the constructor call, for the backend and
for exported scripts), te_options() (the generator's option domains in `hello`),
TE_CLASSES and CUSTOM_OPS. TE-free: the exporter imports it to write te scripts.
Citations are to TE 2.20.2's source (transformer_engine/pytorch/ops/...), as file:function.
"""

from collections.abc import Callable
from dataclasses import dataclass, field


class Symbol:
    """A name in generated code (DEVICE, DTYPE) that the backend replaces by a value."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


DEVICE = Symbol("DEVICE")
DTYPE = Symbol("DTYPE")
_DEV = {"device": DEVICE, "dtype": DTYPE}


def _flag(attrs, name):
    return float(attrs.get(name, 0)) == 1.0


@dataclass(frozen=True)
class TEOp:
    """How one catalog op is built on te.ops.

    `implementation`: the dotted callee ("te.ops.BasicLinear") or, for ops TE lacks, the
    name of a class in te/extensions.py. `build(attrs, features, output_style)` returns the
    constructor's (args, kwargs). `options`: attr -> the values the generator may draw on
    this backend (a catalog attr or one of TE's constructor options). `custom`: written in
    te/extensions.py, and the only ops with a "generator" output style."""

    implementation: str
    build: Callable
    options: dict = field(default_factory=dict)
    custom: bool = False


# Catalog tensor_parallel_mode -> BasicLinear's (basic_linear.py:
# BasicLinear._canonicalize_tensor_parallelism).
TENSOR_PARALLEL_MODES = {1: "column", 2: "row"}


def _linear(attrs, features, style):
    # basic_linear.py: BasicLinear.__init__(in_features, out_features, *, device, dtype,
    # tensor_parallel_mode, tensor_parallel_group, sequence_parallel, ...,
    # accumulate_into_main_grad); weight [out, in] like the model's. With a mode, the sizes
    # are the unsharded ones and TE splits them over the group (the default: the world).
    kwargs = dict(_DEV, accumulate_into_main_grad=_flag(attrs, "accumulate_into_main_grad"))
    mode = TENSOR_PARALLEL_MODES.get(int(float(attrs.get("tensor_parallel_mode", 0))))
    if mode is not None:
        kwargs["tensor_parallel_mode"] = mode
        kwargs["sequence_parallel"] = _flag(attrs, "sequence_parallel")
    return (features, int(attrs.get("out", 16))), kwargs


def _bias(attrs, features, style):
    # bias.py: Bias.__init__(size, *, device, dtype, tensor_parallel, tensor_parallel_group)
    if _flag(attrs, "tensor_parallel"):
        return (features,), dict(_DEV, tensor_parallel=True)
    return (features,), dict(_DEV)


def _constant_scale(attrs, features, style):
    return (float(attrs.get("scale", 0.5)),), {}  # constant_scale.py: ConstantScale(scale)


def _activation(attrs, features, style):
    # activation.py: _ActivationOperation.__init__(*, cache_quantized_input)
    return (), {"cache_quantized_input": _flag(attrs, "cache_quantized_input")}


def _swiglu(attrs, features, style):
    # swiglu.py: SwiGLU.__init__(*, cache_quantized_input, glu_interleave_size)
    return (), {
        "cache_quantized_input": _flag(attrs, "cache_quantized_input"),
        "glu_interleave_size": int(attrs.get("interleave", 0)) or None,
    }


def _scaled_swiglu(attrs, features, style):
    # swiglu.py: _ScaledGLU.__init__(glu_interleave_size=None, *, activation_recompute_in_mlp)
    return (), {
        "glu_interleave_size": int(attrs.get("interleave", 0)) or None,
        "activation_recompute_in_mlp": _flag(attrs, "activation_recompute_in_mlp"),
    }


def _scaled_srelu(attrs, features, style):
    # activation.py: _ScaledUnary.__init__(*, activation_recompute_in_mlp)
    return (), {"activation_recompute_in_mlp": _flag(attrs, "activation_recompute_in_mlp")}


def _in_place(attrs, features, style):
    # make_extra_output.py / add_extra_input.py: __init__(*, in_place)
    return (), {"in_place": _flag(attrs, "in_place")}


def _grouped_linear(attrs, features, style):
    # grouped_linear.py: GroupedLinear.__init__(num_groups, in_features, out_features, *,
    # bias, device, dtype, ..., accumulate_into_main_grad, single_grouped_weight,
    # single_grouped_bias, delay_wgrad_compute, scale_bias)
    return (int(attrs.get("groups", 2)), features, int(attrs.get("out", 16))), dict(
        _DEV,
        bias=float(attrs.get("bias", 1)) == 1.0,
        accumulate_into_main_grad=_flag(attrs, "accumulate_into_main_grad"),
        single_grouped_weight=_flag(attrs, "single_grouped_weight"),
        single_grouped_bias=_flag(attrs, "single_grouped_bias"),
        delay_wgrad_compute=_flag(attrs, "delay_wgrad_compute"),
        scale_bias=_flag(attrs, "scale_bias"),
    )


def _norm(attrs, features, style):
    # rmsnorm.py / layer_norm.py: __init__(normalized_shape, *, eps, device, dtype,
    # zero_centered_gamma, sm_margin); weight (and LayerNorm's bias) are gamma (beta).
    return (features,), dict(
        eps=float(attrs.get("eps", 1e-5)),
        **_DEV,
        zero_centered_gamma=_flag(attrs, "zero_centered_gamma"),
        sm_margin=int(attrs.get("sm_margin", 0)),
    )


def _reshape(attrs, features, style):
    target = int(attrs.get("features", 0)) or features
    return ((-1, target),), {}  # reshape.py: Reshape.__init__(shape)


def _no_args(attrs, features, style):
    return (), {}


def _dispatch(attrs, features, style):
    return (int(attrs.get("groups", 2)),), {"output_style": style}


def _styled(attrs, features, style):
    return (), {"output_style": style}


def _dual_extra_output(attrs, features, style):
    s0, s1 = float(attrs.get("s0", 0.5)), float(attrs.get("s1", -1.5))
    return (s0, s1), {"output_style": style}


# cache_quantized_input=1 keeps the activation's input for backward as FP8 E4M3 with its
# own current-scaling quantizer, with or without a recipe (activation.py:
# _ActivationOperation.op_forward, swiglu.py: SwiGLU.op_forward; docs/BACKENDS.md
# "Recipes"): the reference quantizes the saved input the same way, so it is drawn again.
_ACTIVATION_OPTIONS = {"cache_quantized_input": [0, 1]}

OPS = {
    "Linear": TEOp("te.ops.BasicLinear", _linear, {"accumulate_into_main_grad": [0, 1]}),
    "Bias": TEOp("te.ops.Bias", _bias),
    "ConstantScale": TEOp("te.ops.ConstantScale", _constant_scale),
    "ReLU": TEOp("te.ops.ReLU", _activation, _ACTIVATION_OPTIONS),
    "GELU": TEOp("te.ops.GELU", _activation, _ACTIVATION_OPTIONS),
    "SReLU": TEOp("te.ops.SReLU", _activation, _ACTIVATION_OPTIONS),
    # SwiGLU deinterleaves in Python (swiglu.py: SwiGLU.op_forward): any block size.
    "SwiGLU": TEOp("te.ops.SwiGLU", _swiglu, dict(_ACTIVATION_OPTIONS, interleave=[0, 1, 2, 4])),
    # ScaledSwiGLU's kernel takes multiples of 32 only (te/classify.py: UNSUPPORTED); and
    # swiglu.py: _ScaledGLU.__init__ rejects activation_recompute_in_mlp=True ("Must be
    # False" in ScaledSwiGLU's docstring), so only 0 is drawn.
    "ScaledSwiGLU": TEOp(
        "te.ops.ScaledSwiGLU",
        _scaled_swiglu,
        {"interleave": [0, 32], "activation_recompute_in_mlp": [0]},
    ),
    "ScaledSReLU": TEOp(
        "te.ops.ScaledSReLU", _scaled_srelu, {"activation_recompute_in_mlp": [0, 1]}
    ),
    "MakeExtraOutput": TEOp("te.ops.MakeExtraOutput", _in_place, {"in_place": [0, 1]}),
    "AddExtraInput": TEOp("te.ops.AddExtraInput", _in_place, {"in_place": [0, 1]}),
    "GroupedLinear": TEOp(
        "te.ops.GroupedLinear",
        _grouped_linear,
        {
            "bias": [0, 1],
            "scale_bias": [0, 1],
            "accumulate_into_main_grad": [0, 1],
            # Only where the machine runs them (te_options: single_grouped_params).
            "single_grouped_weight": [0, 1],
            "single_grouped_bias": [0, 1],
            "delay_wgrad_compute": [0, 1],
        },
    ),
    "RMSNorm": TEOp("te.ops.RMSNorm", _norm, {"zero_centered_gamma": [0, 1], "sm_margin": [0, 1]}),
    "LayerNorm": TEOp(
        "te.ops.LayerNorm", _norm, {"zero_centered_gamma": [0, 1], "sm_margin": [0, 1]}
    ),
    "Reshape": TEOp("te.ops.Reshape", _reshape),
    "Identity": TEOp("te.ops.Identity", _no_args),
    # all_gather.py, reduce_scatter.py, all_reduce.py: __init__(process_group=None): the
    # world group of the ranks (ranks.py).
    "AllGather": TEOp("te.ops.AllGather", _no_args),
    "ReduceScatter": TEOp("te.ops.ReduceScatter", _no_args),
    "AllReduce": TEOp("te.ops.AllReduce", _no_args),
    "Dispatch": TEOp("Dispatch", _dispatch, custom=True),
    "Combine": TEOp("Combine", _styled, custom=True),
    "RowStat": TEOp("RowStat", _styled, custom=True),
    "DualExtraOutput": TEOp("DualExtraOutput", _dual_extra_output, custom=True),
}

# The ops written in te/extensions.py, not in TE.
CUSTOM_OPS = tuple(name for name, op in OPS.items() if op.custom)
# Catalog op -> its te.ops class, for TE's own ops.
TE_CLASSES = {name: op.implementation for name, op in OPS.items() if not op.custom}
SINGLE_GROUPED_OPTIONS = ("single_grouped_weight", "single_grouped_bias")


# TE's defaults of the keyword arguments OPS's builders pass (basic/*.py: __init__), so that a
# test written for TE's maintainers spells only what differs (export/te_dialect.py).
CONSTRUCTOR_DEFAULTS = {
    "accumulate_into_main_grad": False,
    "sequence_parallel": False,
    "tensor_parallel": False,
    "cache_quantized_input": False,
    "glu_interleave_size": None,
    "activation_recompute_in_mlp": False,
    "in_place": False,
    "bias": True,
    "single_grouped_weight": False,
    "single_grouped_bias": False,
    "delay_wgrad_compute": False,
    "scale_bias": False,
    "eps": 1e-5,
    "zero_centered_gamma": False,
    "sm_margin": 0,
    "output_style": "vector",
}


def splits_itself(name, attrs):
    """Whether te.ops splits op `name` over the ranks itself (a tensor-parallel Linear or
    Bias): it is then given the unsharded sizes."""
    if name == "Linear":
        return float(attrs.get("tensor_parallel_mode", 0)) != 0
    return name == "Bias" and _flag(attrs, "tensor_parallel")


def op_recipe(name, attrs, input_shape, output_style="vector", global_input_shape=None):
    """(callee, args, kwargs) that build catalog op `name` with te.ops: callee is a dotted
    name ("te.ops.BasicLinear", or a te/extensions.py class "Dispatch"); DEVICE and DTYPE
    stand for the case's device and dtype. Attrs are the catalog's with TE's option names
    (accumulate_into_main_grad, cache_quantized_input, ...) alongside. On a rank of a
    distributed case `input_shape` is the rank's and `global_input_shape` the unsharded one,
    which an op that splits itself is given (splits_itself). Raises NotImplementedError for
    an op without a mapping or a style the op cannot have."""
    op = OPS.get(name)
    if op is None:
        raise NotImplementedError(f"the te backend has no mapping for catalog op '{name}'")
    if output_style != "vector" and not op.custom:
        # TE's own ops return tuples; only the adapter's custom ops have a generator style.
        raise NotImplementedError(f"te.ops has no '{output_style}' output style for {name}")
    shape = global_input_shape if global_input_shape and splits_itself(name, attrs) else input_shape
    args, kwargs = op.build(attrs, int(shape[-1]), output_style)
    return op.implementation, args, kwargs


def render_call(callee, args, kwargs):
    """Python source of a recipe's constructor call."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{callee}({', '.join(parts)})"


def te_options(single_grouped_params=True):
    """Per catalog op with options: attr -> the values the generator draws for TE.
    `single_grouped_params`: whether this machine runs GroupedLinear's single grouped
    weight/bias (else only 0 is drawn for them)."""
    out = {}
    for name, op in OPS.items():
        if not op.options:
            continue
        options = {k: list(v) for k, v in op.options.items()}
        if not single_grouped_params:
            for key in SINGLE_GROUPED_OPTIONS:
                if key in options:
                    options[key] = [0]
        out[name] = options
    return out
