"""The arms of the comparison: one base config, four ways of running it.

  bf16            no FP8 anywhere: every linear of the model is in the exclusion set (the config's one list,
                  `exclude`), so the learner's GEMMs are BF16, the wire carries BF16 and the engine's
                  ignored_layers lists every linear. S2 / S3 / C1 then have nothing to check: UNKNOWN, never PASS.
  naive-fp8       FP8 learner; each sync dequantizes its FP8 forward weights to BF16 and the engine quantizes
                  them with its own scales (`run_sync(..., naive=True)`): the sampler runs a policy the learner
                  never held.
  onpolicy-fp8    FP8 learner; each sync installs its codes and scales as they are (the default sync).
  calibrated-clip on-policy FP8 with the PPO clip bounds calibrated per batch (e2e/rl/clipping.py).

Each arm's verdict pattern is what it must show on every step: `holds` the invariants that must pass,
`violates` those that must fail, `unknown` those with nothing to check.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import SyncConfig
from harness.models import LINEAR

SYNC_IDS = ("S1", "S2", "S3", "S4", "S5", "S6", "S7")


@dataclass(frozen=True)
class Arm:
    name: str
    fp8: bool = True
    naive: bool = False
    calibrate: bool = False
    holds: tuple[str, ...] = SYNC_IDS
    violates: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    description: str = ""


ARMS = {a.name: a for a in (
    Arm("bf16", fp8=False, holds=("S1", "S4", "S5", "S6", "S7"), unknown=("S2", "S3"),
        description="no FP8 anywhere (every linear excluded)"),
    Arm("naive-fp8", naive=True, holds=("S7",), violates=("S2",),
        description="FP8 learner, BF16 sync, engine re-quantizes with its own scales"),
    Arm("onpolicy-fp8", description="FP8 learner, codes + scales installed as-is"),
    Arm("calibrated-clip", calibrate=True, description="on-policy FP8, clip bounds calibrated on a BF16 shadow"),
)}
DEFAULT_ARMS = ("bf16", "naive-fp8", "onpolicy-fp8")


def all_linear_modules(spec) -> tuple[str, ...]:
    """Every GEMM module of the model by its exact name (exclusion patterns match whole names)."""
    return tuple(sorted({t.module for t in spec.tensors() if t.kind == LINEAR}))


def arm_config(arm: Arm, base: SyncConfig) -> SyncConfig:
    """The config the arm's engines are built from and its syncs are checked against."""
    if arm.fp8:
        return base
    return base.with_(exclude=tuple(dict.fromkeys(base.exclude + all_linear_modules(base.spec))))
