"""The errors that mean "the user's input is wrong": a file, key, tensor, model or flag. Each message is one line
naming it and what to do; the CLI prints it and exits 2 (never a traceback). They live in one torch-free module so
that the CLI can catch them all without importing the engines' numerics (`fp8check preflight` stays fast), and so
that the list has one source; each is re-exported from the module that raises it."""
from __future__ import annotations


def did_you_mean(value, choices) -> str:
    """"; did you mean 'x'?" for the closest of `choices`, or nothing (the tail of a bad-input message)."""
    import difflib
    near = difflib.get_close_matches(str(value).strip().lower(), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


class BadInput(ValueError):
    """The user's input cannot be used; the message names it and what to do."""


class ConfigError(BadInput):
    """The configuration cannot be used; the message names the key and what to do."""


class SnapshotError(BadInput):
    """The snapshot directory cannot be read or written."""


class ModelError(BadInput):
    """Unknown model name or inconsistent model spec."""


class RecipeError(BadInput):
    """A recipe name or field is not valid."""


class LayoutError(BadInput):
    """A layout cannot be applied: misaligned split, missing tensor, shape mismatch."""


class UsageError(BadInput):
    """Bad command-line input."""


class UnknownInvariant(BadInput):
    """An invariant id that is not in the catalog (`run_catalog(ids=...)`, `check_sync(ids=...)`)."""
