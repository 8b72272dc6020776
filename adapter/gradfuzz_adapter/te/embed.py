"""What an exported te script embeds of the te package, as source text.

script_sections() gives the modules a te script needs after the catalog, the reference and
the comparison helpers: te/params.py, te/fusions.py and te/extensions.py, each whole
without its docstring and top-level imports, then the call that registers FusedResidual.
recipe_call() gives the constructor call of a case's TE recipe object, for the script's
`with te.autocast(enabled=True, recipe=...)` around each forward (docs/BACKENDS.md
"Recipes"). The text is read from the files, never by importing them (extensions imports
TE, and writing a script must not). The script must have imported torch, `te`
(transformer_engine.pytorch), OperationFuser, and embedded errors.py and catalog.py before.
"""

import ast
import importlib.util

from ..recipes import parse_recipe, te_kwargs

# (module, section title), in the order a script needs them.
EMBEDDED = (
    ("params", "te.ops parameters in the model's layout (gradfuzz_adapter/te/params.py)"),
    ("fusions", "Fusion names and filtering (gradfuzz_adapter/te/fusions.py)"),
    (
        "extensions",
        "Ops TE lacks and the FusedResidual fusion, as TE users write them\n"
        "# (gradfuzz_adapter/te/extensions.py)",
    ),
)
REGISTER_FUSIONS = "register_fusions()\n"


def module_source(name):
    """The source text of gradfuzz_adapter.te.<name>, read from its file (not imported)."""
    spec = importlib.util.find_spec(f"{__package__}.{name}")
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"no source file for {__package__}.{name}")
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def module_body(source):
    """`source` without its module docstring and its top-level imports."""
    tree = ast.parse(source)
    lines = source.splitlines()
    drop = set()
    for i, node in enumerate(tree.body):
        is_docstring = (
            i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        )
        if is_docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            drop.update(range(node.lineno - 1, node.end_lineno))
    kept = [line for n, line in enumerate(lines) if n not in drop]
    return "\n".join(kept).strip() + "\n"


def script_sections():
    """[(title, source)] for an exported te script, in order; the last is the registration
    of FusedResidual (title None)."""
    out = [(title, module_body(module_source(name))) for name, title in EMBEDDED]
    out.append((None, REGISTER_FUSIONS))
    return out


RECIPE_IMPORT = "from transformer_engine.common import recipe as te_recipe"


def recipe_call(spec_recipe):
    """Python source that builds TE's recipe object for a spec's `recipe` as a user writes
    it, e.g. "te_recipe.DelayedScaling(fp8_format=te_recipe.Format.E4M3, margin=1, ...)"
    (needs RECIPE_IMPORT); "None" for no recipe. ValueError as recipes.parse_recipe."""
    recipe = parse_recipe(spec_recipe)
    if recipe is None:
        return "None"
    kwargs = "".join(f", {k}={v!r}" for k, v in te_kwargs(recipe).items())
    return f"te_recipe.{recipe.name}(fp8_format=te_recipe.Format.{recipe.fp8_format}{kwargs})"
