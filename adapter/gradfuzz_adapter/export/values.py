"""The case's values as source text of an exported script: one line per tensor, within a
size budget.

Values travel in the export reply's JSON header, which the C++ side refuses beyond 64 MiB
(protocol.MAX_HEADER_BYTES); a [4096, 4096] float32 case inlined as base64 of float64
bytes was 358 MB, the "bad frame header length" of issue 15. So each value is written in
the smallest exact form, on one line, and the script stays under INLINE_BUDGET:

- a tensor of equal elements: `torch.full([4, 8], 2.5e-07, dtype=torch.float64)`;
- up to LITERAL_ELEMENTS elements whose literal fits LITERAL_WIDTH characters: a literal,
  each number in its shortest form for the case dtype,
  `torch.tensor([0.45, -1.25], dtype=torch.bfloat16).double()`, so a reader sees them;
- otherwise `unpack("<base64>", "bfloat16", [4, 8])`: base64 of the raw little-endian
  bytes in the case dtype (exact: the values are already rounded to it; the oracle's
  allowances and a quantizing case's expected values in float64), which the script's
  3-line `unpack` (export/support.py) decodes bit for bit;
- values that do not fit the budget (largest first) go to a data file beside the script
  when the request names one (`data_file`: torch.save of {key: tensor}, read with
  `load_values`), else are drawn in the script from a seed as gradfuzz draws them
  (`seeded`): then the script's values are not replay's, and `notes` says so.

The helpers the script needs (support.py: unpack, seeded, load_values) are listed in
`helpers`. Imports only torch.
"""

import base64
import os
import zlib

import torch

from ..protocol import DTYPE_NAMES, tensor_bytes

INLINE_BUDGET = 4 << 20
LITERAL_ELEMENTS = 64
LITERAL_WIDTH = 80


def _keys(case, extra=None):
    """(key, tensor, role) for every value of the case, in the request's order, then the
    `extra` ones ({key: tensor}: the oracle's per-element allowances)."""
    out = [("input", case.input, "input")]
    for op in case.ops:
        for j, p in enumerate(op.params):
            role = "weight" if p is not None and p.dim() >= 2 else "vector"
            out.append((f"param[{op.index}][{j}]", p, role))
    out += [(f"extra_input[{k}]", e, "input") for k, e in enumerate(case.extra_inputs)]
    out += [(f"cotangent[{k}]", c, "normal") for k, c in enumerate(case.cotangents)]
    for k, (x, extras) in enumerate(case.call_inputs):
        out.append((f"call[{k}].input", x, "input"))
        out += [(f"call[{k}].extra_input[{j}]", e, "input") for j, e in enumerate(extras)]
    out += [(f"allowance {key}", t, "allowance") for key, t in (extra or {}).items()]
    return [(key, t, role) for key, t, role in out if t is not None]


def _packed(t, dtype):
    """base64 of `t`'s raw little-endian bytes in `dtype` (floating) or int64."""
    t = t.detach().cpu()
    t = t.to(dtype) if t.is_floating_point() else t.to(torch.int64)
    return base64.b64encode(tensor_bytes(t)).decode("ascii")


def _dtype_name(dtype):
    """torch's name of `dtype` ("bfloat16", "float8_e4m3fn"), as getattr(torch, name) reads."""
    return str(dtype).removeprefix("torch.")


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def spelled(t, dtype):
    """The one-line source of value `t` held exactly in `dtype` (the case dtype, or float64
    for bounds and expected values): a float64 (or int64) tensor when the script runs it."""
    if not t.is_floating_point():
        dtype = torch.int64
    elif bool(t.isnan().any()):
        dtype = torch.float64  # converting a NaN to bfloat16 can drop its payload bits
    widen = "" if dtype in (torch.float64, torch.int64) else ".double()"
    shape = list(t.shape)
    if t.numel() == 0:
        return f"torch.zeros({shape}, dtype=torch.{_dtype_name(dtype)}){widen}"
    flat = t.detach().cpu().to(dtype).reshape(-1)
    bits = flat.view(_BITS[flat.element_size()])  # -0.0 is not 0.0, a NaN is itself
    if t.numel() > 1 and bool((bits == bits[0]).all()) and not flat[0].isnan():
        value = _shortest(flat[0].item(), dtype) if t.is_floating_point() else str(flat[0].item())
        return f"torch.full({shape}, {value}, dtype=torch.{_dtype_name(dtype)}){widen}"
    if t.numel() <= LITERAL_ELEMENTS and not flat.isnan().any():  # a NaN literal loses its bits
        text = _literal(t, dtype)
        if len(text) <= LITERAL_WIDTH:
            return text
    return f'unpack("{_packed(t, dtype)}", "{_dtype_name(dtype)}", {shape})'


