"""check_sync: the catalog over a sync a user's own RL job performed (placeholder until the engine-side adapter
lands)."""
from __future__ import annotations


def check_sync(engine, expected, config, **kw):
    raise NotImplementedError("check_sync lands with the user-engine adapter")
