"""The torch backend's FP8 emulation of the recipes (docs/BACKENDS.md "Recipes": TE 2.20.2's
quantization in te.ops), in plain PyTorch; the recipe table and the parser of a spec's `recipe`
are gradfuzz_adapter/recipes.py's (shared with the te backend).

Quantize-dequantize with torch.float8_e4m3fn / torch.float8_e5m2 at the points te.ops
quantizes (a Linear's input, weight and grad_output; per GroupedLinear group; an
activation's cached input with cache_quantized_input), with TE's scale rules (current,
delayed with an amax history per quantizer, 1x128 / 128x128 blocks). MXFP8 and NVFP4 are
listed in the table but not emulated.

Imports only torch, the error classes and the catalog (embedded before it), so exported
torch scripts can embed it between catalog.py and the runtime (runtime.py). GEMMs on quantized
operands run in float64 on the dequantized values (exact products of FP8 values and fp32
scales) and round to the case's dtype once, as an fp32-accumulating FP8 GEMM does up to its
accumulation order.
"""

import contextlib

import torch

from ..catalog import (
    apply,
    check_2d,
    check_row_vector,
    check_split_sizes,
    gelu,
    relu,
    srelu,
    swiglu,
)
from ..errors import InvalidArgumentError

# FP8 format -> (torch dtype, largest finite value: common/recipe/__init__.py Format).
FORMATS = {
    "E4M3": (torch.float8_e4m3fn, 448.0),
    "E5M2": (torch.float8_e5m2, 57344.0),
}


# ----------------------------------------------------------------------------------------
# Scales and the cast (docs/BACKENDS.md "FP8 formats and the cast", "How the scale is computed")

_FP32_MAX = torch.finfo(torch.float32).max
_EXPONENT_MASK = -8388608  # 0xFF800000 as int32: sign and exponent bits


def compute_scale(amax, fp8_max, *, pow2=False, epsilon=0.0, value_for_inf=_FP32_MAX):
    """TE's compute_scale_from_amax (common/recipe/recipe_common.cuh) on an fp32 tensor of
    amaxes: fp8_max / max(amax, epsilon) in fp32, 1 where the amax is 0, inf or NaN,
    `value_for_inf` where the quotient overflows, the mantissa cleared with `pow2`."""
    amax = amax.to(torch.float32)
    amax = torch.where(amax < epsilon, torch.full_like(amax, epsilon), amax)
    bad = (amax == 0) | torch.isinf(amax) | torch.isnan(amax)
    scale = torch.full_like(amax, fp8_max) / torch.where(bad, torch.ones_like(amax), amax)
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)
    if pow2:
        scale = (scale.view(torch.int32) & _EXPONENT_MASK).view(torch.float32)
    return torch.where(bad, torch.ones_like(scale), scale)


def value_for_inf(dtype):
    """The scale that replaces an overflowing one: the input dtype's largest finite value
    (recipe_common.cuh: compute_scale_from_types)."""
    return torch.finfo(dtype).max if dtype != torch.float64 else _FP32_MAX


def cast_to_fp8(x, scale, fmt):
    """fp8(float(x) * scale): the fp32 product rounded to nearest even and saturated to the
    format's +-max, NaN kept (quantize_fp8.cuh: static_cast<OType>(elt * scale)). `scale`
    broadcasts against x."""
    dtype, fp8_max = FORMATS[fmt]
    scaled = x.to(torch.float32) * scale
    return scaled.clamp(-fp8_max, fp8_max).to(dtype)


def dequantize(q, scale):
    """float(q) * (1 / scale) with TE's fp32 reciprocal scale_inv, in float64 (the product
    of an FP8 value and an fp32 number is exact there)."""
    scale_inv = torch.reciprocal(scale.to(torch.float32))
    return q.to(torch.float64) * scale_inv.to(torch.float64)


def quantize_dequantize(x, scale, fmt):
    """dequantize(cast_to_fp8(x, scale, fmt), scale): x as its FP8 value, in float64."""
    return dequantize(cast_to_fp8(x, scale, fmt), scale)


