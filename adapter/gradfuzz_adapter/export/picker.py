"""The source of the definitions an exported script needs, picked out of the adapter's modules.

A script embeds only what its case uses: the catalog functions of its ops, the custom TE ops
it builds, their helpers. `pick(roots)` takes top-level names ("catalog.linear",
"te.extensions.RowStat") and returns the source of those definitions and of every top-level
definition they refer to, across the modules (following each module's `from .x import y`),
in dependency order, without docstrings. Sources are read from the files, never imported
(te/extensions.py imports TE; writing a script must not), and `modules_used` tells which
library modules (torch, math, F, te, ...) the picked code refers to.
"""

import ast
import importlib.util

# Names are relative to the adapter's package ("catalog", "te.extensions", "export.support").
PACKAGE = __package__.rpartition(".")[0]

# Names of library modules the picked code may use, as the scripts import them.
LIBRARY_NAMES = {
    "base64": "import base64",
    "contextlib": "import contextlib",
    "math": "import math",
    "os": "import os",
    "re": "import re",
    "zlib": "import zlib",
    "F": "import torch.nn.functional as F",
    "dataclass": "from dataclasses import dataclass",
    "field": "from dataclasses import field",
}


class _Module:
    def __init__(self, name):
        spec = importlib.util.find_spec(f"{PACKAGE}.{name}")
        if spec is None or not spec.origin:
            raise FileNotFoundError(f"no source file for {PACKAGE}.{name}")
        with open(spec.origin, encoding="utf-8") as f:
            self.source = f.read()
        self.name = name
        self.lines = self.source.splitlines()
        tree = ast.parse(self.source)
        self.order = []
        self.nodes = {}
        self.imports = {}  # local name -> (module name, name there)
        self.followers = {}  # name -> statements setting its attributes
        package = name.rsplit(".", 1)[0] if "." in name else ""
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                for alias in node.names:
                    if node.module is None:  # from . import module: not a definition
                        self.imports[alias.asname or alias.name] = (None, None)
                        continue
                    target = ".".join([*base, *node.module.split(".")])
                    self.imports[alias.asname or alias.name] = (target, alias.name)
                continue
            base = _attribute_base(node)
            if base is not None:
                # `f.attr = value` after `def f`: part of f's definition.
                self.followers.setdefault(base, []).append(node)
                continue
            for defined in _defined_names(node):
                self.nodes[defined] = node
                self.order.append(defined)

    def text(self, node):
        """The node's source with the docstrings of it and of its methods removed."""
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        drop = set()
        for inner in ast.walk(node):
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                body = inner.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)
                    and len(body) > 1
                ):
                    drop.update(range(body[0].lineno, body[0].end_lineno + 1))
                    after = body[0].end_lineno  # and the blank line that followed it
                    if after < len(self.lines) and not self.lines[after].strip():
                        drop.add(after + 1)
        return "\n".join(
            line
            for n, line in enumerate(self.lines[first - 1 : node.end_lineno], first)
            if n not in drop
        )


def _attribute_base(node):
    """`name` for a top-level `name.attr = value`, else None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            return target.value.id
    return None


def _defined_names(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _names_used(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class Picker:
    """Collects definitions from the adapter's modules; `source()` gives them in order."""

    def __init__(self):
        self.modules = {}
        self.picked = []  # (module, name), dependencies first
        self.library = set()

    def _module(self, name):
        if name not in self.modules:
            self.modules[name] = _Module(name)
        return self.modules[name]

    def add(self, qualified):
        """Adds "module.name" (module relative to the package: "catalog", "te.extensions")
        and what it refers to."""
        module_name, _, name = qualified.rpartition(".")
        self._add(self._module(module_name), name)

    def _add(self, module, name):
        if (module.name, name) in self.picked:
            return
        if name in module.imports:
            target, original = module.imports[name]
            if target is not None:
                self._add(self._module(target), original)
            return
        node = module.nodes.get(name)
        if node is None:
            if name in LIBRARY_NAMES:
                self.library.add(name)
            return
        used_names = _names_used(node)
        for follower in module.followers.get(name, []):
            used_names |= _names_used(follower.value)
        for used in sorted(used_names):
            if used == name:
                continue
            if used in module.nodes or used in module.imports:
                self._add(module, used)
            elif used in LIBRARY_NAMES:
                self.library.add(used)
        if (module.name, name) not in self.picked:
            self.picked.append((module.name, name))

    def source(self):
        """The picked definitions, one block each (a statement defining several names once)."""
        blocks, seen = [], set()
        for module_name, name in self.picked:
            module = self.modules[module_name]
            node = module.nodes[name]
            if id(node) in seen:
                continue
            seen.add(id(node))
            text = module.text(node)
            for follower in module.followers.get(name, []):
                text += "\n" + module.text(follower)
            blocks.append(text)
        return blocks

    def block_names(self):
        """Per block of source(), the set of names it defines."""
        out, seen = [], {}
        for module_name, name in self.picked:
            node = self.modules[module_name].nodes[name]
            if id(node) in seen:
                seen[id(node)].add(name)
                continue
            seen[id(node)] = {name}
            out.append(seen[id(node)])
        return out

    def imports(self):
        """The import lines the picked code needs (besides torch, pytest and TE)."""
        return [LIBRARY_NAMES[n] for n in sorted(self.library)]