def _shortest(value, dtype):
    """The shortest decimal that rounds to `value` in `dtype` ("-0.6041604" for a float32,
    "0.45" for a bfloat16): the literal then reads as the case's number."""
    if value != value or value in (float("inf"), float("-inf")):
        return f'float("{value}")'
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if torch.tensor(float(text), dtype=dtype).item() == value:
            return text if any(c in text for c in ".en") else text + ".0"
    return repr(value)


def _nested(values, dtype):
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v, dtype) for v in values) + "]"
    return _shortest(values, dtype) if isinstance(values, float) else str(values)


def _literal(t, dtype):
    """A one-line literal: floats in their shortest form for `dtype`, read in that dtype and
    widened (exact), integers as int64."""
    values = t.detach().cpu()
    if not values.is_floating_point():
        return f"torch.tensor({values.to(torch.int64).tolist()!r})"
    text = _nested(values.to(torch.float64).tolist(), dtype)
    suffix = (
        ", dtype=torch.float64)"
        if dtype == torch.float64
        else f", dtype=torch.{_dtype_name(dtype)}).double()"
    )
    return f"torch.tensor({text}{suffix}"


class ScriptValues:
    """Decides, for every value of `case`, how the script spells it (see the module's
    docstring); expr(t) is the source of value `t`."""

    def __init__(self, case, *, data_file=None, budget=None, extra=None):
        budget = INLINE_BUDGET if budget is None else budget
        self.case = case
        self.data_file = data_file
        self.dtype = case.dtype
        self.helpers = set()
        self.data = {}
        self.notes = []
        self.by_id = {}
        entries = []
        for key, t, role in _keys(case, extra):
            if id(t) in self.by_id:
                continue
            # Allowances and expected values are float64, not values rounded to the case dtype.
            source = spelled(t, torch.float64 if role == "allowance" else self.dtype)
            self.by_id[id(t)] = source
            if source.startswith("unpack("):
                entries.append((len(source), key, t, role))
        total = sum(size for size, *_ in entries)
        outside = []
        for size, key, t, role in sorted(entries, key=lambda e: -e[0]):
            if total <= budget:
                break
            if not t.is_floating_point():
                continue  # split sizes and routing maps: a row count of int64, always small
            if role == "allowance" and data_file is None:
                continue  # a bound cannot be drawn from a seed
            total -= size
            outside.append((key, t, role))
        if any(source.startswith("unpack(") for source in self.by_id.values()):
            self.helpers.add("unpack")
        for key, t, role in outside:
            self.by_id[id(t)] = self._outside(key, t, role)
        if outside and data_file is None:
            names = ", ".join(key for key, _, _ in outside)
            self.notes.append(
                f"{names}: too large to inline (budget {budget} bytes) and no data file was "
                "requested, so the script draws them from a seed as gradfuzz draws them: its "
                "values are not the case's, and a value-dependent result may differ from "
                "replay's"
            )

    def _outside(self, key, t, role):
        if self.data_file is not None:
            self.data[key] = t.detach().cpu().to(torch.float64)
            self.helpers.add("load_values")
            return f"VALUES[{key!r}]"
        self.helpers.add("seeded")
        seed = (int(self.case.spec.get("seed", 0)) * 1000003 + zlib.crc32(key.encode())) % (2**63)
        fan_in = int(t.shape[-1]) if role == "weight" else 0
        dtype_name = DTYPE_NAMES[self.dtype]
        shape = list(t.shape)
        return f"seeded({shape}, {dtype_name!r}, seed={seed}, role={role!r}, fan_in={fan_in})"

    def expr(self, t):
        """The source of value `t` (one of the case's tensors), "None" for None."""
        if t is None:
            return "None"
        return self.by_id[id(t)]

    def prelude(self):
        """Source lines the script runs before it uses any value (the data file's load)."""
        if not self.data:
            return []
        name = os.path.basename(self.data_file)
        return [f"VALUES = load_values({name!r})  # written beside this file by gradfuzz export"]

    def save(self):
        """Writes the data file (when values went there)."""
        if self.data:
            torch.save(self.data, self.data_file)