def current_scaling_qdq(x, fmt, *, pow2=False, epsilon=0.0):
    """Per-tensor current scaling of x (csrc/quantizer.cpp:
    Float8CurrentScalingQuantizer::quantize_impl): the scale from x's own amax."""
    return quantize_dequantize(x.detach(), current_scale(x, fmt, pow2=pow2, epsilon=epsilon), fmt)


def current_scale(x, fmt, *, pow2=False, epsilon=0.0):
    """Current scaling's scale of x: from its own amax (compute_scale)."""
    amax = x.detach().abs().max().to(torch.float32) if x.numel() else torch.zeros(())
    return compute_scale(
        amax, FORMATS[fmt][1], pow2=pow2, epsilon=epsilon, value_for_inf=value_for_inf(x.dtype)
    )


BLOCK = 128  # tensor/float8_blockwise_tensor.py: Float8BlockQuantizer.block_len


def block_scaling_qdq(x, fmt, block_dim, *, along_rows=False, pow2=True, epsilon=0.0):
    """Float8BlockScaling's quantize-dequantize of a 2D tensor x [m, n], in float64.
    block_dim 1: one scale per 128 consecutive elements of a row (1x128), or with
    `along_rows` per 128 consecutive elements of a column (128x1, the column-wise copy);
    block_dim 2: one scale per 128x128 tile. Partial blocks cover what is there."""
    x = x.detach()
    m, n = x.shape
    if block_dim == 2:
        block_rows, block_cols = BLOCK, BLOCK
    elif along_rows:
        block_rows, block_cols = BLOCK, 1
    else:
        block_rows, block_cols = 1, BLOCK
    pm = (-m) % block_rows
    pn = (-n) % block_cols
    padded = torch.nn.functional.pad(x.to(torch.float32), (0, pn, 0, pm))
    tiles = padded.reshape((m + pm) // block_rows, block_rows, (n + pn) // block_cols, block_cols)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    scale = compute_scale(
        amax, FORMATS[fmt][1], pow2=pow2, epsilon=epsilon, value_for_inf=value_for_inf(x.dtype)
    )
    out = quantize_dequantize(tiles, scale, fmt).reshape(m + pm, n + pn)
    return out[:m, :n]


# ----------------------------------------------------------------------------------------
# Quantizers: one per quantized tensor role of an op (te.ops: BasicLinear.num_quantizers)


_RECIPE_OFF = [False]


@contextlib.contextmanager
def recipe_off():
    """A call with the case's recipe disabled (te: outside te.autocast): the ops compute in
    high precision, record no amax and run no update while it lasts (the backward of a
    forward made under it too: autograd holds what the forward chose)."""
    previous = _RECIPE_OFF[0]
    _RECIPE_OFF[0] = True
    try:
        yield
    finally:
        _RECIPE_OFF[0] = previous


def recipe_is_off():
    return _RECIPE_OFF[0]


class QuantizedTensor:
    """A quantized operand as TE keeps it: the row-wise copy `data` [m, n] and the
    column-wise copy `data_t` stored transposed [n, m] (tensor/storage/
    float8_tensor_storage.py: _data, _transpose), both dequantized to float64. For
    per-tensor scaling data_t is data transposed; for 1D block scaling it was quantized
    with blocks along the other dimension."""

    def __init__(self, data, data_t):
        self.data = data
        self.data_t = data_t

    def rowwise(self):
        """The copy a GEMM that reduces over the last dimension reads."""
        return self.data

    def columnwise(self):
        """The copy a GEMM that reduces over the first dimension reads, as [m, n]."""
        return self.data_t.t()


# Whoever watches the quantized tensors the quantizers make (recording): called with
# (quantizer, x, QuantizedTensor) after each quantization; None: nobody.
_RECORDER = [None]


@contextlib.contextmanager
def recording(callback):
    """Runs the body with `callback(quantizer, x, result)` called after every quantization
    of a quantizer below (the torch backend checks each tensor: invariants.py:
    check_emulated)."""
    previous = _RECORDER[0]
    _RECORDER[0] = callback
    try:
        yield
    finally:
        _RECORDER[0] = previous


def _made(quantizer, x, result):
    if _RECORDER[0] is not None:
        _RECORDER[0](quantizer, x, result)
    return result


