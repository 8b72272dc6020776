"""TE's errors -> the runtime's error kinds (ops/errors.h), or "unsupported" for TE's
documented limits; and, per error kind, what TE raises (for exported scripts' pytest.raises).

TE-free: patterns over exception messages, with where in TE 2.20.2 each message is raised.
"""

import re

from ..errors import GradfuzzError

# Errors that are TE declining a valid case (status "unsupported"), with where TE raises
# them. Anything else TE raises is an error of the path. NotImplementedError always counts.
UNSUPPORTED = (
    (
        r"Supported dtypes are float32, float16, bfloat16",
        "basic_linear.py: BasicLinear.__init__/_functional_forward, "
        "grouped_linear.py: GroupedLinear.__init__ (no float64 GEMMs)",
    ),
    (
        r"^Unsupported dtype \(",
        "activation.py: _ActivationOperation.op_forward, swiglu.py: SwiGLU.op_forward",
    ),
    (
        r"Single grouped parameters require the native grouped-tensor GroupedLinear path",
        "grouped_linear.py: GroupedLinear.fuser_forward (single_grouped_weight/bias need "
        "bf16/fp16 on sm90+ with cuBLASLt >= 13.4: is_op_fuser_grouped_tensor_path_supported)",
    ),
    (
        r"has requires_grad=(True|False), but expected requires_grad=",
        "grouped_linear.py: GroupedLinear.pre_first_fuser_forward (every weight and bias of "
        "one GroupedLinear must share requires_grad)",
    ),
    (
        # Seen on the H200 with TE 2.20.2 (the common library's source is not in the wheels):
        # "Assertion failed: glu_interleave_size % 32 == 0. nvte_scaled_swiglu: nonzero
        # glu_interleave_size must be a multiple of 32."
        r"glu_interleave_size must be a multiple of 32",
        "common/activation/scaled_activation.cu: check_gated_forward_tensors "
        "(ScaledSwiGLU's kernel; SwiGLU deinterleaves in Python and takes any size)",
    ),
    (
        r"does not support activation recomputation in the fused grouped MLP",
        "swiglu.py: _ScaledGLU.__init__ (activation_recompute_in_mlp=True)",
    ),
    (
        r"\(activation_recompute_in_mlp=True\) requires the fused grouped MLP path",
        "swiglu.py: _ScaledGLU.fuser_forward",
    ),
)

# TE's messages -> runtime error kinds (ops/errors.h), checked in order.
KINDS = (
    (r"has multiple producers", "duplicate-producer"),  # fuser.py: OperationFuser.__init__
    (r"has no earlier producer", "producer-not-earlier"),  # fuser.py: OperationFuser.__init__
    (r"has no producer", "missing-producer"),  # fuser.py: OperationFuser.__init__
    (r"Cannot change extra tensor channels", "locked"),  # op.py: _check_..._unlocked
    (r"Expected \d+ extra inputs but got \d+", "extra-input-count"),  # fuser.py: __call__
    (r"Extra (input|output) index -?\d+ is out of range", "slot-out-of-range"),  # op.py: set_*
    (r"Extra (input|output) channel must be a non-empty string", "invalid-channel-name"),
    (r"Expected op \d+ to generate \d+ extra outputs", "extra-count"),  # fuser.py: forward
    (r"to generate extra outputs for \d+ basic operations", "extra-count"),
    (r"Expected op \d+ to generate grads for \d+ extra inputs", "extra-count"),  # backward
    (r"Expected grads for \d+ extra tensor outputs", "extra-count"),
    (r"Expected op \d+ to generate \d+ param grads", "extra-count"),
    (r"is public, but \w+ returned None", "public-output-returned-none"),  # fuser.py: forward
    (r"required by an operation outside its forward fusion", "needed-outside-its-fusion"),
    (r"Found mismatch after fusing", "plan-mismatch"),  # fuser.py: _map_to_basic_ops
    # Review finding 2: fuser.py applies len() and indexing to an op's extra outputs.
    (r"object of type 'generator' has no len\(\)", "generator-misuse"),
    (r"'generator' object is not subscriptable", "generator-misuse"),
    # Wrong tensor arguments (the C++ ops' InvalidArgumentError).
    (r"Expected \d+ splits, but got \d+", "invalid-argument"),  # grouped_linear.py
    (r"split_with_sizes expects split_sizes to sum exactly", "invalid-argument"),  # torch.split
    (r"scaled d?activation expects one scale per input row", "invalid-argument"),  # csrc
    (
        r"Input tensor \(shape=.*\) and weight tensor \(shape=.*\) are not compatible",
        "invalid-argument",
    ),  # rmsnorm.py, layer_norm.py: op_forward
    (r"The size of tensor a \(\d+\) must match the size of tensor b", "invalid-argument"),
    (r"Invalid matrix dimensions for GEMM", "invalid-argument"),  # csrc/extensions/gemm.cpp
    # Tensor parallelism: a split that does not divide (the harness's parallel_config_error).
    # basic_linear.py: BasicLinear._canonicalize_tensor_parallelism, bias.py: Bias.__init__
    (r"Invalid configuration for tensor parallelism", "invalid-argument"),
    # reduce_scatter.py: ReduceScatter.op_forward, all_gather.py: AllGather.op_backward
    (r"Attempted to reduce-scatter a tensor with shape", "invalid-argument"),
    # distributed.py: reduce_scatter_along_first_dim (a sequence-parallel row BasicLinear)
    (
        r"First dimension of the tensor should be divisible by tensor parallel size",
        "invalid-argument",
    ),
)


# What TE raises for each error kind a case can expect: exception types and a message
# pattern for the exported scripts' pytest.raises (None: any message of those types).
RAISES = {
    "duplicate-producer": (("ValueError",), r"has multiple producers"),
    "missing-producer": (("ValueError",), r"has no producer"),
    "producer-not-earlier": (("ValueError",), r"has no earlier producer"),
    "extra-input-count": (("ValueError",), r"Expected \d+ extra inputs but got \d+"),
    "slot-out-of-range": (("IndexError",), r"is out of range"),
    "invalid-channel-name": (("ValueError",), r"channel must be a non-empty string"),
    "locked": (("RuntimeError",), r"Cannot change extra tensor channels"),
    "extra-count": (("RuntimeError",), r"Expected .* to generate"),
    "invalid-argument": (("ValueError", "RuntimeError"), None),
}


def classify(exc):
    """("unsupported", reason) for a documented TE limit, else ("error", kind)."""
    if isinstance(exc, NotImplementedError):
        return "unsupported", "NotImplementedError"
    if isinstance(exc, GradfuzzError):
        return "error", exc.kind
    message = str(exc)
    for pattern, where in UNSUPPORTED:
        if re.search(pattern, message):
            return "unsupported", where
    for pattern, kind in KINDS:
        if re.search(pattern, message):
            return "error", kind
    return "error", "unrecognized"
