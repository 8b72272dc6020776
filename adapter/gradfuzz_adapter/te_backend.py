"""A thin shim: the te backend is the package gradfuzz_adapter.te (te/__init__.py lists its
modules). Kept because tests/test_driver.py imports TEBackend and TEBuilder from here;
import gradfuzz_adapter.te.backend instead, and delete this module once nothing does."""

from .te.backend import TEBackend, TEBuilder

__all__ = ["TEBackend", "TEBuilder"]