def per_tensor_copies(data, scale, fmt):
    """The QuantizedTensor of a per-tensor quantization: `data` (x quantized with `scale`
    in format `fmt`, dequantized) and its transpose, one scale for both
    (float8_tensor_storage.py: _transpose is fp8_transpose of _data)."""
    return QuantizedTensor(data, data.t().contiguous())


class CurrentQuantizer:
    """Per-tensor current scaling (Float8CurrentScalingQuantizer)."""

    delayed = False

    def __init__(self, fmt, *, pow2=False, epsilon=0.0):
        self.fmt = fmt
        self.pow2 = pow2
        self.epsilon = epsilon

    def __call__(self, x):
        return _made(self, x, self.quantize(x))

    def quantize(self, x):
        """The QuantizedTensor of x, unrecorded (__call__ records it)."""
        scale = self.scale_of(x)
        data = quantize_dequantize(x.detach(), scale, self.fmt)
        return per_tensor_copies(data, scale, self.fmt)

    def scale_of(self, x):
        """The scale quantize(x) casts with."""
        return current_scale(x, self.fmt, pow2=self.pow2, epsilon=self.epsilon)


class BlockQuantizer:
    """Float8BlockQuantizer: 1x128 / 128x1 or 128x128 blocks, row- and column-wise copies
    quantized separately from the high-precision tensor."""

    delayed = False

    def __init__(self, fmt, block_dim, *, pow2=True):
        self.fmt = fmt
        self.block_dim = block_dim
        self.pow2 = pow2

    def __call__(self, x):
        return _made(self, x, self.quantize(x))

    def quantize(self, x):
        """The QuantizedTensor of x, unrecorded (__call__ records it)."""
        x2 = x.reshape(-1, x.shape[-1])
        data = block_scaling_qdq(x2, self.fmt, self.block_dim, pow2=self.pow2)
        data_t = self.columnwise_copy(x2, data)
        return QuantizedTensor(data.reshape(x.shape), data_t)

    def scale_of(self, x):
        """None: one scale per block, no single scale."""
        return None

    def columnwise_copy(self, x2, data):
        """The column-wise copy [n, m] of x2 [m, n] whose row-wise copy is `data`: for 2D
        blocks `data` transposed (one scale per tile serves both), for 1D blocks x2
        quantized with 128x1 blocks."""
        if self.block_dim == 2:
            return data.t().contiguous()
        return block_scaling_qdq(x2, self.fmt, 1, along_rows=True, pow2=self.pow2).t().contiguous()


class DelayedQuantizer:
    """Delayed scaling (Float8Quantizer over DelayedScalingRecipeState): quantizes with its
    current scale, records the tensor's amax into history slot 0 with a max (the cast
    kernel's atomicMaxFloat), and changes the scale only in update()."""

    delayed = True

    def __init__(self, fmt, *, history_len, margin, algo):
        self.fmt = fmt
        self.margin = margin
        self.algo = algo
        self.scale = torch.ones((), dtype=torch.float32)
        self.history = torch.zeros(history_len, dtype=torch.float32)

    def __call__(self, x):
        return _made(self, x, self.quantize(x))

    def quantize(self, x):
        """The QuantizedTensor of x, its amax recorded, unrecorded as a tensor (__call__
        records it)."""
        if x.numel():
            amax = x.detach().abs().max().to(torch.float32)
            self.history[0] = torch.maximum(self.history[0], amax)
        data = quantize_dequantize(x.detach(), self.scale, self.fmt)
        return per_tensor_copies(data, self.scale, self.fmt)

    def scale_of(self, x):
        """The scale quantize(x) casts with."""
        return self.scale

    def state(self):
        return {"scale": self.scale.clone(), "history": self.history.clone()}

    def resize_history(self, length):
        h = self.history
        if h.numel() >= length:
            self.history = h[:length].clone()
        else:
            self.history = torch.cat([h, torch.zeros(length - h.numel(), dtype=h.dtype)])

    def load_state(self, state):
        self.scale = state["scale"].clone()
        self.history = state["history"].clone()

    def update(self):
        """FP8GlobalStateManager.reduce_and_update_fp8_tensors for this quantizer
        (quantization.py: _default_get_amax_and_update_history, _default_sf_compute)."""
        fp8_max = FORMATS[self.fmt][1]
        amax = self.history.max() if self.algo == "max" else self.history[0].clone()
        scale = (torch.tensor(fp8_max, dtype=torch.float32) / amax) / (2.0**self.margin)
        if bool(amax > 0) and bool(torch.isfinite(amax)):
            self.scale = torch.where(
                torch.isinf(scale), torch.tensor(_FP32_MAX, dtype=torch.float32), scale
            )
        self.history = torch.roll(self.history, -1, 0)
        self.history[0] = 0.0


