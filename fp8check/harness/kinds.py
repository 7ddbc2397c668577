"""The kinds a sync is described by, as types: a recipe's granularity and scale format, the rollout engine's
quantization, the learner's precision, a fault's stage. One leaf (layer 0, importing nothing of ours), so the
recipe, the config, the schema, the pipeline and the faults read one source.

Each is a StrEnum (as `invariants.base.Verdict`): a member equals, hashes, formats and serialises as its value, so
configs written as strings (YAML, JSON, `--set`) and code that still compares strings keep working. Code of ours
compares members (`r.granularity is Granularity.MXFP8`); the dataclasses coerce a string to its member once, in
`__post_init__` (`member`), and refuse any other value there.
"""
from __future__ import annotations

from enum import StrEnum


class Granularity(StrEnum):
    """What one FP8 scale covers: a 128x128 weight block (1x128 activations), an MXFP8 1x32 block, a tensor."""
    BLOCK = "block"
    MXFP8 = "mxfp8"
    TENSOR = "tensor"


class ScaleFormat(StrEnum):
    """How a scale is encoded: any FP32, an FP32 power of two, or UE8M0 (an exponent byte, MXFP8's)."""
    FP32 = "fp32"
    POW2 = "pow2"
    E8M0 = "e8m0"


class Quantization(StrEnum):
    """How the rollout engine gets its FP8 weights (`rollout.quantization`)."""
    CHECKPOINT = "checkpoint"                   # a block-FP8 checkpoint engine: the trainer's bytes installed as-is
    ONLINE_PER_BLOCK = "online-per-block"       # vLLM's `fp8_per_block` quantizes the BF16 it is sent (128x128)
    ONLINE_PER_TENSOR = "online-per-tensor"     # vLLM's `fp8`: one dynamic scale per fused parameter
    NEMO_RL_BLOCKWISE = "nemo-rl-blockwise"     # a block-FP8 checkpoint engine quantizing each BF16 tensor on load
    NONE = "none"                               # the engine serves BF16

    @property
    def online(self) -> bool:
        """One of vLLM's online methods: BF16 in, the engine quantizes each fused parameter."""
        return self in (Quantization.ONLINE_PER_BLOCK, Quantization.ONLINE_PER_TENSOR)

    @property
    def checkpoint_format(self) -> bool:
        """The engine is started from a block-FP8 checkpoint config (quantization_config with ignored_layers)."""
        return self in (Quantization.CHECKPOINT, Quantization.NEMO_RL_BLOCKWISE)


class Precision(StrEnum):
    """What the learner's GEMMs run (`trainer.precision`)."""
    FP8 = "fp8"                     # the recipe (Transformer Engine)
    FP8_DELAYED = "fp8-delayed"     # TE's per-tensor delayed scaling (amax history)
    BF16 = "bf16"                   # no FP8 in the learner


class Stage(StrEnum):
    """Where a fault acts on the one road (harness.sync.pipeline interprets it), in the road's order."""
    CONFIG = "config"
    TRAINER = "trainer"
    PAYLOAD = "payload"
    BUCKETS = "buckets"
    ENGINE = "engine"
    SERVING = "serving"


def values(kind: type[StrEnum]) -> tuple[str, ...]:
    """The members' values as plain strings, in declaration order (what an error message lists)."""
    return tuple(m.value for m in kind)


def member(kind: type[StrEnum], value):
    """`value` as a member of `kind` (a member, or a string equal to one's value), else None: the caller raises its
    own one-line error naming the key and the allowed values."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, str):
        return None
    try:
        return kind(value)
    except ValueError:
        return None


__all__ = ["Granularity", "Precision", "Quantization", "ScaleFormat", "Stage", "member", "values"]
