#!/usr/bin/env python3
"""Mutated case files for the nightly acceptance of issue 7 (scripts/nightly-acceptance.sh mutate).

Reads the case files of a directory (default corpus/regression) and writes COUNT mutated
files m0000.json, m0001.json, ... to OUT, plus OUT/manifest.tsv: one line per file with its
name, the case file it was made from and what was done to it. File i depends only on
(--seed, i) and the sorted source files, so a run is reproducible and a single file can be
regenerated alone.

The mutations: deep nesting (to 100000), huge or malformed shapes ([2^62,2^62],
[100000,100000], 0, negative, 3-D, floats, strings), huge, tiny and non-finite numbers
(2^63-1, 2^64, 1e400, 1e-310, NaN/Infinity literals), wrong JSON types, strings for numbers,
missing and unknown keys, duplicate keys, truncated, empty and binary files, 10^5 groups,
10^5..10^6 ops, 10^5-entry arrays, long and non-ASCII strings (invalid UTF-8, lone
surrogates, NUL), unknown ops/fusions/dtypes/devices/backends, bad step indices, odd channel
wiring, valid cases near the size limits, and combinations of several.

Python standard library only.
"""

import argparse
import json
import os
import random
import sys

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)

BIG_INTS = [
    "4611686018427387904",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "99999999999999999999999999999999",
    "2147483648",
    "4294967296",
    "1048576",
    "1048577",
    "100000",
    "65536",
    "1025",
    "1024",
    "257",
    "256",
]
ODD_NUMBERS = [
    "1e400",
    "-1e400",
    "1E400",
    "1e-310",
    "-1e-310",
    "4.9e-324",
    "2.2250738585072014e-308",
    "1e308",
    "1.7976931348623157e308",
    "-0",
    "-0.0",
    "0",
    "-1",
    "0.5",
    "1.0000000000000002",
    "3.0",
    "1e2",
    "1e19",
    "-1e19",
    "9.223372036854775807e18",
]
NONFINITE = ["NaN", "Infinity", "-Infinity", "nan", "inf", "-inf", "+Infinity", "NAN"]
BAD_NUMBER_TEXT = ["007", "+1", "0x10", "1.", ".5", "1e", "1e+", "--1", "1_000", "0b1", "1,5", "١"]
OTHER_VALUES = [
    "null",
    "true",
    "false",
    "[]",
    "{}",
    '""',
    '"3"',
    '"abc"',
    "[1]",
    '{"a":1}',
    "[[[]]]",
]
UNICODE_STRINGS = [
    "ReLU\u0301",
    "\uff32\uff45\uff4c\uff55",
    "\U0001f600",
    "\u202eULeR",
    "Re\u200bLU",
    "\u00e9",
    "\u4e2d\u6587",
    "\ufeffReLU",
    "\u0000",
    "Re\u0000LU",
    "x" * 100000,
    "\U0010ffff",
    "\\" * 50,
    '"',
    "/",
    "~",
    "~1~0",
    "a/b~c",
]
RAW_UNICODE = [
    '"\\ud800"',
    '"\\udfff"',
    '"\\ud800\\ud800"',
    '"\\u0000"',
    '"\\uZZZZ"',
    '"\\x41"',
    '"\\"',
    '"tab\there"',
    '"new\nline"',
]
INVALID_UTF8 = [
    b"\xff\xfe",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\x80",
    b"\xe2\x82",
    b"\xfe",
]
OP_NAMES = [
    "AddExtraInput",
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
    "Reshape",
    "RowStat",
    "SReLU",
    "ScaledSReLU",
    "ScaledSwiGLU",
    "SwiGLU",
    "Boundary",
]
ATTR_NAMES = [
    "out",
    "groups",
    "scale",
    "features",
    "interleave",
    "s0",
    "s1",
    "in_place",
    "bias",
    "scale_bias",
    "zero_centered_gamma",
    "eps",
    "nonexistent",
]
# `gradfuzz list ops --json`: the attrs each op accepts (an unknown attr is rejected first).
OP_ATTRS = {
    "AddExtraInput": ["in_place"],
    "ConstantScale": ["scale"],
    "Dispatch": ["groups"],
    "DualExtraOutput": ["s0", "s1"],
    "GELU": ["cache_quantized_input"],
    "GroupedLinear": [
        "accumulate_into_main_grad",
        "bias",
        "delay_wgrad_compute",
        "groups",
        "out",
        "scale_bias",
        "single_grouped_bias",
        "single_grouped_weight",
    ],
    "LayerNorm": ["eps", "sm_margin", "zero_centered_gamma"],
    "Linear": ["accumulate_into_main_grad", "out"],
    "MakeExtraOutput": ["in_place"],
    "RMSNorm": ["eps", "sm_margin", "zero_centered_gamma"],
    "ReLU": ["cache_quantized_input"],
    "Reshape": ["features"],
    "SReLU": ["cache_quantized_input"],
    "ScaledSReLU": ["activation_recompute_in_mlp"],
    "ScaledSwiGLU": ["activation_recompute_in_mlp", "interleave"],
    "SwiGLU": ["cache_quantized_input", "interleave"],
}
FUSION_NAMES = [
    "FusedResidual.joint",
    "GroupedMLP",
    "FusedResidual.forward",
    "ForwardLinearBiasAdd",
    "ForwardLinearScaleAdd",
    "ForwardLinearBiasActivation",
    "FusedResidual.backward",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
]