def make_quantizer(recipe, role):
    """The quantizer of one tensor role ("input", "weight", "grad_output") under `recipe`
    (quantization.py: RecipeState.create and each state's make_quantizers); its `role`
    attribute says which."""
    fmt = recipe.format_for(role == "grad_output")
    options = recipe.options
    if recipe.name == "DelayedScaling":
        quantizer = DelayedQuantizer(
            fmt,
            history_len=options["amax_history_len"],
            margin=options["margin"],
            algo=options["amax_compute_algo"],
        )
    elif recipe.name == "Float8CurrentScaling":
        quantizer = CurrentQuantizer(fmt, pow2=options["use_power_2_scales"])
    elif recipe.name == "Float8BlockScaling":
        x_dim, w_dim, g_dim = options["block_scaling_dims"]
        dim = {"input": x_dim, "weight": w_dim, "grad_output": g_dim}[role]
        quantizer = BlockQuantizer(fmt, dim, pow2=not options["use_f32_scales"])
    else:
        raise NotImplementedError(f"the torch backend does not emulate {recipe.name}")
    quantizer.role = role
    return quantizer


# ----------------------------------------------------------------------------------------
# The quantized ops


class LinearQuantizers:
    """A Linear's (or one GroupedLinear group's) quantizers and the recipe's
    backward_override; `backward_ran` says whether a backward quantized since update."""

    def __init__(self, recipe):
        self.input = make_quantizer(recipe, "input")
        self.weight = make_quantizer(recipe, "weight")
        self.grad_output = make_quantizer(recipe, "grad_output")
        self.backward_override = recipe.backward_override
        self.backward_ran = False

    def forward_quantizers(self):
        return [self.input, self.weight]


class QuantizedLinearFunction(torch.autograd.Function):
    """y = x W^T on quantized operands (basic_linear.py: BasicLinear._functional_forward,
    _functional_backward; docs/BACKENDS.md "Where te.ops quantizes")."""

    @staticmethod
    def forward(ctx, x, weight, quantizers, alpha=None, qweight=None):
        qx = quantizers.input(x)
        # A quantized weight (quantized_model_init) is used as it is, not quantized again.
        qw = qweight if qweight is not None else quantizers.weight(weight)
        # x [rows, in] · W^T [in, out] -> y [rows, out]
        y = qx.rowwise() @ qw.rowwise().t()
        override = quantizers.backward_override
        if override == "high_precision":
            ctx.save_for_backward(x.detach(), weight.detach())
        elif override == "dequantized":
            ctx.save_for_backward(qx.rowwise(), qw.rowwise())
        else:
            ctx.qx, ctx.qw = qx, qw
        ctx.quantizers = quantizers
        ctx.dtypes = (x.dtype, weight.dtype)
        ctx.alpha = alpha
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        quantizers = ctx.quantizers
        x_dtype, w_dtype = ctx.dtypes
        if quantizers.backward_override is None:
            qdy = quantizers.grad_output(grad_output)
            quantizers.backward_ran = True
            # dy [rows, out] · W [out, in] -> dx [rows, in] (W's column-wise copy)
            grad_input = qdy.rowwise() @ ctx.qw.columnwise()
            # dy^T [out, rows] · x [rows, in] -> dW [out, in] (column-wise copies)
            grad_weight = qdy.columnwise().t() @ ctx.qx.columnwise()
        else:
            x, w = ctx.saved_tensors
            dy = grad_output.to(torch.float64)
            grad_input = dy @ w.to(torch.float64)
            grad_weight = dy.t() @ x.to(torch.float64)
        if ctx.alpha is not None:
            grad_input, grad_weight = backward_gemm_alpha(grad_input, grad_weight, ctx.alpha)
        return grad_input.to(x_dtype), grad_weight.to(w_dtype), None, None, None


