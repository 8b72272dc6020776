"""Invariants of every quantized tensor a backend makes, checked exactly (issue 26 item 2):
the FP8 codes are the cast of the high-precision tensor with the tensor's own scale, the
column-wise copy is what the format says it is, and dequantize() is the codes times the
scale inverse.

The te backend records each tensor TE's quantizers make while a path runs (TensorChecks:
quantized_tensor.py: Quantizer.quantize, the entry of every quantizer call, `quantizer(x)`
included, and QuantizedTensorStorage.quantize_, a write into an existing one) and checks
it at once, inside TE's forward or backward: TE takes a tensor's buffers apart when it saves
it for backward (float8_tensor_storage.py, float8_blockwise_tensor_storage.py:
prepare_for_saving sets them to None), so later they may be gone. Casts TE does inside its
fused kernels (the fused BackwardActivationBias's dact + dbias + cast, an activation's
backward writing FP8, a GEMM's FP8 output) never pass those entry points: what an op hands
the next op (its output, or its input gradient) is checked where the fuser receives it
(every te.ops op's fuser_forward and fuser_backward), when it is a per-tensor FP8 tensor not
checked already. The high-precision values it was cast from are not at hand there, so its
codes are not checked, only its column-wise copy and its dequantize(). Casts that stay
inside an op (tex.split_quantize in grouped_linear.py) are not seen.

The torch backend's emulation (torch_backend/fp8.py) is checked with the reference
functions below (check_emulated), which recompute each quantization on their own, apart
from the emulation's functions, so that a defect of those shows.

Imports only torch at module level; te_classes() imports TE, called by the te backend only.
"""

import contextlib
import os

import torch

from .errors import InvalidArgumentError

# FP8 format -> (torch dtype, largest finite value: common/recipe/__init__.py Format).
_FORMATS = {
    "E4M3": (torch.float8_e4m3fn, 448.0),
    "E5M2": (torch.float8_e5m2, 57344.0),
}
BLOCK = 128  # float8_blockwise_tensor.py: Float8BlockQuantizer.block_len
_FP32_MAX = torch.finfo(torch.float32).max


def fp8_checks_on():
    """Whether the quantized-tensor checks here and the delayed-scaling state check run:
    GRADFUZZ_FP8_CHECKS "on" (the default) or "off", which only the benchmarks of the
    checks' cost use (docs/BENCHMARKS.md); anything else is refused."""
    value = os.environ.get("GRADFUZZ_FP8_CHECKS", "on")
    if value not in ("on", "off"):
        raise InvalidArgumentError(f"GRADFUZZ_FP8_CHECKS must be on or off, got {value!r}")
    return value == "on"


# ----------------------------------------------------------------------------------------
# References


def reference_codes(x, scale, fmt):
    """The FP8 codes of x cast with `scale` (broadcasting against x): the fp32 product
    x * scale saturated to the format's +-max, then rounded to nearest even (torch's cast
    to a float8 dtype rounds so but does not saturate, hence the clamp first)."""
    dtype, fp8_max = _FORMATS[fmt]
    return (x.to(torch.float32) * scale).clamp(-fp8_max, fp8_max).to(dtype)


def reference_scale(amax, fp8_max, *, pow2=False, epsilon=0.0, value_for_inf=_FP32_MAX):
    """The scale of an fp32 amax (or tensor of amaxes) by TE's rule as docs/BACKENDS.md "How
    the scale is computed" states it (common/recipe/recipe_common.cuh:
    compute_scale_from_amax): fp8_max / max(amax, epsilon) in fp32; 1 where that amax is 0
    or not finite; `value_for_inf` where the quotient overflows; only the exponent kept with
    `pow2`. Written apart from torch_backend/fp8.py: compute_scale, which it checks."""
    amax = torch.clamp(amax.to(torch.float32), min=epsilon) if epsilon > 0 else amax.float()
    unusable = ~torch.isfinite(amax) | (amax == 0)
    quotient = torch.tensor(fp8_max, dtype=torch.float32) / torch.where(
        unusable, torch.ones_like(amax), amax
    )
    quotient = torch.where(
        torch.isinf(quotient), torch.full_like(quotient, value_for_inf), quotient
    )
    if pow2:
        _, exponent = torch.frexp(quotient)
        quotient = torch.ldexp(torch.full_like(quotient, 0.5), exponent).to(torch.float32)
    return torch.where(unusable, torch.ones_like(quotient), quotient)


