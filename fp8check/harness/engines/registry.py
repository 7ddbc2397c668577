"""One registry of engines: trainers and rollout engines by name. A new engine adapter is one file plus one
`register_engine` line; its surface is checked against the protocol when it registers (and again, for attributes
set in __init__, when it is built).

    from fp8check.harness.engines import register_engine
    register_engine("rollout", "my-engine", MyEngine, env=lambda config: {"MY_SWITCH": "1"})
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .protocol import REQUIRED, EngineError, missing_surface


@dataclass(frozen=True)
class EngineEntry:
    kind: str                                  # trainer | rollout
    name: str
    factory: Callable                          # (config, **kwargs) -> engine
    gpu: bool = False                          # needs a CUDA GPU (and its software stack)
    env: Callable | None = None                # config -> environment the engine reads at import / start
    description: str = ""

    def environment(self, config) -> dict[str, str]:
        return dict(self.env(config)) if self.env else {}


ENGINES: dict[tuple[str, str], EngineEntry] = {}


def register_engine(kind: str, name: str, factory: Callable, *, gpu: bool = False, env: Callable | None = None,
                    description: str = "", replace: bool = False) -> Callable:
    if kind not in REQUIRED:
        raise EngineError(f"engine {name!r}: kind must be one of {sorted(REQUIRED)}, got {kind!r}")
    if (kind, name) in ENGINES and not replace:
        raise EngineError(f"{kind} engine {name!r} is registered twice")
    if isinstance(factory, type):
        missing = missing_surface(kind, factory)
        if missing:
            raise EngineError(f"{kind} engine {name!r} ({factory.__name__}) lacks the protocol's {', '.join(missing)} "
                              f"(harness.engines.protocol)")
    ENGINES[(kind, name)] = EngineEntry(kind, name, factory, gpu, env, description or (factory.__doc__ or "").strip()
                                        .split("\n")[0])
    return factory


def get_engine(kind: str, name: str) -> EngineEntry:
    if (kind, name) not in ENGINES:
        known = sorted(n for k, n in ENGINES if k == kind)
        raise EngineError(f"unknown {kind} engine {name!r}; registered: {', '.join(known)}")
    return ENGINES[(kind, name)]


def make_engine(kind: str, name: str, config, **kwargs):
    """Build a registered engine in this process (the remote wrapper calls this inside its actor)."""
    engine = get_engine(kind, name).factory(config, **kwargs)
    missing = missing_surface(kind, engine)
    if missing:
        raise EngineError(f"{kind} engine {name!r} built without {', '.join(missing)}")
    return engine


def _builtin():
    from .cpu.learner import CpuLearner
    from .cpu.perturbed import PerturbableRollout
    from .cpu.rollout import ReferenceRollout
    from .cpu.trainer import ReferenceTrainer
    from .te_megatron import MegatronTrainer, trainer_env
    from .vllm import VLLMEngine, engine_env
    register_engine("trainer", "cpu-reference", ReferenceTrainer)
    # fp8check's own CPU engine carries the fault knobs (as its vLLM engines carry the test extension); the pure
    # mirror, with none, is there for conformance
    register_engine("rollout", "cpu-reference", PerturbableRollout)
    register_engine("rollout", "cpu-mirror", ReferenceRollout)
    register_engine("trainer", "cpu-learner", CpuLearner)
    register_engine("trainer", "megatron", MegatronTrainer, gpu=True, env=trainer_env)
    register_engine("rollout", "vllm", VLLMEngine, gpu=True, env=engine_env)


_builtin()

__all__ = ["ENGINES", "EngineEntry", "get_engine", "make_engine", "register_engine"]
