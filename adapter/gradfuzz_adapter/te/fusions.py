"""Fusion names and filtering over TE's fusion registry.

Each fusion function registered with OperationFuser is named after the fused op it builds
(fusion_name); a path runs with only the fusions it names (only_fusions). No TE import: the
functions take the OperationFuser class, so exported te scripts embed this module whole.
"""

import contextlib

# Module-level fusion functions whose owning class their name does not show
# (ops/fused/grouped_mlp.py, registered at import when supported).
FUNCTION_OWNERS = {
    "fuse_glu_ops": "GroupedMLP_CuTeGEMMGLU",
    "fuse_unary_activation_ops": "GroupedMLP_CuTeGEMMUnary",
}
FUSION_PASSES = (
    ("forward_backward_fusion_functions", "joint"),
    ("forward_fusion_functions", "forward"),
    ("backward_fusion_functions", "backward"),
)


def fusion_name(func):
    """ "ForwardLinearBiasAdd" for ForwardLinearBiasAdd.fuse_forward_ops; our own fusion
    functions carry their name ("FusedResidual.joint")."""
    explicit = getattr(func, "gradfuzz_fusion_name", None)
    if explicit:
        return explicit
    parts = getattr(func, "__qualname__", repr(func)).split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        return parts[-2]  # the class whose (static) method it is
    return FUNCTION_OWNERS.get(parts[-1], parts[-1])


@contextlib.contextmanager
def only_fusions(operation_fuser, names):
    """Runs the body with OperationFuser's registration lists (fuser.py: class attributes
    forward_backward_fusion_functions, forward_fusion_functions, backward_fusion_functions,
    read by OperationFuser.maybe_fuse_ops at a fuser's first forward) narrowed to the
    fusions called `names`; restores them afterwards, also on error."""
    names = set(names)
    saved = {attr: getattr(operation_fuser, attr) for attr, _ in FUSION_PASSES}
    try:
        for attr, _ in FUSION_PASSES:
            setattr(operation_fuser, attr, [f for f in saved[attr] if fusion_name(f) in names])
        yield
    finally:
        for attr, funcs in saved.items():
            setattr(operation_fuser, attr, funcs)
