"""Fault injectors by family (Jepsen's nemeses): each a pure function over a config, payload, bytes or a knob of
a running engine, declaring the invariants it must trip. Importing this package registers them all, and checks
the registry against the catalog: every declared invariant exists."""
from . import contract, coverage, dtypes, exclusion, layouts, policy, postload, scales, serving, transport, version  # noqa: F401
from .base import FAULTS, REAL_SHAPE_FAULTS, Fault, NoTarget, live_faults, real_shape_faults
from fp8check.harness.kinds import Stage


def _check_registry():
    from fp8check.harness.engines.protocol import KNOBS, SERVING_KNOBS
    from fp8check.invariants import REGISTRY
    for f in FAULTS.values():
        unknown = [i for i in f.declared if i not in REGISTRY]
        if unknown or not f.trips:
            raise ValueError(f"fault {f.name} declares unknown invariants {unknown or '(none)'}")
        both = set(f.trips) & set(f.may)
        if both:
            raise ValueError(f"fault {f.name}: {sorted(both)} declared both must-fire and may-fire")
        vocab = SERVING_KNOBS if f.stage == Stage.SERVING else KNOBS
        if f.knobs and not set(f.knobs) <= set(vocab):
            raise ValueError(f"fault {f.name} uses knobs {sorted(set(f.knobs) - set(vocab))} the protocol lacks")


_check_registry()

__all__ = ["FAULTS", "Fault", "NoTarget", "REAL_SHAPE_FAULTS", "live_faults", "real_shape_faults"]
