"""TransformerEngine 2.20.2's pure-Python te.ops on a CPU machine, its compiled extension
(transformer_engine_torch) and shared libraries replaced by stubs.

What needs no CUDA kernel then runs for real: OperationFuser (routing, channel checks,
locking, fusion plans, the autograd function), Sequential, op.py's BasicOperation /
FusedOperation, and the ops written in plain torch (MakeExtraOutput, AddExtraInput,
ConstantScale, Identity, Reshape, Bias) plus the adapter's custom ops and FusedResidual.
Ops that call kernels (BasicLinear, activations, norms, GroupedLinear) do not run, except
BasicLinear's unquantized GEMMs with GRADFUZZ_TE_STUB_GEMM=1 (torch_gemm: torch's matmul in
TE's general_gemm's place, so that its tensor-parallel code runs on gloo ranks).

TE's source comes from $GRADFUZZ_TE_SRC (an unpacked wheel), /tmp/te-src, or the wheel in
<repo>/.te/rest (unpacked to a temporary folder). TE imports numpy and pydantic; they must
be importable ($GRADFUZZ_TE_DEPS is put on sys.path for them). available() says why not.
"""

import enum
import glob
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import types
import zipfile
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def te_source():
    """A folder holding transformer_engine/ (TE's Python source), or None."""
    for root in (os.environ.get("GRADFUZZ_TE_SRC"), "/tmp/te-src"):
        if root and os.path.isfile(os.path.join(root, "transformer_engine/pytorch/ops/fuser.py")):
            return root
    wheels = sorted(glob.glob(os.path.join(REPO, ".te/rest/transformer_engine-2.20.2-*.whl")))
    if not wheels:
        return None
    root = os.path.join(tempfile.gettempdir(), "gradfuzz-te-src")
    if not os.path.isfile(os.path.join(root, "transformer_engine/pytorch/ops/fuser.py")):
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(root, [n for n in z.namelist() if n.startswith("transformer_engine/")])
    return root


def _deps_path():
    deps = os.environ.get("GRADFUZZ_TE_DEPS", "/tmp/te-extra")
    if deps and os.path.isdir(deps) and deps not in sys.path:
        sys.path.append(deps)


def available():
    """None when the stubbed TE can be imported here, else why not."""
    if te_source() is None:
        return "TE's Python source not found (set GRADFUZZ_TE_SRC or run ../shared/te/fetch.sh)"
    _deps_path()
    missing = [m for m in ("numpy", "pydantic") if importlib.util.find_spec(m) is None]
    if missing:
        return (
            f"TE imports {', '.join(missing)}, not installed here "
            "(pip install --target DIR numpy pydantic; GRADFUZZ_TE_DEPS=DIR)"
        )
    return None