def backward_gemm_alpha(grad_input, grad_weight, alpha):
    """The dgrad and wgrad GEMMs' results with their alpha (TE's general_gemm alpha, applied
    to the accumulator before the output is rounded): BackwardLinearScale's scale."""
    return grad_input * alpha, grad_weight * alpha


def quantized_linear(x, weight, quantizers, alpha=None, qweight=None):
    """`alpha`: the backward GEMMs' alpha of a fused BackwardLinearScale (None: unfused);
    `qweight`: the weight's own QuantizedTensor where it is a quantized parameter."""
    return QuantizedLinearFunction.apply(x, weight, quantizers, alpha, qweight)


def high_precision_linear(x, weight, alpha=None):
    """y = x W^T in the operands' dtype, with a fused BackwardLinearScale's alpha on both
    backward GEMMs (a call with the recipe off: TE fuses the pair whatever the recipe)."""
    y = apply("Linear", x, [], [weight], {})[0]
    if alpha is None:
        return y
    return y.detach() + alpha * (y - y.detach())


class HeldQuantizedWeight:
    """A Linear's quantized weight as its caller holds it (spec.held_quantized_tensor): the
    parameter and its QuantizedTensor. dequantize() gives the quantized values with the
    parameter's autograd; shape and size() are the parameter's."""

    def __init__(self, param, quantized):
        self.param = param
        self.quantized = quantized

    @property
    def shape(self):
        return self.param.shape

    @property
    def requires_grad(self):
        return self.param.requires_grad

    def size(self, dim=None):
        return self.param.size() if dim is None else self.param.size(dim)

    def dim(self):
        return self.param.dim()

    def dequantize(self):
        values = self.quantized.data.to(self.param.dtype)
        return self.param + (values - self.param).detach()


class GradientCastFunction(torch.autograd.Function):
    """The identity forward; backward: the gradient as the next op hands it over after
    casting it with `quantizers.grad_output` (group 0's) over the whole tensor, dequantized
    to the gradient's dtype, the row-wise copy (TE: maybe_dequantize)."""

    @staticmethod
    def forward(ctx, y, quantizers):
        ctx.quantizers = quantizers
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad_output):
        quantizers = ctx.quantizers
        quantizers.backward_ran = True
        quantizer = quantizers.grad_output
        cast = _made(quantizer, grad_output, fused_gradient_cast(quantizer, grad_output))
        return cast.rowwise().to(grad_output.dtype), None


def fused_gradient_cast(quantizer, grad):
    """The FP8 gradient an op hands the previous op, cast in the same kernel that computes it
    (TE: the fused dact + cast and dbias + cast kernels, tex.dgelu or tex.bgrad_quantize with
    the previous op's grad-output quantizer; the fused BackwardActivationBias): `quantizer`'s
    tensor of `grad`, unrecorded (GradientCastFunction records it)."""
    return quantizer.quantize(grad)


def casts_grad_input_for_previous_op(name, attrs, recipe):
    """Whether TE 2.20.2 casts op `name`'s input gradient to FP8 with the previous op's
    grad_output quantizer under `recipe`, both in one fuser (fuser.py: the fuser hands each op
    prev_op.get_grad_output_quantizer()): activations always (activation.py, swiglu.py:
    op_backward; SwiGLU not with glu_interleave_size), Bias without a backward_override
    (bias.py: op_forward drops it under one; op_backward: tex.bgrad_quantize), Linear under
    DelayedScaling only (basic_linear.py: _functional_backward writes the dgrad GEMM's output
    with a Float8Quantizer; current and block scaling raise there)."""
    if recipe is None:
        return False
    if name in ("ReLU", "GELU", "SReLU"):
        return True
    if name == "SwiGLU":
        return int(float(attrs.get("interleave", 0))) == 0
    if name == "Bias":
        return recipe.backward_override is None
    if name == "Linear":
        return recipe.name == "DelayedScaling"
    return False