def reference_dequantized(codes, scale):
    """codes times fp32(1 / scale), in float64 (exact there)."""
    scale_inv = torch.reciprocal(scale.to(torch.float32))
    return codes.to(torch.float64) * scale_inv.to(torch.float64)


def _value_for_inf(dtype):
    return torch.finfo(dtype).max if dtype in (torch.float16, torch.bfloat16) else _FP32_MAX


def _same(a, b):
    """Elementwise: equal values, or both NaN."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _first_difference(ok):
    """The flat index of the first False of `ok`, or None."""
    bad = (~ok).reshape(-1).nonzero()
    return None if bad.numel() == 0 else int(bad[0])


def _blocks(x2, rows, cols):
    """x2 [m, n] padded with zeros to whole `rows` x `cols` tiles, as [tm, rows, tn, cols]."""
    m, n = x2.shape
    padded = torch.nn.functional.pad(x2.to(torch.float32), (0, (-n) % cols, 0, (-m) % rows))
    return padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)


# ----------------------------------------------------------------------------------------
# The torch backend's emulation (torch_backend/fp8.py quantizers)


def check_emulated(quantizer, x, result):
    """[(what, note)] of one QuantizedTensor the emulation made from x, or None where the
    quantizer is not one of fp8.py's kinds. The row-wise data must be the reference
    quantize-dequantize of x (codes), the column-wise one the row-wise one transposed
    (per-tensor scaling, 2D blocks) or the reference 128x1 quantization of x (1D blocks)
    (columnwise). The emulation keeps no codes apart from their values, so its dequantize
    is its row-wise data and is checked by the first."""
    kind = type(quantizer).__name__
    x = x.detach()
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    fmt = quantizer.fmt
    fp8_max = _FORMATS[fmt][1]
    if kind == "DelayedQuantizer":
        scale = quantizer.scale.to(torch.float32)
        want = reference_dequantized(reference_codes(x2, scale, fmt), scale)
        want_t = None
    elif kind == "CurrentQuantizer":
        amax = x2.abs().max().to(torch.float32) if x2.numel() else torch.zeros(())
        scale = reference_scale(
            amax,
            fp8_max,
            pow2=quantizer.pow2,
            epsilon=quantizer.epsilon,
            value_for_inf=_value_for_inf(x.dtype),
        )
        want = reference_dequantized(reference_codes(x2, scale, fmt), scale)
        want_t = None
    elif kind == "BlockQuantizer":
        shapes = {"rows": (1, BLOCK), "cols": (BLOCK, 1), "tiles": (BLOCK, BLOCK)}
        rowwise = shapes["tiles"] if quantizer.block_dim == 2 else shapes["rows"]
        want = _block_reference(x2, fmt, rowwise, quantizer.pow2)
        want_t = (
            None
            if quantizer.block_dim == 2
            else _block_reference(x2, fmt, shapes["cols"], quantizer.pow2).t()
        )
    else:
        return None
    out = []
    data = result.data.reshape(x2.shape)
    ok = _same(data, want)
    k = _first_difference(ok)
    if k is not None:
        out.append(
            (
                "codes",
                f"element {k} of the row-wise copy: {float(data.reshape(-1)[k])!r}, the "
                f"reference cast of x = {float(x2.reshape(-1)[k])!r} gives "
                f"{float(want.reshape(-1)[k])!r}",
            )
        )
    data_t = result.data_t
    expected_t = data.t() if want_t is None else want_t
    if tuple(data_t.shape) != tuple(expected_t.shape):
        out.append(
            (
                "columnwise",
                f"column-wise copy of shape {list(data_t.shape)}, "
                f"expected {list(expected_t.shape)}",
            )
        )
        return out
    ok = _same(data_t, expected_t)
    k = _first_difference(ok)
    if k is not None:
        source = "the row-wise copy transposed" if want_t is None else "the 128x1 reference"
        out.append(
            (
                "columnwise",
                f"element {k} of the column-wise copy: {float(data_t.reshape(-1)[k])!r}, "
                f"{source} has {float(expected_t.reshape(-1)[k])!r}",
            )
        )
    return out


def _block_reference(x2, fmt, shape, pow2):
    """Quantize-dequantize of x2 [m, n] with one scale per `shape` tile (rows, cols), the
    scale from the tile's amax (reference_scale), in float64."""
    m, n = x2.shape
    tiles = _blocks(x2, *shape)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    scale = reference_scale(
        amax, _FORMATS[fmt][1], pow2=pow2, value_for_inf=_value_for_inf(x2.dtype)
    )
    values = reference_dequantized(reference_codes(tiles, scale, fmt), scale)
    return values.reshape(tiles.shape[0] * shape[0], tiles.shape[2] * shape[1])[:m, :n]


