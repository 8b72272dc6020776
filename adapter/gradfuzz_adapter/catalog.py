"""The op catalog of ../shared/spec/ops.md as plain PyTorch functions.

Every op is a module-level function of tensors written with differentiable torch calls, so
autograd gives its backward. The torch backend (torch_backend/), the float64 reference
(reference.py) and every exported script use these functions; the exporter embeds this
module's source, so it imports only math, torch and the error classes (errors.py, embedded
before it).

Conventions: `x` is the main input [rows, features]; attrs are the catalog's numeric attrs
(JSON numbers; booleans are 0/1) with every default filled in. An op returns
(y, extra_outputs) with extra_outputs a tuple in slot order. Validation raises
InvalidArgumentError with the C++ op's wording where it has one.
"""

import math

import torch
import torch.nn.functional as F

from .errors import InvalidArgumentError, UnknownNameError

# ----------------------------------------------------------------------------------------
# Attrs


def attr_int(op, attrs, name, default, minimum=0):
    """An integer attr >= minimum (JSON numbers arrive as floats)."""
    v = float(attrs.get(name, default))
    if not math.isfinite(v) or v != math.floor(v) or v < minimum or v > 2.0**53:
        raise InvalidArgumentError(
            f"{op}: attr '{name}' must be an integer >= {minimum}, got {v:g}"
        )
    return int(v)


def attr_bool(op, attrs, name, default):
    """A 0/1 attr."""
    v = float(attrs.get(name, default))
    if v not in (0.0, 1.0):
        raise InvalidArgumentError(f"{op}: attr '{name}' must be 0 or 1, got {v:g}")
    return v == 1.0


def attr_real(op, attrs, name, default):
    """A finite real attr."""
    v = float(attrs.get(name, default))
    if not math.isfinite(v):
        raise InvalidArgumentError(f"{op}: attr '{name}' must be finite, got {v:g}")
    return v


# ----------------------------------------------------------------------------------------
# Argument checks (the C++ ops' InvalidArgumentError cases)


def _shape(t):
    return "<undefined>" if t is None else str(list(t.shape))


def check_2d(op, x):
    if x is None or x.dim() != 2:
        raise InvalidArgumentError(f"{op}: input must be 2-D [rows, features], got {_shape(x)}")


def check_features(op, x, features):
    if x is None or x.dim() < 1 or x.shape[-1] != features:
        raise InvalidArgumentError(
            f"{op}: input must have {features} features (last dim), got shape {_shape(x)}"
        )


def check_row_vector(op, slot, what, t, rows):
    if t is None or t.dim() != 1 or t.shape[0] != rows:
        raise InvalidArgumentError(
            f"{op} slot {slot}: {what} must have shape [rows={rows}], got {_shape(t)}"
        )


def check_glu_features(op, features, interleave):
    if features % 2 != 0 or features < 2:
        raise InvalidArgumentError(
            f"{op}: input features must be even and >= 2 (halves a, b), got {features}"
        )
    if interleave > 0 and features % (2 * interleave) != 0:
        raise InvalidArgumentError(
            f"{op}: interleave={interleave} needs input features divisible by "
            f"{2 * interleave}, got {features}"
        )


def check_split_sizes(op, split_sizes, groups, rows):
    """Host list of the split sizes, or InvalidArgumentError (numel, dtype, sign, sum)."""
    where = f"{op} slot 0: split sizes"
    if split_sizes is None:
        raise InvalidArgumentError(f"{where} must be an int64 tensor [G={groups}], got None")
    if (
        split_sizes.is_floating_point()
        or split_sizes.is_complex()
        or split_sizes.dtype == torch.bool
    ):
        raise InvalidArgumentError(
            f"{where} must have an integer dtype (int64), got {split_sizes.dtype}"
        )
    if split_sizes.numel() != groups:
        raise InvalidArgumentError(f"{where} must have numel=G={groups}, got {split_sizes.numel()}")
    sizes = [int(s) for s in split_sizes.reshape(-1).tolist()]
    for g, s in enumerate(sizes):
        if s < 0:
            raise InvalidArgumentError(f"{where} must be non-negative, got {s} for group {g}")
    if sum(sizes) != rows:
        raise InvalidArgumentError(f"{where} must sum to rows={rows}, got {sum(sizes)}")
    return sizes