class _Stub(types.ModuleType):
    """A module whose unknown attributes are mocks."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Tex(_Stub):
    """transformer_engine_torch: the enums TE checks at import, mocks for the kernels."""

    class DType(enum.IntEnum):
        kByte = 0
        kInt32 = 2
        kFloat32 = 4
        kFloat16 = 5
        kBFloat16 = 6
        kFloat8E4M3 = 7
        kFloat8E5M2 = 8
        kFloat4E2M1 = 10

    class NVTE_Fused_Attn_Backend(enum.IntEnum):
        NVTE_No_Backend = -1
        NVTE_F16_arbitrary_seqlen = 1
        NVTE_FP8 = 2


# Third-party modules TE imports for features outside te.ops.
STUBBED = ("onnxscript", "onnxscript.values", "onnx")


def install():
    """Imports the stubbed TE; returns the transformer_engine.pytorch module (te)."""
    if "transformer_engine.pytorch" in sys.modules and hasattr(
        sys.modules["transformer_engine.pytorch"], "ops"
    ):
        return sys.modules["transformer_engine.pytorch"]
    reason = available()
    if reason:
        raise RuntimeError(reason)
    root = te_source()
    sys.path.insert(0, root)
    sys.modules["transformer_engine_torch"] = _Tex("transformer_engine_torch")
    for name in STUBBED:
        if name not in sys.modules:
            module = _Stub(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
    packages = (
        ("transformer_engine", "transformer_engine", types.ModuleType),
        ("transformer_engine.pytorch", "transformer_engine/pytorch", types.ModuleType),
        ("transformer_engine.common", "transformer_engine/common", _Stub),
    )
    for name, sub, cls in packages:
        module = cls(name)
        module.__path__ = [os.path.join(root, sub)]
        sys.modules[name] = module
    # In this order, as transformer_engine/pytorch/__init__.py imports them (avoids cycles).
    for sub in ("constants", "tensor", "module", "ops"):
        importlib.import_module(f"transformer_engine.pytorch.{sub}")
    te = sys.modules["transformer_engine.pytorch"]
    te.ops = sys.modules["transformer_engine.pytorch.ops"]
    # What transformer_engine/pytorch/__init__.py exports from quantization.py.
    quantization = importlib.import_module("transformer_engine.pytorch.quantization")
    for name in (
        "autocast",
        "fp8_autocast",
        "is_fp8_available",
        "is_mxfp8_available",
        "is_fp8_block_scaling_available",
        "is_nvfp4_available",
    ):
        setattr(te, name, getattr(quantization, name))
    sys.modules["transformer_engine"].__version__ = "2.20.2 (Python only, stubbed extension)"
    if os.environ.get("GRADFUZZ_TE_STUB_GEMM") == "1":
        _install_torch_gemm()
    return te


def torch_gemm(
    A,
    B,
    out_dtype=None,
    quantization_params=None,
    gelu=False,
    gelu_in=None,
    alpha=1.0,
    beta=None,
    accumulate=False,
    layout="TN",
    out=None,
    bias=None,
    use_split_accumulator=False,
    grad=False,
    **kwargs,
):
    """A stand-in for cpp_extensions/gemm.py: general_gemm on plain tensors, with torch's
    matmul where cuBLASLt would run: D = op_B(B) @ op_A(A), op transposing where the layout
    says "T" (layout[0] for A, layout[1] for B: "TN" y = x W^T, "NN" dx = dy W, "NT"
    dW = dy^T x), accumulated in float32, times alpha, plus a bias in the forward, added to
    beta * out when accumulating. Quantized operands, fused GELU and Userbuffers are not
    modelled (NotImplementedError: the path is declined)."""
    import torch

    if quantization_params is not None or gelu or kwargs.get("ub") is not None:
        raise NotImplementedError(
            "te_stub's GEMM: no quantized output, GELU epilogue or Userbuffers"
        )
    plain = (torch.Tensor, torch.nn.Parameter)
    if type(A) not in plain or type(B) not in plain:
        raise NotImplementedError("te_stub's GEMM: quantized operands are not modelled")
    if bias is not None and grad:
        raise NotImplementedError("te_stub's GEMM: no bias-gradient epilogue")
    a = A.t() if layout[0] == "T" else A
    b = B.t() if layout[1] == "T" else B
    wide = torch.float64 if torch.float64 in (A.dtype, B.dtype) else torch.float32
    d = (b.to(wide) @ a.to(wide)) * (1.0 if alpha is None else float(alpha))
    if bias is not None:
        d = d + bias.to(wide)
    dtype = out.dtype if out is not None else (out_dtype or A.dtype)
    if accumulate and out is not None:
        out.mul_(1.0 if beta is None else float(beta)).add_(d.to(dtype))
        return out, None, None, None
    result = d.to(dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return result, None, None, None


def _install_torch_gemm():
    """Every TE module's `general_gemm` (imported by name) replaced by torch_gemm, and TE's
    empty CUDA tensor (what a freed saved tensor points at) by an empty CPU one."""
    import torch
    from transformer_engine.pytorch import cpp_extensions, utils

    # utils.py: clear_tensor_data frees a saved tensor by pointing it at an empty CUDA tensor.
    utils._empty_tensor = lambda: torch.Tensor()
    original = cpp_extensions.general_gemm
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("transformer_engine")
            and getattr(module, "general_gemm", None) is original
        ):
            module.general_gemm = torch_gemm


def rank_backend(name):
    """The backend of a rank process of a distributed case (ranks.py:
    GRADFUZZ_RANK_BACKEND="te_stub:rank_backend"): TE's Python over the stub, on the CPU."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    install()
    from gradfuzz_adapter.te.backend import TEBackend

    if name != "te":
        raise ValueError(f"te_stub.rank_backend makes the te backend, not {name!r}")
    return TEBackend(device="cpu")
