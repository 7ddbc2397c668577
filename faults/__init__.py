"""Fault injectors by family (Jepsen's nemeses): each a pure function over a config, payload, bytes or the
reference engine, declaring the invariants it must trip. Importing this package registers them all."""
from . import contract, coverage, dtypes, exclusion, layouts, postload, scales, transport, version  # noqa: F401
from .base import FAULTS, Fault

__all__ = ["FAULTS", "Fault"]
