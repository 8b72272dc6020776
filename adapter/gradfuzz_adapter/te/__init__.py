"""The te backend: every case on TransformerEngine 2.20.2's te.ops (docs/BACKENDS.md).

One module per concern; only backend.TEBackend() imports TE (and extensions, which needs
it), so the rest is importable without TE and exported te scripts embed parts of it whole:

- op_table: the one table of catalog op -> te.ops class, constructor arguments and the
  options the generator draws (op_recipe, te_options, TE_CLASSES, CUSTOM_OPS);
- params: the model's parameter layout <-> TE's parameters (embedded in scripts);
- fusions: fusion naming and filtering over OperationFuser's registry (embedded);
- extensions: the catalog ops TE lacks, Boundary and the FusedResidual fusion, as TE users
  write them (imports TE; embedded whole);
- classify: TE's errors -> runtime error kinds or "unsupported"; what TE raises per kind;
- embed: the source text exported te scripts embed (script_sections()) and the call that
  builds a case's TE recipe object (recipe_call());
- recipes: which recipes TE runs here, TE's recipe object, the per-path FP8 state;
- faults: the planted faults in TE (selftest --backend te);
- backend: the driver hooks (TEBuilder) and the hello/run answers (TEBackend).

The names below are the TE-free ones the exporter uses.
"""

from .classify import KINDS, RAISES, classify
from .embed import RECIPE_IMPORT, recipe_call, script_sections
from .op_table import op_recipe, render_call

__all__ = [
    "KINDS",
    "RAISES",
    "RECIPE_IMPORT",
    "classify",
    "op_recipe",
    "recipe_call",
    "render_call",
    "script_sections",
]