def check_routing_map(op, routing_map, rows):
    where = f"{op} slot 0: routing map"
    if routing_map is None or routing_map.dim() != 1 or routing_map.shape[0] != rows:
        raise InvalidArgumentError(
            f"{where} must have shape [rows={rows}], got {_shape(routing_map)}"
        )
    if routing_map.is_floating_point() or routing_map.dtype == torch.bool:
        raise InvalidArgumentError(
            f"{where} must have an integer dtype (int64), got {routing_map.dtype}"
        )
    ordered = torch.sort(routing_map.to(torch.int64)).values
    if not torch.equal(ordered, torch.arange(rows, device=ordered.device)):
        raise InvalidArgumentError(f"{where} must be a permutation of 0..{rows - 1}")


def check_logits(op, logits, rows, groups):
    if logits is None or logits.dim() != 2 or tuple(logits.shape) != (rows, groups):
        raise InvalidArgumentError(
            f"{op} slot 0: router logits must have shape [rows={rows}, G={groups}], "
            f"got {_shape(logits)}"
        )
    if not logits.is_floating_point():
        raise InvalidArgumentError(
            f"{op} slot 0: router logits must be floating point, got {logits.dtype}"
        )


# ----------------------------------------------------------------------------------------
# The ops


def linear(x, weight):
    """y = x W^T; weight [out, in]."""
    return F.linear(x, weight)


def bias_add(x, bias):
    """y = x + b; bias [features]."""
    return x + bias


def constant_scale(x, scale):
    """y = scale * x."""
    return x * scale


def relu(x):
    return torch.relu(x)


def gelu(x):
    """GELU, tanh form (TE's and the catalog's)."""
    return F.gelu(x, approximate="tanh")


def srelu(x):
    """relu(x)^2."""
    return torch.square(torch.relu(x))