def cached_input_activation(fn, x):
    """fn(x) whose backward evaluates fn' at the E4M3 current-scaling quantize-dequantize
    of x rounded to x's dtype (activation.py: _ActivationOperation.op_forward with
    cache_quantized_input: Float8CurrentScalingQuantizer(kFloat8E4M3), whatever the
    recipe): the value is fn(x), the gradient dy * fn'(dq(Q(x)))."""
    xq = current_scaling_qdq(x, "E4M3").to(x.dtype)
    xq = x + (xq - x).detach()  # value dq(Q(x)), gradient 1 with respect to x
    yq = fn(xq)
    return fn(x).detach() + (yq - yq.detach())


class OpQuantization:
    """What the torch runtime's BasicOp quantizes under a case's recipe (or, for
    cache_quantized_input, without one): per Linear one LinearQuantizers, per GroupedLinear
    one per group, per activation the cached-input flag. apply() replaces catalog.apply for
    that op."""

    def __init__(self, name, attrs, recipe):
        self.name = name
        self.recipe = recipe
        self.linear = []
        self.cache_input = False
        if recipe is not None and name == "Linear":
            self.linear = [LinearQuantizers(recipe)]
        elif recipe is not None and name == "GroupedLinear":
            self.linear = [LinearQuantizers(recipe) for _ in range(int(attrs.get("groups", 2)))]
        if name in CACHED_INPUT_OPS and float(attrs.get("cache_quantized_input", 0)) == 1.0:
            self.cache_input = True
        # Set by the torch runtime's fuser where a BackwardLinearScale fused this Linear with
        # the ConstantScale after it: that scale, the alpha of its backward GEMMs.
        self.backward_alpha = None
        # Set by the torch runtime's fuser: whether the next op of the fuser casts this op's
        # gradient with its grad_output quantizer (casts_grad_input_for_previous_op).
        self.gradient_cast_by_next = False
        # A Linear's weight as a quantized parameter (quantized_params; write_weight).
        self.quantized_weight = None

    @property
    def active(self):
        return bool(self.linear) or self.cache_input

    def outside_autocast(self):
        """The op's quantization in a call outside the case's FP8 autocast (a standalone
        call before binding: the te backend enters te.autocast around the Sequential's
        calls only): no recipe GEMMs, so no delayed-scaling amax recorded; an activation's
        cache_quantized_input stays, TE applies it whatever the recipe. None when nothing
        is left."""
        if not self.cache_input:
            return None
        alone = OpQuantization.__new__(OpQuantization)
        alone.name, alone.linear, alone.cache_input = self.name, [], True
        alone.recipe = None
        alone.backward_alpha = None
        alone.gradient_cast_by_next = False
        alone.quantized_weight = None
        return alone

    def write_weight(self, weight):
        """A Linear's weight written into its quantized parameter (quantized_model_init's
        weight at creation, an optimizer step, a checkpoint's load): quantized by the weight
        quantizer, both copies made from `weight`. The QuantizedTensor."""
        self.quantized_weight = self.linear[0].weight(weight.detach())
        return self.quantized_weight

    def set_history_len(self, length):
        """DelayedScaling's amax_history_len changed to `length`: each delayed quantizer's
        history keeps its first `length` slots or gets zeros appended, its scale kept (op.py:
        reset_recipe_state for a recipe of the same type)."""
        for lq in self.linear:
            for q in (lq.input, lq.weight, lq.grad_output):
                if q.delayed:
                    q.resize_history(length)

    def state(self):
        """The delayed-scaling state of every quantizer (what a checkpoint saves): per
        Linear (GroupedLinear group) the input, weight and grad-output quantizers'."""
        return [
            [q.state() if q.delayed else None for q in (lq.input, lq.weight, lq.grad_output)]
            for lq in self.linear
        ]

    def load_state(self, state):
        for lq, saved in zip(self.linear, state):
            for q, s in zip((lq.input, lq.weight, lq.grad_output), saved):
                if q.delayed and s is not None:
                    q.load_state(s)

    def quantizers(self, backward):
        """Every delayed-scaling quantizer of the op for one pass."""
        out = []
        for q in self.linear:
            out += [q.grad_output] if backward else q.forward_quantizers()
        return [q for q in out if q.delayed]

    def apply(self, x, extras, params, attrs):
        name = self.name
        if recipe_is_off() and self.linear:
            # Outside the autocast: the GEMMs in high precision, no quantizer touched.
            if name == "Linear":
                return high_precision_linear(x, params[0], self.backward_alpha), ()
            return apply(name, x, extras, params, attrs)
        if name == "Linear":
            return (
                quantized_linear(
                    x, params[0], self.linear[0], self.backward_alpha, self.quantized_weight
                ),
                (),
            )
        if name == "GroupedLinear":
            return self._grouped_linear(x, extras, params, attrs), ()
        if self.cache_input:
            fn = CACHED_INPUT_OPS[name](attrs)
            return cached_input_activation(fn, x), ()
        return apply(name, x, extras, params, attrs)

    def _grouped_linear(self, x, extras, params, attrs):
        """catalog.grouped_linear with each group's GEMM quantized by its own quantizers
        (grouped_linear.py: _fuser_forward_split_quantize); bias and scale_bias in high
        precision."""
        groups = len(self.linear)
        check_2d("GroupedLinear", x)
        sizes = check_split_sizes("GroupedLinear", extras[0], groups, x.shape[0])
        weights = params[0]
        biases = params[1] if len(params) > 1 else None
        scale_bias = float(attrs.get("scale_bias", 0)) == 1.0
        scales = extras[1] if scale_bias else None
        if scales is not None:
            check_row_vector("GroupedLinear", 1, "scales", scales, x.shape[0])
            scale_parts = torch.split(scales, sizes)
        if x.shape[1] != weights.shape[2]:
            raise InvalidArgumentError(
                f"GroupedLinear: input must be [rows, in={weights.shape[2]}], got {list(x.shape)}"
            )
        parts = []
        for g, x_g in enumerate(torch.split(x, sizes)):
            y_g = quantized_linear(x_g, weights[g], self.linear[g])
            if scales is not None:
                y_g = y_g + torch.outer(scale_parts[g], biases[g])
            elif biases is not None:
                y_g = y_g + biases[g]
            parts.append(y_g)
        y = torch.cat(parts, 0)
        # The next op casts the gradient with group 0's quantizer (get_grad_output_quantizer)
        # over the whole tensor; grouped_linear.py: _fuser_backward_split_quantize dequantizes
        # it, reduces the bias and scales gradients from that (compute_grouped_dbias_dscales)
        # and quantizes it per group again (split_quantize). Under a backward_override the
        # activations' cast is TE's open defect: the emulation keeps the override's gradient.
        cast = self.gradient_cast_by_next and self.linear[0].backward_override is None
        if cast and y.requires_grad:
            y = GradientCastFunction.apply(y, self.linear[0])
        return y


# The activations with TE's cache_quantized_input: name -> fn(attrs) giving x -> y.
CACHED_INPUT_OPS = {
    "ReLU": lambda attrs: relu,
    "GELU": lambda attrs: gelu,
    "SReLU": lambda attrs: srelu,
    "SwiGLU": lambda attrs: lambda x: swiglu(x, int(float(attrs.get("interleave", 0)))),
}


def update_after_forward(quantizations):
    """The forward half of FP8GlobalStateManager's delayed-scaling update, at the end of a
    grad-enabled forward (quantization.py: autocast_exit): every forward quantizer of the
    Sequential's ops."""
    if not torch.is_grad_enabled():
        return
    for quantization in quantizations:
        for q in quantization.quantizers(backward=False):
            q.update()


def update_after_backward(quantizations):
    """The backward half, after a backward that quantized (fuser.py:
    _OperationFuserAutogradFunction.backward, is_first_module): every backward quantizer."""
    ran = any(q.backward_ran for quantization in quantizations for q in quantization.linear)
    if not ran:
        return
    for quantization in quantizations:
        for q in quantization.linear:
            q.backward_ran = False
        for q in quantization.quantizers(backward=True):
            q.update()
