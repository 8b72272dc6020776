"""Re-export for exported upstream tests: the runtime lives in torch_backend/runtime.py."""

from .torch_backend.runtime import FUSIONS, BasicOp, Boundary, Sequential

__all__ = ["FUSIONS", "BasicOp", "Boundary", "Sequential"]