# ----------------------------------------------------------------------------------------
# TE's quantized tensors


def te_classes():
    """TensorChecks' `classes` from TE's modules (imports TE)."""
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.ops.op import FusibleOperation
    from transformer_engine.pytorch.quantized_tensor import (
        QuantizedTensor,
        QuantizedTensorStorage,
        Quantizer,
    )
    from transformer_engine.pytorch.tensor.float8_tensor import (
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
    )
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import (
        Float8BlockwiseQTensorStorage,
    )
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import (
        Float8TensorStorage,
    )

    return {
        "FusibleOperation": FusibleOperation,
        "Quantizer": Quantizer,
        "QuantizedTensor": QuantizedTensor,
        "QuantizedTensorStorage": QuantizedTensorStorage,
        "Float8TensorStorage": Float8TensorStorage,
        "Float8BlockwiseQTensorStorage": Float8BlockwiseQTensorStorage,
        "Float8Quantizer": Float8Quantizer,
        "Float8CurrentScalingQuantizer": Float8CurrentScalingQuantizer,
        "E5M2": DType.kFloat8E5M2,
    }


class TensorChecks:
    """The record of one path's quantized tensors (TEBuilder.fusion_scope): recording()
    wraps TE's entry points for the body of a `with`, each tensor is checked as it is made,
    take() hands over what was checked since the last take.

    `classes`: TE's FusibleOperation (optional: without it no op's output is checked),
    Quantizer, QuantizedTensor, QuantizedTensorStorage,
    Float8TensorStorage, Float8BlockwiseQTensorStorage, Float8Quantizer and
    Float8CurrentScalingQuantizer by name, and "E5M2": DType.kFloat8E5M2 (te_classes());
    `op_of(quantizer, tensor)`: (spec op index, label) of the op that owns the quantizer or
    the tensor, (-1, "?") if none;
    `copies_of(tensor)`: te/backend.py: transposed_copies;
    `handed_by(op, backward)`: (spec op index, label) of a te.ops op (basic or fused) that
    handed a tensor on, in backward or forward, where op_of knows no owner (a tensor's
    quantizer is a copy of its op's: quantized_tensor.py); None: (-1, "?")."""

    def __init__(self, classes, op_of, copies_of, handed_by=None):
        self.classes = classes
        self.op_of = op_of
        self.copies_of = copies_of
        self.handed_by = handed_by
        self.checked = 0
        self.violations = []
        self._depth = 0
        self._op_depth = 0
        # id() of the tensors checked as they were made since the last take(): an op that
        # hands one on is not checked again (an id reused meanwhile skips a check, no more).
        self._seen = set()
        # The tensors captured since the last check ([_Capture]): their buffers copied as
        # they were made, checked on the host together (_resolve).
        self._pending = []
        self._pending_bytes = 0

    def take(self):
        self._resolve()
        out = {"checked": self.checked, "violations": self.violations}
        self.checked, self.violations = 0, []
        self._seen = set()
        return out

    def _op_methods(self):
        """(class, name) of every fuser_forward and fuser_backward a te.ops op class defines
        itself (FusibleOperation and its subclasses, ours included)."""
        root = self.classes.get("FusibleOperation")
        if root is None:
            return []
        found, todo, classes, seen = [], [root], [], set()
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            classes.append(cls)
            todo.extend(cls.__subclasses__())
        for cls in classes:
            for name in ("fuser_forward", "fuser_backward"):
                if callable(cls.__dict__.get(name)):
                    found.append((cls, name))
        return found

    def _checking_handed_on(self, method, backward=True):
        """`method` (an op's fuser_forward or fuser_backward) whose first result, what the
        fuser hands the next op, is checked by record_handed_on (outermost call only)."""
        checks = self

        def handed_on(op, *args, **kwargs):
            checks._op_depth += 1
            try:
                result = method(op, *args, **kwargs)
            finally:
                checks._op_depth -= 1
            if checks._op_depth == 0 and isinstance(result, tuple) and result:
                checks.record_handed_on(result[0], op, backward)
            return result

        return handed_on

    @contextlib.contextmanager
    def recording(self):
        quantizer_cls = self.classes["Quantizer"]
        storage_cls = self.classes["QuantizedTensorStorage"]
        quantize = quantizer_cls.__dict__["quantize"]
        quantize_ = storage_cls.__dict__["quantize_"]
        checks = self

        def outermost(method, record):
            """`method` run with the nesting depth counted; `record(obj, tensor, kwargs,
            result)` after the outermost call only (a quantize that calls quantize_ is one
            tensor)."""

            def recorded(obj, tensor, **kwargs):
                checks._depth += 1
                try:
                    result = method(obj, tensor, **kwargs)
                finally:
                    checks._depth -= 1
                if checks._depth == 0:
                    record(obj, tensor, kwargs, result)
                return result

            return recorded

        recorded_quantize = outermost(
            quantize,
            lambda quantizer, tensor, kwargs, result: checks.record(tensor, quantizer, result),
        )

        def record_write(storage, tensor, kwargs, result):
            # A write TE may skip (noop_flag: a CUDA graph's weight-update flag) is not
            # checked: its data may rightly be the previous values.
            if kwargs.get("noop_flag") is None:
                checks.record(tensor, getattr(storage, "_quantizer", None), storage)

        recorded_quantize_ = outermost(quantize_, record_write)

        methods = [(cls, name, cls.__dict__[name]) for cls, name in self._op_methods()]
        quantizer_cls.quantize = recorded_quantize
        storage_cls.quantize_ = recorded_quantize_
        for cls, name, method in methods:
            setattr(cls, name, self._checking_handed_on(method, name == "fuser_backward"))
        try:
            yield self
        finally:
            for cls, name, method in reversed(methods):
                setattr(cls, name, method)
            quantizer_cls.quantize = quantize
            storage_cls.quantize_ = quantize_

    def record_handed_on(self, q, op=None, backward=True):
        """Checks a per-tensor FP8 tensor `op` handed on (in backward: its input gradient;
        in forward: its output) that was not checked as it was made (a cast inside a fused
        kernel) and holds both copies: its column-wise copy and dequantize(), as record
        does, without the codes (no high-precision values here). A violation names the
        op that handed it on where no op owns its quantizer."""
        if not isinstance(q, self.classes["Float8TensorStorage"]) or id(q) in self._seen:
            return
        quantizer = getattr(q, "_quantizer", None)
        try:
            with torch.no_grad():
                capture = self._capture_float8(None, quantizer, q)
        except Exception:  # noqa: BLE001 - our check's failure is no finding of TE's
            return
        self._keep(capture, quantizer, q, (op, backward))

    def record(self, x, quantizer, q):
        """Checks q, made by `quantizer` from x. Whatever goes wrong in the check itself
        (a layout it does not know, a freed buffer) skips the tensor, uncounted: TE's code
        path never sees an exception of ours, and TE's tensors are only read.

        The check reads copies of q's buffers (and x and q.dequantize()) taken as q is
        made, in one device copy per tensor, and runs on the host at the next take() with
        the copies of every tensor captured since brought over in one transfer: a call
        waits for the device once for its checks, not several times per tensor inside
        TE's forward and backward (issue 27 item 4)."""
        if not isinstance(x, torch.Tensor) or isinstance(x, self.classes["QuantizedTensor"]):
            return
        if not x.is_floating_point():
            return
        try:
            with torch.no_grad():
                capture = self._capture(x.detach(), quantizer, q)
        except Exception:  # noqa: BLE001 - our check's failure is no finding of TE's
            return
        self._keep(capture, quantizer, q)

    # The most bytes of copies held on a device before they are checked (a large case's
    # tensors are checked in several transfers rather than held for the whole call).
    PENDING_LIMIT = 256 << 20

    def _keep(self, capture, quantizer, q, handed=None):
        if capture is None:
            return  # a format not checked here
        self._seen.add(id(q))
        self._pending.append((capture, quantizer, q, handed))
        self._pending_bytes += capture.device_bytes
        if self._pending_bytes > self.PENDING_LIMIT:
            self._resolve()

    def _resolve(self):
        """Checks every captured tensor on the host: the device copies in one transfer."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        buffers = [c.buffer for c, *_ in pending if c.buffer is not None]
        host = torch.cat(buffers).cpu() if buffers else None
        offset = 0
        for capture, quantizer, q, handed in pending:
            part = None
            if capture.buffer is not None:
                part = host[offset : offset + capture.device_bytes]
                offset += capture.device_bytes
            try:
                found = capture.check(self, capture.unpack(part))
            except Exception:  # noqa: BLE001 - our check's failure is no finding of TE's
                continue
            by = None
            if found and handed is not None and self.handed_by is not None:
                op, backward = handed
                try:
                    by = self.handed_by(op, backward) if op is not None else None
                except Exception:  # noqa: BLE001
                    by = None
            self._count(found, quantizer, q, by)

    def _count(self, found, quantizer, q, by=None):
        """Counts a checked tensor (found: [(what, note)], None where not checked) and keeps
        its violations, each named by the op that owns the quantizer, else `by`."""
        if found is None:
            return
        self.checked += 1
        if not found:
            return
        try:
            op, label = self.op_of(quantizer, q)
        except Exception:  # noqa: BLE001
            op, label = -1, "?"
        if op < 0 and by is not None and by[0] >= 0:
            op, label = by
        for what, note in found:
            self.violations.append(
                {
                    "op": op,
                    "quantizer": f"quantized_tensor[{label}]",
                    "what": what,
                    "note": f"{type(quantizer).__name__}: {note}",
                }
            )

    def check(self, x, quantizer, q):
        """[(what, note)] of q, or None where its format is not checked here (at once)."""
        capture = self._capture(x, quantizer, q)
        if capture is None:
            return None
        part = capture.buffer.cpu() if capture.buffer is not None else None
        return capture.check(self, capture.unpack(part))

    def _capture(self, x, quantizer, q):
        c = self.classes
        if isinstance(q, c["Float8TensorStorage"]):
            return self._capture_float8(x, quantizer, q)
        if isinstance(q, c["Float8BlockwiseQTensorStorage"]):
            return self._capture_blockwise(x, quantizer, q)
        return None  # MXFP8, NVFP4: no exact rule readable here

    def _fmt(self, q):
        return "E5M2" if int(q._fp8_dtype) == int(self.classes["E5M2"]) else "E4M3"

    # -- per-tensor scaling (Float8Tensor: DelayedScaling, Float8CurrentScaling)

    def _capture_float8(self, x, quantizer, q):
        """x None: a tensor without its high-precision values (record_handed_on): the
        codes are not checked, the shape and dtype are q's own. What the scale is read
        from (_per_tensor_scale): a Float8Quantizer's `scale` tensor, which the recipe
        state updates only after the autocast or the backward (quantization.py:
        reduce_and_update_fp8_tensors), so it is copied as the cast's here; a
        Float8CurrentScalingQuantizer's options."""
        c = self.classes
        scale_inv = q._scale_inv
        if scale_inv is None or scale_inv.numel() != 1:
            return None
        data = q._data
        transpose = q._transpose if not q._transpose_invalid else None
        if x is None:
            # Only a tensor with both copies: its dequantize() reads the row-wise one.
            if data is None or transpose is None:
                return None
            dtype = getattr(q, "_dtype", None) or torch.float32
        else:
            if data is None and transpose is None:
                return None
            dtype = x.dtype
        meta = {"fmt": self._fmt(q), "dtype": dtype, "scaling": None}
        scale = None
        if isinstance(quantizer, c["Float8Quantizer"]):
            scale = getattr(quantizer, "scale", None)
            if not (isinstance(scale, torch.Tensor) and scale.numel() == 1):
                scale = None
            meta["scaling"] = "delayed"
        elif isinstance(quantizer, c["Float8CurrentScalingQuantizer"]):
            meta["scaling"] = "current"
            meta["pow2"] = bool(getattr(quantizer, "force_pow_2_scales", False))
            meta["reduction"] = bool(getattr(quantizer, "with_amax_reduction", False))
            meta["epsilon"] = float(getattr(quantizer, "amax_epsilon", 0.0) or 0.0)
        tensors = {
            "x": x,
            "scale_inv": scale_inv,
            "data": data,
            "transpose": transpose,
            "scale": scale,
            "dequantized": q.dequantize(dtype=dtype),
        }
        return _Capture(TensorChecks._check_float8, meta, tensors)

    @staticmethod
    def _per_tensor_scale(x, meta, scale, scale_inv):
        """The scale TE's cast multiplied by, as an fp32 scalar tensor, or None where it
        cannot be known exactly. Float8Quantizer (delayed scaling): its `scale` tensor as
        it was when the tensor was made. Float8CurrentScalingQuantizer: the scale of x's
        amax by TE's rule (reference_scale), taken where its fp32 reciprocal is the
        tensor's scale_inv (the kernel's scale_inv = 1/scale); with an amax reduction
        across ranks x's own amax is not the one used, and an exact power of two scale_inv
        under force_pow_2_scales is inverted exactly. Otherwise None: the codes are not
        checked."""
        if meta["scaling"] == "delayed":
            if scale is None:
                return None
            return scale.reshape(()).to(torch.float32).clone()
        if meta["scaling"] != "current":
            return None
        pow2 = meta["pow2"]
        if not meta["reduction"] and x.numel():
            amax = x.abs().max().to(torch.float32)
            candidate = reference_scale(
                amax,
                _FORMATS[meta["fmt"]][1],
                pow2=pow2,
                epsilon=meta["epsilon"],
                value_for_inf=_value_for_inf(x.dtype),
            )
            if torch.equal(torch.reciprocal(candidate), scale_inv):
                return candidate
        if pow2 and _is_power_of_two(scale_inv):
            return torch.reciprocal(scale_inv)
        return None

    def _check_float8(self, meta, t):
        """The checks of a captured per-tensor FP8 tensor (t: its copies on the host)."""
        fmt = meta["fmt"]
        fp8_dtype = _FORMATS[fmt][0]
        scale_inv = t["scale_inv"].reshape(()).to(torch.float32)
        x, data, transpose = t["x"], t["data"], t["transpose"]
        if x is not None:
            n = x.shape[-1] if x.dim() else 1
        elif data is not None:
            n = data.shape[-1] if data.dim() else 1
        else:
            n = transpose.shape[0] if transpose.dim() else 1
        rows = data.reshape(-1, n) if data is not None else None
        cols = transpose.reshape(n, -1) if transpose is not None else None
        out = []
        codes = rows if rows is not None else cols.t()
        if x is None:
            self._check_transpose(out, rows, cols, n)
            self._check_dequantize(
                out, t["dequantized"], meta["dtype"], codes.view(fp8_dtype), scale_inv, codes.shape
            )
            return out
        x2 = x.reshape(-1, n)
        scale = self._per_tensor_scale(x2, meta, t["scale"], scale_inv)
        if scale is not None:
            want = reference_codes(x2, scale, fmt).view(torch.uint8)
            mismatch = _code_mismatch(codes, want, x2, fp8_dtype, "the row-wise codes")
            if mismatch:
                out.append(("codes", f"scale {float(scale)!r}: {mismatch}"))
        if rows is not None and cols is not None:
            self._check_transpose(out, rows, cols, n)
        self._check_dequantize(
            out, t["dequantized"], x.dtype, codes.view(fp8_dtype), scale_inv, x2.shape
        )
        return out

    @staticmethod
    def _check_transpose(out, rows, cols, n):
        # float8_tensor_storage.py: _create_transpose makes _transpose by fp8_transpose of
        # _data; the cast-transpose kernel writes both at once. Either way the bytes are the
        # same, transposed over the last dimension.
        ok = cols.t() == rows
        k = _first_difference(ok)
        if k is not None:
            i, j = divmod(k, n)
            out.append(
                (
                    "columnwise",
                    f"_transpose[{j}, {i}] is byte {int(cols[j, i])}, _data[{i}, {j}] "
                    f"byte {int(rows[i, j])}",
                )
            )

    # -- block scaling (Float8BlockwiseQTensor: Float8BlockScaling)

    def _capture_blockwise(self, x, quantizer, q):
        """Float8BlockQuantizer's layout (float8_blockwise_tensor.py: get_scale_shape,
        get_columnwise_shape; the storage's dequantize), read by _check_blockwise; a copy
        with its scale inverses only (both None: nothing to check)."""
        rows, row_inv = q._rowwise_data, q._rowwise_scale_inv
        cols, col_inv = q._columnwise_data, q._columnwise_scale_inv
        has_rows = rows is not None and row_inv is not None
        has_cols = cols is not None and col_inv is not None
        if not has_rows and not has_cols:
            return None
        two_d = bool(q._is_2D_scaled)
        meta = {
            "fmt": self._fmt(q),
            "block": int(getattr(quantizer, "block_len", BLOCK) or BLOCK),
            "two_d": two_d,
            "copies": 0,
        }
        tensors = {
            "x": x,
            "rows": rows if has_rows else None,
            "row_inv": row_inv if has_rows else None,
            "cols": cols if has_cols else None,
            "col_inv": col_inv if has_cols else None,
            "dequantized": q.dequantize(dtype=x.dtype),
        }
        if two_d and has_rows and has_cols:
            copies = self.copies_of(q)
            if copies is not None:
                meta["copies"] = len(copies)
                tensors.update({f"copy{k}": t for k, t in enumerate(copies)})
        return _Capture(TensorChecks._check_blockwise, meta, tensors)

    def _check_blockwise(self, meta, t):
        """Row-wise data [m, n] (x flattened to 2D over its last dimension), column-wise
        data [n, m]; 2D blocks: row-wise scales [ceil(m/128), ceil(n/128) padded to 4],
        column-wise [ceil(n/128), ceil(m/128) padded]; 1D blocks: row-wise scales
        [ceil(n/128), m padded to 4] (one per 1x128 block of a row, stored transposed),
        column-wise [ceil(m/128), n padded] (one per 128x1 block of a column). The codes
        are checked only where every scale inverse of the copy is a power of two
        (force_pow_2_scales, the recipe's default): then the cast's multiplier is
        1/scale_inv exactly, whether the kernel multiplies by the scale or divides by its
        inverse; the scale TE derives from a block's amax without power-of-two scales is
        not readable from TE's Python code, so those are skipped."""
        fmt = meta["fmt"]
        fp8_dtype = _FORMATS[fmt][0]
        block, two_d = meta["block"], meta["two_d"]
        x = t["x"]
        n = x.shape[-1] if x.dim() else 1
        x2 = x.reshape(-1, n)
        m = x2.shape[0]
        tm, tn = -(-m // block), -(-n // block)
        out = []
        rows = t["rows"]
        row_scales = None
        if rows is not None:
            rows = rows.reshape(m, n)
            s = t["row_inv"].to(torch.float32)
            if two_d:
                s = s[:tm, :tn]
                row_scales = s.repeat_interleave(block, 0)[:m].repeat_interleave(block, 1)[:, :n]
            else:
                s = s[:tn, :m].t()  # [m, ceil(n/128)]
                row_scales = s.repeat_interleave(block, 1)[:, :n]
        cols = t["cols"]
        col_scales = None  # per element of x2 [m, n]
        if cols is not None:
            cols = cols.reshape(n, m)
            s = t["col_inv"].to(torch.float32)
            if two_d:
                s = s[:tn, :tm].t()  # [ceil(m/128), ceil(n/128)]
                col_scales = s.repeat_interleave(block, 0)[:m].repeat_interleave(block, 1)[:, :n]
            else:
                s = s[:tm, :n]  # [ceil(m/128), n]
                col_scales = s.repeat_interleave(block, 0)[:m]
        for name, codes, scales in (
            ("row-wise", rows, row_scales),
            ("column-wise", None if cols is None else cols.t(), col_scales),
        ):
            if scales is None or not _is_power_of_two(scales):
                continue
            want = reference_codes(x2, torch.reciprocal(scales), fmt).view(torch.uint8)
            mismatch = _code_mismatch(codes, want, x2, fp8_dtype, f"the {name} codes")
            if mismatch:
                # 1D blocks: the column-wise copy is a quantization of its own (128x1).
                what = "codes" if name == "row-wise" or two_d else "columnwise"
                out.append((what, mismatch))
        copies = [t[f"copy{k}"] for k in range(meta["copies"])]
        for k, (a, b) in enumerate(zip(copies[0::2], copies[1::2])):
            if not torch.equal(a, b):
                part = "data" if k == 0 else "scale inverses"
                out.append(
                    (
                        "columnwise",
                        f"2D blocks: the column-wise {part} are not the row-wise ones transposed",
                    )
                )
        if row_scales is not None:
            codes, scales = rows, row_scales
        else:
            codes, scales = cols.t(), col_scales
        self._check_dequantize(
            out, t["dequantized"], x.dtype, codes.view(fp8_dtype), scales, x2.shape
        )
        return out

    # -- dequantize, every format

    @staticmethod
    def _check_dequantize(out, dequantized, dtype, codes, scale_inv, shape):
        """q.dequantize(dtype=x's dtype) (`dequantized`, as it was when q was made) must be
        each code times its scale inverse rounded to dtype: once from the exact (float64)
        product, or through the fp32 product as TE's Python dequantize does
        (float8_tensor_storage.py: _FromFloat8Func.forward's CPU path, the blockwise
        storage's dequantize: `.to(torch.float32) * scale_inv` then `.to(dtype)`); the CUDA
        kernel is taken to do one of the two (not readable here). For an fp32 result both
        are the same value."""
        got = dequantized.reshape(shape)
        exact = (codes.to(torch.float64) * scale_inv.to(torch.float64)).to(dtype)
        via_fp32 = (codes.to(torch.float32) * scale_inv.to(torch.float32)).to(dtype)
        ok = _same(got, exact) | _same(got, via_fp32)
        k = _first_difference(ok)
        if k is not None:
            out.append(
                (
                    "dequantize",
                    f"element {k}: dequantize() gives {float(got.reshape(-1)[k])!r}, code "
                    f"{float(codes.reshape(-1)[k].float())!r} times its scale inverse "
                    f"{float(scale_inv.expand(shape).reshape(-1)[k])!r} is "
                    f"{float(exact.reshape(-1)[k])!r}",
                )
            )


class _Capture:
    """A quantized tensor's buffers (and the values its check compares them with) copied
    as it was made: those on a device into one byte buffer of that device in one copy
    (`buffer`, `device_bytes` long), those on the host cloned; `unpack` gives them back
    on the host, named, from the buffer's bytes once they are there. `check(checks,
    meta, tensors)` is run on them (TensorChecks._check_float8, _check_blockwise)."""

    # Device types whose tensors are cloned where they are rather than put in the buffer
    # (the tests put the CPU's in the buffer too, to take the device path on a CPU).
    ON_HOST = ("cpu",)

    def __init__(self, check, meta, tensors):
        self._check = check
        self.meta = meta
        self.host = {}
        self.layout = []  # (name, dtype, shape, bytes) of the buffer's parts, in order
        parts = []
        for name, t in tensors.items():
            if t is None:
                self.host[name] = None
                continue
            t = t.detach()
            if t.device.type in self.ON_HOST:
                self.host[name] = t.clone()
                continue
            flat = t.contiguous().reshape(-1).view(torch.uint8)
            self.layout.append((name, t.dtype, tuple(t.shape), flat.numel()))
            parts.append(flat)
        devices = {p.device for p in parts}
        if len(devices) > 1:
            raise ValueError(f"a quantized tensor's buffers on several devices: {devices}")
        self.buffer = torch.cat(parts) if parts else None
        self.device_bytes = self.buffer.numel() if parts else 0

    def unpack(self, host_bytes):
        out = dict(self.host)
        offset = 0
        for name, dtype, shape, size in self.layout:
            # A clone: each value aligned for its dtype and in a storage of its own.
            out[name] = host_bytes[offset : offset + size].clone().view(dtype).reshape(shape)
            offset += size
        return out

    def check(self, checks, tensors):
        return self._check(checks, self.meta, tensors)


def _is_power_of_two(t):
    """Whether every element of fp32 `t` is a finite positive power of two (an exact
    reciprocal)."""
    t = t.to(torch.float32)
    if not bool(torch.all(torch.isfinite(t) & (t > 0))):
        return False
    mantissa, _ = torch.frexp(t)
    return bool(torch.all(mantissa == 0.5))


def _code_mismatch(codes, want, x2, fp8_dtype, name):
    """A note on the first byte of `codes` that differs from `want` (uint8, both [m, n]),
    or None."""
    if tuple(codes.shape) != tuple(want.shape):
        return f"{name} have shape {list(codes.shape)}, expected {list(want.shape)}"
    ok = codes == want
    k = _first_difference(ok)
    if k is None:
        return None
    n = want.shape[1]
    i, j = divmod(k, n)
    got = codes[i, j : j + 1]
    expected = want[i, j : j + 1]
    return (
        f"{name}[{i}, {j}] of x = {float(x2[i, j])!r}: TE's code {int(got)} "
        f"({float(got.view(fp8_dtype).float())!r}), expected {int(expected)} "
        f"({float(expected.view(fp8_dtype).float())!r})"
    )
