"""The invariant catalog: one module per family. Importing this package registers every invariant."""
from . import alignment, contract, exclusion, job, probes, serving, sync  # noqa: F401  (registration)
from .base import (FAIL, PASS, REGISTRY, UNKNOWN, CheckContext, Finding, Invariant, Verdict, by_invariant, check_ids,
                   fired, not_applicable, overall, run_catalog, run_invariant)

FAMILIES = ("sync", "contract", "exclusion", "alignment", "probes", "serving", "job")

__all__ = ["FAIL", "FAMILIES", "PASS", "REGISTRY", "UNKNOWN", "CheckContext", "Finding", "Invariant", "Verdict",
           "by_invariant", "check_ids", "fired", "not_applicable", "overall", "run_catalog", "run_invariant"]
