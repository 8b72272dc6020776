"""The case's values as source text of an exported script, within a size budget.

Values travel in the export reply's JSON header, which the C++ side refuses beyond 64 MiB
(protocol.MAX_HEADER_BYTES); a [4096, 4096] float32 case inlined as base64 of float64
bytes was 358 MB, the "bad frame header length" of issue 15. So each value is written in
the smallest exact form and the script stays under INLINE_BUDGET:

- up to LITERAL_ELEMENTS elements: a literal, each number in its shortest form for the
  case dtype, `torch.tensor([0.45, -1.25], dtype=torch.bfloat16).double()`;
- otherwise inlined: `unpack("<base64>", "bfloat16", [4, 8])`, the bytes in the case
  dtype (exact: the values are already rounded to it) compressed with zlib;
- values that do not fit the budget (largest first) go to a data file beside the script
  when the request names one (`data_file`: torch.save of {key: tensor}, read with
  `load_values`), else are drawn in the script from a seed as gradfuzz draws them
  (`seeded`): then the script's values are not replay's, and `notes` says so.

The helpers the script needs (script_support.unpack, seeded, load_values) are listed in
`helpers`. Imports only torch.
"""

import base64
import os
import zlib

import torch

from .protocol import DTYPE_NAMES, tensor_bytes

INLINE_BUDGET = 4 << 20
LITERAL_ELEMENTS = 64


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
    """base64 of zlib of `t`'s bytes in `dtype` (floating) or int64."""
    t = t.detach().cpu()
    t = t.to(dtype) if t.is_floating_point() else t.to(torch.int64)
    return base64.b64encode(zlib.compress(tensor_bytes(t), 9)).decode("ascii")


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
    """A literal of a few elements: floats in their shortest form for the case dtype, read
    in that dtype and widened (exact), integers as int64; a matrix one row per line."""
    values = t.detach().cpu()
    if not values.is_floating_point():
        return f"torch.tensor({values.to(torch.int64).tolist()!r})"
    rows = values.to(torch.float64).tolist()
    text = _nested(rows, dtype)
    if len(text) > 70 and values.dim() == 2:
        text = "[\n" + "".join(f"    {_nested(row, dtype)},\n" for row in rows) + "]"
    suffix = (
        ", dtype=torch.float64)"
        if dtype == torch.float64
        else f", dtype=torch.{DTYPE_NAMES[dtype]}).double()"
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
            if t.numel() <= LITERAL_ELEMENTS:
                exact = torch.float64 if role == "allowance" else self.dtype
                self.by_id[id(t)] = _literal(t, exact)
                continue
            # Allowances are float64 bounds, not values rounded to the case dtype.
            dtype = torch.float64 if role == "allowance" else self.dtype
            dtype_name = DTYPE_NAMES[dtype] if t.is_floating_point() else "int64"
            text = _packed(t, dtype)
            source = f'unpack("{text}", "{dtype_name}", {list(t.shape)})'
            self.by_id[id(t)] = source
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
