"""The adapter's modules import each other without circles (issue 27 item 3), read from the
source with ast: every `import` and `from ... import` counts, at module level or inside a
function, and importing a module of a package counts as importing the package too (its
__init__ runs first)."""

import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER = os.path.dirname(HERE)
PACKAGE = "gradfuzz_adapter"

# None left: the torch backend's collectives (collectives.py) import nothing of its runtime, so
# the runtime importing its faults (to plant $GRADFUZZ_FAULT's) and the faults reading the
# ranks' WORLD from the collectives close no circle.
KNOWN = []


def modules():
    """{module name: (path, is_package)} of every module of the adapter's package."""
    out = {}
    for folder, _, files in os.walk(os.path.join(ADAPTER, PACKAGE)):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            dotted = os.path.relpath(path, ADAPTER)[: -len(".py")].replace(os.sep, ".")
            package = dotted.endswith(".__init__")
            out[dotted[: -len(".__init__")] if package else dotted] = (path, package)
    return out


def import_graph():
    """{module: {imported module of the package}}, the package's own __init__ left out (a
    docstring)."""
    mods = modules()
    graph = {name: set() for name in mods}
    for name, (path, package) in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".") if package else name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                for k in range(2, len(parts) + 1):  # each package on the way, then the module
                    imported = ".".join(parts[:k])
                    if (
                        imported in mods
                        and not name.startswith(imported + ".")
                        and imported != name
                    ):
                        graph[name].add(imported)
    return graph


def circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert "gradfuzz_adapter.ranks" in graph["gradfuzz_adapter.__main__"]  # inside a method
    assert "gradfuzz_adapter.backends" in graph["gradfuzz_adapter.ranks"]
    assert "gradfuzz_adapter.torch_backend" in graph["gradfuzz_adapter.recipes"]


def test_the_adapters_modules_import_no_circle_but_the_known_one():
    found = circles(import_graph())
    assert sorted(map(sorted, found)) == sorted(map(sorted, KNOWN))
