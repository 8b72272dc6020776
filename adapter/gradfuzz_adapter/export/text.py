"""Small pieces of script text every form uses: names, wrapped lists, embedded modules."""

import importlib.util
import json
import keyword
import re

from ..te.embed import module_body

# The line that starts what a script embeds of the implementation it runs (the torch
# backend's runtime, the adapter's te.ops extensions): what comes before it is the test.
EMBEDDED_MARK = "# " + "-" * 86

ADAPTER = __package__.rpartition(".")[0]


def identifier(text):
    """`text` as a Python identifier (every non-word character an underscore)."""
    name = re.sub(r"\W", "_", text)
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"_{name}"


def channel_label(fuser, channel):
    """The oracle's name of a channel gradient (oracle/oracle.cc: channel_label)."""
    return f"grad_channel[{channel}{'' if fuser == 0 else f'@fuser{fuser}'}]"


def wrapped(opening, items, closing, width=100):
    """`opening` + items + `closing`, the items filling lines of `width` under the first
    (a visual indent), e.g. `leaves = [("grad_input", x), ...,` / `          (...)]`."""
    indent = " " * len(opening)
    lines, line = [], opening
    for k, item in enumerate(items):
        text = item + (closing if k == len(items) - 1 else ",")
        if line not in (opening, indent) and len(line) + 1 + len(text) > width:
            lines.append(line)
            line = indent
        line += ("" if line in (opening, indent) else " ") + text
    return lines + [line if items else opening + closing]


class Name(str):
    """A name in generated code: literal() writes it as it is."""


def literal(value):
    """`value` (None, bool, number, str, list, tuple, dict of those) as Python source with
    double-quoted strings, as black writes them."""
    if isinstance(value, Name):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def adapter_module_body(name):
    """The source of gradfuzz_adapter.<name> (read from its file, never imported) without
    its docstring and top-level imports: what a script embeds of it whole."""
    spec = importlib.util.find_spec(f"{ADAPTER}.{name}")
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"no source file for {ADAPTER}.{name}")
    with open(spec.origin, encoding="utf-8") as f:
        return module_body(f.read())


def wrap_call(opening, items, closing, width=96):
    """`opening` items `closing` as black lays a call out within `width`: on one line, else
    the items on one indented line between the brackets, else one item a line."""
    one = opening + ", ".join(items) + closing
    if len(one) <= width:
        return [one]
    inner = "    " + ", ".join(items)
    if len(inner) <= width:
        return [opening, inner, closing.lstrip()]
    return [opening] + [f"    {item}," for item in items] + [closing.lstrip()]
