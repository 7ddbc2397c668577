"""The invariant catalog: one module per family. Importing this package registers every invariant."""
from . import sync  # noqa: F401  (registers S1..S7)
from .base import (FAIL, PASS, REGISTRY, UNKNOWN, CheckContext, Finding, Invariant, by_invariant, fired, overall,
                   run_catalog, run_invariant)

__all__ = ["FAIL", "PASS", "REGISTRY", "UNKNOWN", "CheckContext", "Finding", "Invariant", "by_invariant", "fired",
           "overall", "run_catalog", "run_invariant"]