def glu_halves(x, interleave):
    """The GLU halves a, b of the features: the two halves, or, with interleave k > 0,
    alternating k-wide blocks a0 b0 a1 b1 ... (TE's glu_interleave_size)."""
    features = x.shape[-1]
    if interleave <= 0:
        return x[..., : features // 2], x[..., features // 2 :]
    blocks = x.reshape(*x.shape[:-1], features // (2 * interleave), 2, interleave)
    flat = (*x.shape[:-1], features // 2)
    return blocks[..., 0, :].reshape(flat), blocks[..., 1, :].reshape(flat)


def swiglu(x, interleave=0):
    """silu(a) * b."""
    check_glu_features("SwiGLU", x.shape[-1], interleave)
    a, b = glu_halves(x, interleave)
    return F.silu(a) * b


def scaled_swiglu(x, scales, interleave=0):
    """silu(a) * b * s[r]; scales [rows]."""
    check_2d("ScaledSwiGLU", x)
    check_glu_features("ScaledSwiGLU", x.shape[1], interleave)
    check_row_vector("ScaledSwiGLU", 0, "scales", scales, x.shape[0])
    a, b = glu_halves(x, interleave)
    return F.silu(a) * b * scales.unsqueeze(-1)


def scaled_srelu(x, scales):
    """relu(x)^2 * s[r]; scales [rows]."""
    check_2d("ScaledSReLU", x)
    check_row_vector("ScaledSReLU", 0, "scales", scales, x.shape[0])
    return torch.square(torch.relu(x)) * scales.unsqueeze(-1)


def make_extra_output(x):
    """y = x and extra output x. Both are views of x, so each is its own autograd node: the
    gradient of the extra output (a channel's value) is not mixed with the main output's,
    as in the C++ reference (ops/basic/channel_ops.cc MakeExtraOutput::reference_impl).
    The op's `in_place` (accumulate the main gradient into the extra output's gradient
    buffer) is a backward memory detail that autograd's own out-of-place accumulation
    replaces here: it has no effect, and no gradient tensor is ever written in place."""
    return x.view_as(x), (x.view_as(x),)


def add_extra_input(x, e, in_place=False):
    """y = x + e, e shaped like x. `in_place` only changes memory traffic: the runtime hands
    such an op a private copy of e (torch_backend/runtime.py: Fuser), so adding into it in
    place changes no caller tensor and no channel value, and autograd sees an in-place add
    into a fresh non-leaf tensor, which it records like the out-of-place sum."""
    if e is None or tuple(e.shape) != tuple(x.shape):
        raise InvalidArgumentError(
            f"AddExtraInput slot 0: extra input must have the input's shape {list(x.shape)}, "
            f"got {_shape(e)}"
        )
    if in_place and e.dtype == x.dtype:
        return e.add_(x)
    return x + e


def grouped_linear(x, split_sizes, weights, biases=None, scales=None, groups=1):
    """Rows split into `groups` consecutive parts: y_r = x_r W_g^T + b_g, or with scales
    (scale_bias) y_r = x_r W_g^T + b_g * s[r]. weights [G, out, in], biases [G, out]."""
    check_2d("GroupedLinear", x)
    if x.shape[1] != weights.shape[2]:
        raise InvalidArgumentError(
            f"GroupedLinear: input must be [rows, in={weights.shape[2]}], got {list(x.shape)}"
        )
    sizes = check_split_sizes("GroupedLinear", split_sizes, groups, x.shape[0])
    if scales is not None:
        check_row_vector("GroupedLinear", 1, "scales", scales, x.shape[0])
        scale_parts = torch.split(scales, sizes)
    parts = []
    for g, x_g in enumerate(torch.split(x, sizes)):
        if scales is not None:
            y_g = F.linear(x_g, weights[g]) + torch.outer(scale_parts[g], biases[g])
        elif biases is not None:
            y_g = F.linear(x_g, weights[g], biases[g])
        else:
            y_g = F.linear(x_g, weights[g])
        parts.append(y_g)
    return torch.cat(parts, 0)


def rms_norm(x, gamma, eps, zero_centered_gamma=False):
    """x / sqrt(mean(x^2) + eps) * gamma; with zero_centered_gamma the scale is 1 + gamma."""
    check_features("RMSNorm", x, gamma.shape[0])
    scale = 1 + gamma if zero_centered_gamma else gamma
    return F.rms_norm(x, (x.shape[-1],), scale, eps)


def layer_norm(x, gamma, beta, eps, zero_centered_gamma=False):
    """(x - mean) / sqrt(var + eps) * gamma + beta; zero_centered_gamma: scale 1 + gamma."""
    check_features("LayerNorm", x, gamma.shape[0])
    scale = 1 + gamma if zero_centered_gamma else gamma
    return F.layer_norm(x, (x.shape[-1],), scale, beta, eps)


def dispatch(x, logits, groups):
    """Each row goes to argmax(logits); rows are reordered by group, stably.
    Extra outputs: split sizes (int64 [G]), the token's softmax probability for its group
    in the new order ([rows], differentiable w.r.t. the logits), the routing map (int64
    [rows]: new row i is old row map[i])."""
    check_2d("Dispatch", x)
    rows = x.shape[0]
    check_logits("Dispatch", logits, rows, groups)
    group = torch.argmax(logits.detach(), dim=1)
    routing_map = torch.sort(group, stable=True).indices
    split_sizes = torch.bincount(group, minlength=groups).to(torch.int64)
    probs = torch.softmax(logits, dim=1).gather(1, group.unsqueeze(1)).squeeze(1)
    return x.index_select(0, routing_map), (
        split_sizes,
        probs.index_select(0, routing_map),
        routing_map,
    )


def combine(x, routing_map):
    """Undoes Dispatch's reordering: y[map[i]] = x[i]."""
    check_2d("Combine", x)
    check_routing_map("Combine", routing_map, x.shape[0])
    inverse = torch.argsort(routing_map.to(torch.int64))
    return x.index_select(0, inverse)


def row_stat(x):
    """y = x; extra output mean of squares per row [rows], a fresh tensor."""
    return x.view_as(x), (torch.mean(torch.square(x), dim=-1),)


def dual_extra_output(x, s0, s1):
    """y = x; extra outputs s0 * x and s1 * x."""
    return x.view_as(x), (x * s0, x * s1)


def identity(x):
    return x.view_as(x)


def collective(x):
    """AllGather, ReduceScatter, AllReduce on the unsharded tensors: the identity (the ranks'
    slices gathered, summands summed; torch_backend/parallel.py runs them on the ranks)."""
    return x.view_as(x)


def reshape(x, features):
    """x.reshape(-1, features); features = 0 keeps the input's feature count."""
    features = features or x.shape[-1]
    if x.numel() % features != 0:
        raise InvalidArgumentError(
            f"Reshape: features={features} must divide numel={x.numel()} of the input"
        )
    return x.reshape(-1, features)


# ----------------------------------------------------------------------------------------
# The catalog table: slots, parameters, attr validation, one entry point


def slot_kinds(name, attrs):
    """(extra input kinds, extra output kinds): "float", "split_sizes" or "routing_map"."""
    if name in ("ScaledSwiGLU", "ScaledSReLU", "AddExtraInput"):
        return ["float"], []
    if name == "GroupedLinear":
        scale_bias = attr_bool(name, attrs, "scale_bias", 0)
        return (["split_sizes", "float"] if scale_bias else ["split_sizes"]), []
    if name == "Dispatch":
        return ["float"], ["split_sizes", "float", "routing_map"]
    if name == "Combine":
        return ["routing_map"], []
    if name in ("MakeExtraOutput", "RowStat"):
        return [], ["float"]
    if name == "DualExtraOutput":
        return [], ["float", "float"]
    if name in OP_NAMES:
        return [], []
    raise UnknownNameError(f"unknown op '{name}'; known ops: {', '.join(OP_NAMES)}")


def param_shapes(name, attrs, input_shape):
    """Shapes of the op's parameters in the model's layout (ops.md)."""
    features = input_shape[-1]
    if name == "Linear":
        return [[attr_int(name, attrs, "out", 16, 1), features]]
    if name in ("Bias", "RMSNorm"):
        return [[features]]
    if name == "LayerNorm":
        return [[features], [features]]
    if name == "GroupedLinear":
        groups = attr_int(name, attrs, "groups", 2, 1)
        out = attr_int(name, attrs, "out", 16, 1)
        shapes = [[groups, out, features]]
        if attr_bool(name, attrs, "bias", 1):
            shapes.append([groups, out])
        return shapes
    return []


def validate(name, attrs, input_shape):
    """The C++ catalog's construction checks (InvalidArgumentError): attr domains and
    whether the attrs fit the main input shape."""
    if name not in OP_NAMES:
        raise UnknownNameError(f"unknown op '{name}'; known ops: {', '.join(OP_NAMES)}")
    if len(input_shape) != 2 or input_shape[0] < 1 or input_shape[1] < 1:
        raise InvalidArgumentError(
            f"{name}: main input shape must be [rows, features] with both >= 1, "
            f"got {list(input_shape)}"
        )
    rows, features = input_shape
    if name == "Linear":
        attr_int(name, attrs, "out", 16, 1)
        if attr_int(name, attrs, "tensor_parallel_mode", 0, 0) > 2:
            raise InvalidArgumentError(
                "Linear: attr 'tensor_parallel_mode' must be 0 (none), 1 (column) or 2 (row)"
            )
        attr_bool(name, attrs, "sequence_parallel", 0)
    elif name == "Bias":
        attr_bool(name, attrs, "tensor_parallel", 0)
    elif name == "ConstantScale":
        attr_real(name, attrs, "scale", 0.5)
    elif name == "Reshape":
        target = attr_int(name, attrs, "features", 0, 0) or features
        if (rows * features) % target != 0:
            raise InvalidArgumentError(
                f"Reshape: features={target} must divide numel={rows * features} of the input"
            )
    elif name in ("SwiGLU", "ScaledSwiGLU"):
        check_glu_features(name, features, attr_int(name, attrs, "interleave", 0, 0))
    elif name in ("MakeExtraOutput", "AddExtraInput"):
        attr_bool(name, attrs, "in_place", 0)
    elif name == "DualExtraOutput":
        attr_real(name, attrs, "s0", 0.5)
        attr_real(name, attrs, "s1", -1.5)
    elif name == "GroupedLinear":
        attr_int(name, attrs, "groups", 2, 1)
        attr_int(name, attrs, "out", 16, 1)
        if attr_bool(name, attrs, "scale_bias", 0) and not attr_bool(name, attrs, "bias", 1):
            raise InvalidArgumentError("GroupedLinear: scale_bias=1 requires bias=1, got bias=0")
    elif name in ("RMSNorm", "LayerNorm"):
        if not attr_real(name, attrs, "eps", 1e-5) > 0:
            raise InvalidArgumentError(f"{name}: attr 'eps' must be > 0")
        attr_bool(name, attrs, "zero_centered_gamma", 0)
    elif name == "Dispatch":
        attr_int(name, attrs, "groups", 2, 1)


def apply(name, x, extras, params, attrs):
    """Runs catalog op `name`: (y, tuple of extra outputs)."""
    if name == "Linear":
        return linear(x, params[0]), ()
    if name == "Bias":
        return bias_add(x, params[0]), ()
    if name == "ConstantScale":
        return constant_scale(x, attr_real(name, attrs, "scale", 0.5)), ()
    if name == "ReLU":
        return relu(x), ()
    if name == "GELU":
        return gelu(x), ()
    if name == "SReLU":
        return srelu(x), ()
    if name == "SwiGLU":
        return swiglu(x, attr_int(name, attrs, "interleave", 0, 0)), ()
    if name == "ScaledSwiGLU":
        return scaled_swiglu(x, extras[0], attr_int(name, attrs, "interleave", 0, 0)), ()
    if name == "ScaledSReLU":
        return scaled_srelu(x, extras[0]), ()
    if name == "MakeExtraOutput":
        return make_extra_output(x)
    if name == "AddExtraInput":
        return add_extra_input(x, extras[0], attr_bool(name, attrs, "in_place", 0)), ()
    if name == "GroupedLinear":
        scale_bias = attr_bool(name, attrs, "scale_bias", 0)
        return grouped_linear(
            x,
            extras[0],
            params[0],
            params[1] if len(params) > 1 else None,
            extras[1] if scale_bias else None,
            attr_int(name, attrs, "groups", 2, 1),
        ), ()
    if name == "RMSNorm":
        return rms_norm(
            x,
            params[0],
            attr_real(name, attrs, "eps", 1e-5),
            attr_bool(name, attrs, "zero_centered_gamma", 0),
        ), ()
    if name == "LayerNorm":
        return layer_norm(
            x,
            params[0],
            params[1],
            attr_real(name, attrs, "eps", 1e-5),
            attr_bool(name, attrs, "zero_centered_gamma", 0),
        ), ()
    if name == "Dispatch":
        return dispatch(x, extras[0], attr_int(name, attrs, "groups", 2, 1))
    if name == "Combine":
        return combine(x, extras[0]), ()
    if name == "RowStat":
        return row_stat(x)
    if name == "DualExtraOutput":
        return dual_extra_output(
            x, attr_real(name, attrs, "s0", 0.5), attr_real(name, attrs, "s1", -1.5)
        )
    if name == "Identity":
        return identity(x), ()
    if name in COLLECTIVES:
        return collective(x), ()
    if name == "Reshape":
        return reshape(x, attr_int(name, attrs, "features", 0, 0)), ()
    raise UnknownNameError(f"unknown op '{name}'; known ops: {', '.join(OP_NAMES)}")


# te.ops's tensor-parallel communication ops (ops/basic/collectives.h).
COLLECTIVES = ("AllGather", "ReduceScatter", "AllReduce")

OP_NAMES = (
    "AddExtraInput",
    "AllGather",
    "AllReduce",
    "Bias",
    "Combine",
    "ConstantScale",
    "Dispatch",
    "DualExtraOutput",
    "GELU",
    "GroupedLinear",
    "Identity",
    "LayerNorm",
    "Linear",
    "MakeExtraOutput",
    "RMSNorm",
    "ReLU",
    "ReduceScatter",
    "Reshape",
    "RowStat",
    "SReLU",
    "ScaledSReLU",
    "ScaledSwiGLU",
    "SwiGLU",
)
