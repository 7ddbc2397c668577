"""Engines behind one protocol (protocol.py) and one registry (registry.py): the CPU reference trainer and
rollout, the Megatron-Core/Transformer Engine trainer, vLLM, and users' own engines; remote.py runs any of them
as a Ray actor or in this process."""
from .protocol import KNOBS, EngineError, RolloutEngine, TrainerEngine
from .registry import ENGINES, get_engine, make_engine, register_engine

__all__ = ["ENGINES", "EngineError", "KNOBS", "RolloutEngine", "TrainerEngine", "get_engine", "make_engine",
           "register_engine"]