class Doc:
    """A case file as a JSON tree whose leaves may be raw text (placed after dumping)."""

    def __init__(self, tree):
        self.tree = tree
        self.raw = {}

    def rawval(self, text):
        key = f"\u0001RAW{len(self.raw)}\u0001"
        self.raw[key] = text
        return key

    def dump(self, rng, compact=False):
        text = json.dumps(
            self.tree,
            indent=None if compact else 2,
            separators=(",", ":") if compact else None,
            ensure_ascii=rng.random() < 0.5,
        )
        for key, value in self.raw.items():
            quoted = json.dumps(key)
            if quoted not in text:
                quoted = json.dumps(key, ensure_ascii=False)
            text = text.replace(quoted, value)
        return text.encode("utf-8", "surrogatepass")


def paths(node, prefix=()):
    """Every (path, value) under node, containers included (the root excluded)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((prefix + (k,), v))
            out.extend(paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((prefix + (i,), v))
            out.extend(paths(v, prefix + (i,)))
    return out


def get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def put(tree, path, value):
    get(tree, path[:-1])[path[-1]] = value


def pstr(path):
    return "/" + "/".join(str(p) for p in path)


def pick_path(rng, doc, pred=lambda v: True):
    cands = [p for p, v in paths(doc.tree) if pred(v)]
    return rng.choice(cands) if cands else None


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def spec(doc):
    return doc.tree.setdefault("spec", {}) if isinstance(doc.tree, dict) else {}


def ops_of(doc):
    s = spec(doc)
    if not isinstance(s.get("ops"), list) or not s["ops"]:
        s["ops"] = [{"name": "ReLU"}]
    return s["ops"]


# --- mutators: each changes doc (or returns bytes) and returns a description --------------------


def m_nesting(rng, doc):
    depth = rng.choice([63, 64, 65, 100, 1000, 10000, 60000, 100000])
    kind = rng.choice(["array", "object", "mixed"])
    if kind == "array":
        raw = "[" * depth + "1" + "]" * depth
    elif kind == "object":
        raw = '{"a":' * depth + "1" + "}" * depth
    else:
        raw = '[{"a":' * (depth // 2) + "1" + "}]" * (depth // 2)
    where = rng.choice(["attr", "leaf", "root-key", "input_shape"])
    if where == "attr":
        op = rng.choice(ops_of(doc))
        op.setdefault("attrs", {})["out"] = doc.rawval(raw)
        at = "ops/*/attrs/out"
    elif where == "input_shape":
        spec(doc)["input_shape"] = doc.rawval(raw)
        at = "/spec/input_shape"
    elif where == "root-key":
        doc.tree["nested"] = doc.rawval(raw)
        at = "/nested"
    else:
        p = pick_path(rng, doc)
        put(doc.tree, p, doc.rawval(raw))
        at = pstr(p)
    return f"nesting depth {depth} ({kind}) at {at}"


SHAPES = [
    "[4611686018427387904,4611686018427387904]",
    "[100000,100000]",
    "[9223372036854775807,1]",
    "[1,9223372036854775807]",
    "[9223372036854775808,1]",
    "[18446744073709551616,2]",
    "[0,4]",
    "[4,0]",
    "[-1,4]",
    "[4,-9223372036854775808]",
    "[1,1048576]",
    "[1,1048577]",
    "[1048577,1]",
    "[16384,16384]",
    "[16385,16384]",
    "[1048576,256]",
    "[1048576,1024]",
    "[65536,4096]",
    "[4096,4096]",
    "[2048,2048]",
    "[46341,46341]",
    "[3037000500,3037000500]",
    "[1]",
    "[]",
    "[1,2,3]",
    "[1,1,1,1]",
    "[1.5,2]",
    '["4",8]',
    "[1e400,1]",
    "[null,1]",
    "[true,1]",
    "[4.0,8.0]",
    "[1e-310,1]",
    "[NaN,4]",
    "[Infinity,4]",
    "4",
    '"[4,8]"',
    "{}",
    "null",
    "[[4],[8]]",
    "[4,8,]",
    "[1e18,1e18]",
    "[-0,4]",
]


def m_shape(rng, doc):
    shape = rng.choice(SHAPES)
    spec(doc)["input_shape"] = doc.rawval(shape)
    return "input_shape " + shape


def m_attr(rng, doc):
    ops = ops_of(doc)
    op = rng.choice(ops)
    attrs = op.setdefault("attrs", {}) if isinstance(op, dict) else {}
    known = OP_ATTRS.get(op.get("name") if isinstance(op, dict) else None, [])
    name = rng.choice(known) if known and rng.random() < 0.85 else rng.choice(ATTR_NAMES)
    value = rng.choice(BIG_INTS + ODD_NUMBERS + NONFINITE + OTHER_VALUES)
    attrs[name] = doc.rawval(value)
    return "attr {}.{} = {}".format(op.get("name") if isinstance(op, dict) else "?", name, value)


def m_big_op(rng, doc):
    """One op with a size attr far past (or at) the limits, on a small or big input."""
    choice = rng.choice(
        [
            ("GroupedLinear", {"groups": 100000, "out": 3}, "[6,4]"),
            ("GroupedLinear", {"groups": 1024, "out": 3}, "[2048,4]"),
            ("GroupedLinear", {"groups": 1025, "out": 3}, "[2048,4]"),
            ("GroupedLinear", {"groups": 100000, "out": 100000}, "[100000,4]"),
            ("GroupedLinear", {"groups": I64_MAX, "out": 3}, "[6,4]"),
            ("Dispatch", {"groups": 100000}, "[6,8]"),
            ("Dispatch", {"groups": 1048576}, "[1048576,8]"),
            ("Dispatch", {"groups": 1024}, "[1024,1024]"),
            ("Linear", {"out": 1048576}, "[1,1048576]"),
            ("Linear", {"out": 16384}, "[16384,16384]"),
            ("Linear", {"out": 4096}, "[4096,4096]"),
            ("Linear", {"out": 2048}, "[2048,2048]"),
            ("Linear", {"out": 100000}, "[100000,100000]"),
            ("Linear", {"out": 4611686018427387904}, "[4,8]"),
            ("Reshape", {"features": 1}, "[1048576,256]"),
            ("Reshape", {"features": 3}, "[4,8]"),
            ("Reshape", {"features": 4611686018427387904}, "[4,8]"),
            ("SwiGLU", {"interleave": 4611686018427387904}, "[4,8]"),
            ("SwiGLU", {"interleave": 1048576}, "[1,1048576]"),
            ("LayerNorm", {}, "[1,1048576]"),
            ("RowStat", {}, "[1048576,256]"),
            ("ConstantScale", {"scale": 1e308}, "[16384,16384]"),
        ]
    )
    name, attrs, shape = choice
    s = spec(doc)
    s["ops"] = [
        {
            "name": name,
            "attrs": {k: float(v) if v < 2**53 else doc.rawval(str(v)) for k, v in attrs.items()},
        }
    ]
    if rng.random() < 0.5:
        s["ops"].append({"name": "Bias"})
    s["input_shape"] = doc.rawval(shape)
    s["fusions"] = []
    s.pop("call_then_bind", None)
    s.pop("late_binds", None)
    doc.tree.pop("wiring_error", None)
    return f"op {name} {attrs} on input_shape {shape} ({len(s['ops'])} ops)"


def m_delta(rng, doc):
    value = rng.choice(
        [
            "9223372036854775807",
            "-9223372036854775808",
            "18446744073709551616",
            "65",
            "-65",
            "64",
            "-64",
            "1000000",
            "1e400",
            "0.5",
            "NaN",
            '"1"',
            "null",
            "-1",
            "1",
        ]
    )
    spec(doc)["extra_input_count_delta"] = doc.rawval(value)
    return "extra_input_count_delta " + value


def m_seed(rng, doc):
    value = rng.choice(
        [
            "-1",
            "18446744073709551615",
            "18446744073709551616",
            "1.5",
            "1e400",
            '"7"',
            "null",
            "NaN",
            "-9223372036854775808",
            "0",
            "1e19",
        ]
    )
    spec(doc)["seed"] = doc.rawval(value)
    return "seed " + value


def m_wrong_type(rng, doc):
    p = pick_path(rng, doc)
    value = rng.choice(OTHER_VALUES + ["1", "-1", "2.5"])
    put(doc.tree, p, doc.rawval(value))
    return f"type of {pstr(p)} -> {value}"


def m_string_number(rng, doc):
    p = pick_path(rng, doc, is_num)
    if p is None:
        return m_wrong_type(rng, doc)
    value = get(doc.tree, p)
    put(doc.tree, p, str(value) if rng.random() < 0.7 else f" {value} ")
    return f"string for number at {pstr(p)} ({value!r})"


def m_number_text(rng, doc):
    p = pick_path(rng, doc, is_num)
    if p is None:
        return m_wrong_type(rng, doc)
    value = rng.choice(NONFINITE + BAD_NUMBER_TEXT + ODD_NUMBERS + BIG_INTS)
    put(doc.tree, p, doc.rawval(value))
    return f"number literal {value} at {pstr(p)}"


def m_missing_key(rng, doc):
    cands = [p for p, _ in paths(doc.tree) if isinstance(p[-1], str)]
    p = rng.choice(cands)
    del get(doc.tree, p[:-1])[p[-1]]
    return "missing key " + pstr(p)


def m_missing_essential(rng, doc):
    p = rng.choice(
        [
            ("spec",),
            ("spec", "ops"),
            ("spec", "input_shape"),
            ("spec", "dtype"),
            ("spec", "seed"),
            ("schema_version",),
            ("verdict",),
            ("verdict", "kind"),
            ("provenance",),
            ("spec", "ops", 0, "name"),
        ]
    )
    try:
        del get(doc.tree, p[:-1])[p[-1]]
    except (KeyError, IndexError, TypeError):
        pass
    return "missing key " + pstr(p)


def m_extra_key(rng, doc):
    objs = [p for p, v in paths(doc.tree) if isinstance(v, dict)] + [()]
    p = rng.choice(objs)
    key = rng.choice(["unknown", "", "ops", "\u00e9", "x" * 1000, "__proto__", "schema_version"])
    obj = get(doc.tree, p)
    value = rng.choice(OTHER_VALUES)
    if key in obj:
        key = key + "_"
    obj[key] = doc.rawval(value)
    return f"extra key {key[:20]!r} = {value} in {pstr(p)}"


def m_duplicate_key(rng, doc):
    dup = rng.choice(
        [
            '"dtype": "bfloat16"',
            '"ops": []',
            '"input_shape": [100000,100000]',
            '"seed": -1',
            '"dtype": 7',
            '"ops": [{"name": "Nope"}]',
        ]
    )
    text = doc.dump(rng).decode("utf-8", "surrogatepass")
    if rng.random() < 0.5:
        text = text.replace('"spec": {', '"spec": {' + dup + ",", 1)
        where = "first"
    else:
        idx = text.find('"spec": {')
        end = text.find("\n  }", idx)
        text = text[:end] + ",\n    " + dup + text[end:] if idx >= 0 and end >= 0 else text
        where = "last"
    return text.encode("utf-8", "surrogatepass"), f"duplicate key {dup} ({where})"


def m_truncate(rng, doc):
    data = doc.dump(rng)
    cut = rng.randrange(0, len(data))
    return data[:cut], f"truncated at byte {cut} of {len(data)}"


def m_file_bytes(rng, doc):
    data = doc.dump(rng)
    kind = rng.choice(
        [
            "empty",
            "whitespace",
            "nul",
            "random-bytes",
            "bom",
            "utf16",
            "trailing-garbage",
            "two-documents",
            "top-array",
            "top-number",
            "top-string",
            "top-null",
            "comment",
            "single-quotes",
            "trailing-comma",
            "huge-whitespace",
            "nul-inside",
            "gzip-magic",
        ]
    )
    if kind == "empty":
        out = b""
    elif kind == "whitespace":
        out = b" \n\t\r" * rng.randrange(1, 100)
    elif kind == "nul":
        out = b"\x00" * rng.randrange(1, 1000)
    elif kind == "random-bytes":
        out = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5000)))
    elif kind == "bom":
        out = b"\xef\xbb\xbf" + data
    elif kind == "utf16":
        out = data.decode("utf-8", "surrogatepass").encode("utf-16")
    elif kind == "trailing-garbage":
        out = data + rng.choice([b"x", b"}", b"]", b",", b"\x00", b"{}", b"\xff"])
    elif kind == "two-documents":
        out = data + b"\n" + data
    elif kind == "top-array":
        out = b"[" + data + b"]"
    elif kind == "top-number":
        out = rng.choice([b"1", b"1e400", b"-0", b"NaN"])
    elif kind == "top-string":
        out = json.dumps(data.decode("utf-8", "surrogatepass")).encode()
    elif kind == "top-null":
        out = rng.choice([b"null", b"true", b"{}", b"[]"])
    elif kind == "comment":
        out = b"// case\n" + data if rng.random() < 0.5 else data.replace(b"{", b"{ /* c */", 1)
    elif kind == "single-quotes":
        out = data.replace(b'"', b"'")
    elif kind == "trailing-comma":
        out = data.replace(b"\n  }", b",\n  }", 1)
    elif kind == "huge-whitespace":
        n = rng.choice([10**6, 10**7, 17 * 2**20])
        out = data.replace(b"{", b"{" + b" " * n, 1)
        kind += f" ({n} bytes)"
    elif kind == "nul-inside":
        i = rng.randrange(len(data))
        out = data[:i] + b"\x00" + data[i:]
    else:
        out = b"\x1f\x8b\x08\x00" + data
    return out, "file bytes: " + kind


def m_many_ops(rng, doc):
    n = rng.choice([257, 300, 1000, 10000, 100000, 1000000])
    name = rng.choice(["Identity", "ReLU", "Bias", "Boundary"])
    s = spec(doc)
    s["ops"] = [{"name": name}] * n
    s["fusions"] = []
    s.pop("call_then_bind", None)
    s.pop("late_binds", None)
    doc.tree.pop("wiring_error", None)
    return doc.dump(rng, compact=True), f"{n} ops ({name})"


def m_long_array(rng, doc):
    n = rng.choice([1000, 100000, 1000000])
    which = rng.choice(
        [
            "call_then_bind",
            "late_binds",
            "input_channels",
            "output_bindings",
            "fusions",
            "param_requires_grad",
            "extra_input_requires_grad",
            "input_shape",
        ]
    )
    s = spec(doc)
    ops = ops_of(doc)
    if which == "call_then_bind":
        s["call_then_bind"] = [{"op": 0, "grad_mode": True}] * n
    elif which == "late_binds":
        s["late_binds"] = [{"op": 0, "slot": 0, "channel": "c"}] * n
    elif which == "input_channels":
        ops[0]["input_channels"] = [f"c{i}" for i in range(n)] if rng.random() < 0.5 else [None] * n
    elif which == "output_bindings":
        ops[0]["output_bindings"] = [
            {"channel": f"c{i}", "output_to_caller": True} for i in range(n)
        ]
    elif which == "fusions":
        s["fusions"] = (
            [f"F{i}" for i in range(n)] if rng.random() < 0.5 else [rng.choice(FUSION_NAMES)] * n
        )
    elif which == "input_shape":
        s["input_shape"] = [1] * n
    else:
        ops[0][which] = [True] * n
    return doc.dump(rng, compact=True), f"{n} entries in {which}"


def m_unicode(rng, doc):
    strs = [p for p, v in paths(doc.tree) if isinstance(v, str)]
    p = rng.choice(strs) if strs else ("spec", "dtype")
    mode = rng.random()
    if mode < 0.5:
        value = rng.choice(UNICODE_STRINGS)
        put(doc.tree, p, value)
        return f"unicode string at {pstr(p)}: {value[:12]!r}"
    if mode < 0.8:
        raw = rng.choice(RAW_UNICODE)
        put(doc.tree, p, doc.rawval(raw))
        return f"raw string at {pstr(p)}: {raw}"
    marker = "\u0002INVALID\u0002"
    put(doc.tree, p, marker)
    bad = rng.choice(INVALID_UTF8)
    data = doc.dump(rng).replace(json.dumps(marker).encode(), b'"' + bad + b'"')
    return data, f"invalid UTF-8 {bad!r} at {pstr(p)}"


def m_names(rng, doc):
    s = spec(doc)
    what = rng.choice(
        [
            "op",
            "fusion",
            "dtype",
            "device",
            "backend",
            "verdict",
            "fault",
            "provenance-fault",
            "output_style",
            "wiring_error",
            "schema_version",
            "date",
        ]
    )
    if what == "op":
        value = rng.choice(["Nope", "", "relu", "Boundary", "Linear ", "LINEAR"] + OP_NAMES)
        rng.choice(ops_of(doc))["name"] = value
    elif what == "fusion":
        value = rng.choice(
            ["Nope", "", "a b", "GroupedMLP", "x" * 201, "FusedResidual.joint"] + FUSION_NAMES
        )
        s.setdefault("fusions", []).append(value) if isinstance(s.get("fusions"), list) else None
    elif what == "dtype":
        value = rng.choice(["bfloat16", "float16", "float8", "int64", "", "Float64", "complex128"])
        s["dtype"] = value
    elif what == "device":
        value = rng.choice(["cuda", "cuda:0", "cuda:7", "tpu", "", "CPU", "mps"])
        s["device"] = value
    elif what == "backend":
        value = rng.choice(["te", "torch", "nope", "", "model"])
        doc.tree["backend"] = value
    elif what == "verdict":
        value = rng.choice(
            ["crash", "timeout", "nope", "", "mismatch", "pass", "unsupported", "internal_error"]
        )
        doc.tree.setdefault("verdict", {})["kind"] = value
    elif what == "fault":
        value = rng.choice(["hang", "crash-segfault", "crash-abort", "oob-write", "nope", ""])
        doc.tree.setdefault("verdict", {})["fault"] = value
    elif what == "provenance-fault":
        value = rng.choice(["hang", "crash-segfault", "nope", ""])
        doc.tree.setdefault("provenance", {})["fault"] = value
    elif what == "output_style":
        value = rng.choice(["generator", "vector", "nope", ""])
        rng.choice(ops_of(doc))["output_style"] = value
    elif what == "wiring_error":
        value = rng.choice(["nope", "", "unbound_channel", "x" * 100000])
        doc.tree["wiring_error"] = value
    elif what == "schema_version":
        value = rng.choice(
            ["0", "2", "-1", "9223372036854775807", "18446744073709551616", "1.5", '"1"', "1e400"]
        )
        doc.tree["schema_version"] = doc.rawval(value)
    else:
        value = rng.choice(["", "yesterday", "9999-99-99T99:99:99Z", "x" * 100000])
        doc.tree.setdefault("provenance", {})["date"] = value
    return f"{what} = {value[:24] if isinstance(value, str) else value!r}"


def m_steps(rng, doc):
    s = spec(doc)
    value = rng.choice(
        ["-1", "9223372036854775807", "18446744073709551616", "1000000", "1.5", '"0"', "null", "0"]
    )
    what = rng.choice(["call_then_bind.op", "late_binds.op", "late_binds.slot"])
    if what == "call_then_bind.op":
        s["call_then_bind"] = [{"op": doc.rawval(value), "grad_mode": rng.random() < 0.5}]
    elif what == "late_binds.op":
        s["late_binds"] = [{"op": doc.rawval(value), "slot": 0, "channel": "c"}]
    else:
        s["late_binds"] = [
            {"op": 0, "slot": doc.rawval(value), "channel": rng.choice(["c", "", "x" * 1000])}
        ]
    return f"{what} = {value}"


def m_channels(rng, doc):
    ops = ops_of(doc)
    kind = rng.choice(
        [
            "self-loop",
            "produced-twice",
            "never-produced",
            "consumed-before",
            "many-channels",
            "null-binding",
            "bool-to-caller",
        ]
    )
    op = rng.choice(ops)
    if kind == "self-loop":
        op["input_channels"] = ["loop"]
        op["output_bindings"] = [{"channel": "loop", "output_to_caller": False}]
    elif kind == "produced-twice":
        for o in ops:
            o["output_bindings"] = [{"channel": "dup", "output_to_caller": False}]
        ops.append(
            {"name": "RowStat", "output_bindings": [{"channel": "dup", "output_to_caller": False}]}
        )
    elif kind == "never-produced":
        op["input_channels"] = [None, "ghost"]
    elif kind == "consumed-before":
        ops.insert(0, {"name": "ScaledSReLU", "input_channels": ["late"]})
        ops.append(
            {"name": "RowStat", "output_bindings": [{"channel": "late", "output_to_caller": False}]}
        )
    elif kind == "many-channels":
        n = rng.choice([100, 10000, 100000])
        op["output_bindings"] = [{"channel": f"c{i}", "output_to_caller": False} for i in range(n)]
        kind += f" {n}"
    elif kind == "null-binding":
        op["output_bindings"] = [None]
    else:
        op["output_bindings"] = [{"channel": "c", "output_to_caller": "yes"}]
    return "channels: " + kind


def m_requires_grad(rng, doc):
    s = spec(doc)
    s["input_requires_grad"] = rng.choice([False, True])
    for op in ops_of(doc):
        if rng.random() < 0.5:
            op["param_requires_grad"] = [rng.random() < 0.5 for _ in range(rng.randrange(0, 6))]
        if rng.random() < 0.5:
            op["extra_input_requires_grad"] = [
                rng.random() < 0.5 for _ in range(rng.randrange(0, 6))
            ]
    if rng.random() < 0.3:
        s["corrupt_split_sizes"] = True
    return "requires_grad flags shuffled (input {})".format(s["input_requires_grad"])


def m_valid_shuffle(rng, doc):
    """A well-formed but different case: other dtype, shape, seed, op order (mostly valid)."""
    s = spec(doc)
    s["dtype"] = rng.choice(["float64", "float32", "bfloat16", "float16"])
    s["input_shape"] = [
        rng.choice([1, 2, 3, 4, 6, 8, 16, 64, 257]),
        rng.choice([1, 2, 4, 8, 16, 64, 128]),
    ]
    s["seed"] = rng.randrange(0, 2**64)
    ops = ops_of(doc)
    rng.shuffle(ops)
    doc.tree.pop("wiring_error", None)
    return "valid-looking variant: dtype {}, shape {}, ops shuffled".format(
        s["dtype"],
        s["input_shape"],
    )


TREE_MUTATORS = [
    m_nesting,
    m_shape,
    m_attr,
    m_big_op,
    m_delta,
    m_seed,
    m_wrong_type,
    m_string_number,
    m_number_text,
    m_missing_key,
    m_missing_essential,
    m_extra_key,
    m_unicode,
    m_names,
    m_steps,
    m_channels,
    m_requires_grad,
    m_valid_shuffle,
]
BYTE_MUTATORS = [m_duplicate_key, m_truncate, m_file_bytes, m_many_ops, m_long_array]


def m_combo(rng, doc):
    parts = []
    for _ in range(rng.randrange(2, 5)):
        try:
            result = rng.choice(TREE_MUTATORS)(rng, doc)
        except (TypeError, KeyError, IndexError, AttributeError):
            continue  # an earlier step replaced what this one edits
        if isinstance(result, tuple):  # m_unicode's invalid UTF-8 ends the chain
            return result[0], "combo: " + "; ".join(parts + [result[1]])
        parts.append(result)
    return "combo: " + "; ".join(parts)


ALL_MUTATORS = TREE_MUTATORS + BYTE_MUTATORS + [m_combo, m_combo, m_combo]


def make(seed, index, sources):
    rng = random.Random(f"{seed}:{index}")
    base = rng.choice(sources)
    with open(base, encoding="utf-8") as f:
        doc = Doc(json.load(f))
    mutator = ALL_MUTATORS[index % len(ALL_MUTATORS)]
    result = mutator(rng, doc)
    if isinstance(result, tuple):
        data, what = result
    else:
        data, what = doc.dump(rng), result
    return base, data, what


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--src",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "regression"
        ),
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", default="1")
    parser.add_argument("--only", type=int, nargs="*", help="regenerate these indices only")
    args = parser.parse_args()
    sources = sorted(os.path.join(args.src, n) for n in os.listdir(args.src) if n.endswith(".json"))
    if not sources:
        sys.exit("mutate_cases.py: no case files in " + args.src)
    os.makedirs(args.out, exist_ok=True)
    indices = args.only if args.only else range(args.count)
    manifest = []
    for i in indices:
        base, data, what = make(args.seed, i, sources)
        name = f"m{i:04d}.json"
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        manifest.append(
            "\t".join(
                (
                    name,
                    os.path.basename(base),
                    what.replace("\t", " ").replace("\n", " "),
                    str(len(data)),
                )
            )
        )
    with open(os.path.join(args.out, "manifest.tsv"), "w", encoding="utf-8") as f:
        f.write("file\tbase\tmutation\tbytes\n")
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
