"""The arms of the comparison: one base config, several ways of running it -- the seeds' configurations
(SkyRL's article, the MXFP8 paper 2610.34915, what verl / NeMo RL / TRL ship) beside on-policy FP8.

  bf16               no FP8 anywhere: every linear of the model is in the exclusion set (the config's one list,
                     `exclude`), so the learner's GEMMs are BF16, the wire carries BF16 and the engine's
                     ignored_layers lists every linear. S2 / S3 / C1 then have nothing to check: UNKNOWN, never PASS.
  naive-fp8          the seeds' naive run (SkyRL Figure 1): a TE FP8 learner with per-tensor delayed scaling
                     (Megatron-Core `fp8_recipe="delayed"`: amax history 1, most recent, margin 0), a BF16 sync of
                     the parameters, and an engine that quantizes them itself per tensor (vLLM `quantization="fp8"`:
                     one scale per fused parameter, activations per token): two recipes, two policies.
  roundtrip-fp8      FP8 learner; each sync dequantizes its FP8 forward weights to BF16 and the engine quantizes
                     them again on the recipe's blocks (`run_sync(..., naive=True)`): the case byte checks see and
                     log-probs barely do (with FP32 block scales it changes no code, only the wire).
  bf16-fp8-rollout   a BF16 learner, an engine quantizing per tensor (TRL, SkyRL/FlashRL: vLLM online FP8).
  bf16-block-rollout a BF16 learner, an engine quantizing 128x128 blocks with vLLM's `fp8_per_block` rule (the
                     block rollout of verl `rollout.quantization=fp8`; NeMo RL's FP8 generation runs its own rule,
                     `rollout.quantization=nemo-rl-blockwise`: harness.numerics.nemo_rl).
  bf16-sampler       an FP8 learner whose sampler serves the BF16 parameters (the paper's higher-precision sampler).
  other-grid         an FP8 learner (the recipe's 128x128 blocks) whose sampler quantizes per tensor: another grid.
  onpolicy-fp8       FP8 learner; each sync installs its codes and scales as they are (the default sync).
  calibrated-clip    on-policy FP8 with the PPO clip bounds calibrated per batch (e2e/rl/clipping.py).

Each arm's verdict pattern is what it must show on every step: `holds` the invariants that must pass,
`violates` those that must fail, `unknown` those with nothing to check, `may` those that pass or fail by the
data (never unknown). Where the sampler is off the learner's
policy by the arm's design, S2 / S3 / S4 fail (the engine's codes, scales and values are not the learner's) and
the wire, dtype and exclusion checks hold (S1, S5, S6: the sync is what the config declares).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from fp8check.harness.config import SyncConfig
from fp8check.harness.kinds import Precision, Quantization
from fp8check.harness.models import LINEAR

SYNC_IDS = ("S1", "S2", "S3", "S4", "S5", "S6", "S7")
OFF_POLICY = dict(holds=("S1", "S5", "S6", "S7"), violates=("S2", "S3", "S4"))
BF16_LEARNER = dict(holds=("S1", "S5", "S6", "S7"), violates=("S2", "S4"), unknown=("S3", "C1"))


@dataclass(frozen=True)
class Arm:
    name: str
    fp8: bool = True                    # False: every linear excluded (BF16 end to end)
    naive: bool = False                 # the round trip (run_sync(..., naive=True))
    calibrate: bool = False
    trainer_precision: Precision = Precision.FP8                    # TrainerConfig.precision
    engine_quantization: Quantization = Quantization.CHECKPOINT     # RolloutConfig.quantization
    holds: tuple[str, ...] = SYNC_IDS
    violates: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    may: tuple[str, ...] = ()           # pass or fail by the data, never unknown (see naive-fp8)
    # the RL job that runs this configuration (`job_config`) and the pre-flight rules it must trip there
    job: str | None = None
    preflight: tuple[str, ...] = ()
    description: str = ""


ARMS = {a.name: a for a in (
    Arm("bf16", fp8=False, holds=("S1", "S4", "S5", "S6", "S7"), unknown=("S2", "S3"),
        description="no FP8 anywhere (every linear excluded)"),
    # the learner's delayed scale 448 / amax(previous weight) and the engine's amax(weight) / 448 agree whenever the
    # weight's amax did not move in BF16 since the last step: then the engine's codes (and sometimes the scale bits)
    # are the learner's, so S2 / S3 / S4 fail on most syncs, not on all
    Arm("naive-fp8", trainer_precision=Precision.FP8_DELAYED, engine_quantization=Quantization.ONLINE_PER_TENSOR,
        holds=OFF_POLICY["holds"], may=OFF_POLICY["violates"], unknown=("C1",),
        job="skyrl-delayed-bf16-sync", preflight=("K5", "K21"),
        description="TE delayed-scaling learner, BF16 sync, engine quantizes per tensor (the seeds' naive)"),
    Arm("roundtrip-fp8", naive=True, holds=("S7",), violates=("S2",),
        description="FP8 learner, its FP8 dequantized to BF16, engine re-quantizes on the recipe's blocks"),
    Arm("bf16-fp8-rollout", trainer_precision=Precision.BF16, engine_quantization=Quantization.ONLINE_PER_TENSOR,
        **BF16_LEARNER,
        job="skyrl-bf16-fp8-rollout", preflight=("K6",),
        description="BF16 learner, engine quantizes per tensor (vLLM quantization='fp8')"),
    Arm("bf16-block-rollout", trainer_precision=Precision.BF16, engine_quantization=Quantization.ONLINE_PER_BLOCK,
        **BF16_LEARNER,
        job="verl-fp8-rollout", preflight=("K6",),
        description="BF16 learner, engine quantizes 128x128 blocks (vLLM fp8_per_block; verl's block rollout)"),
    Arm("bf16-sampler", engine_quantization=Quantization.NONE, **OFF_POLICY, job="skyrl-bf16-rollout",
        preflight=("K22",),
        description="FP8 learner, BF16 sampler (the engine serves the BF16 parameters)"),
    Arm("other-grid", engine_quantization=Quantization.ONLINE_PER_TENSOR, **OFF_POLICY, job="skyrl-bf16-sync",
        preflight=("K5",),
        description="FP8 learner on 128x128 blocks, sampler quantizes per tensor"),
    Arm("onpolicy-fp8", job="skyrl-onpolicy", description="FP8 learner, codes + scales installed as-is"),
    Arm("calibrated-clip", calibrate=True, description="on-policy FP8, clip bounds calibrated on a BF16 shadow"),
)}
# `fp8check e2e` without --arms: on-policy FP8 beside the off-policy configurations whose orderings a short CPU run
# decides; naive-fp8 and bf16 (FULL_ARMS) add the two claims that tiny-rl's scale leaves violated (claims.EXPLAINED)
DEFAULT_ARMS = ("bf16-fp8-rollout", "bf16-sampler", "other-grid", "onpolicy-fp8")
FULL_ARMS = ("bf16", "naive-fp8", "bf16-fp8-rollout", "bf16-sampler", "other-grid", "onpolicy-fp8")


def _skyrl(recipe="blockwise", fp8=True, quantization="fp8", sync="blockwise") -> dict:
    tck = {"fp8": "e4m3", "fp8_recipe": recipe} if fp8 else {}
    ie = {"tensor_parallel_size": 1, "engine_init_kwargs": {"quantization": quantization} if quantization else {}}
    if sync:
        ie["fp8_weight_sync_mode"] = sync
    return {"trainer": {"strategy": "megatron", "policy": {"model": {"path": "tiny-rl"}, "megatron_config": {
        "tensor_model_parallel_size": 1, "transformer_config_kwargs": tck}}},
        "generator": {"inference_engine": ie}}


# each arm's configuration as the RL stacks write it (SkyRL; verl for the 128x128 BF16-learner rollout), for
# `fp8check preflight`: the arms declare the rules it must trip (tests/test_e2e_rl.py runs them)
JOBS = {
    "skyrl-onpolicy": _skyrl(),
    "skyrl-delayed-bf16-sync": _skyrl(recipe="delayed", sync=None),
    "skyrl-bf16-sync": _skyrl(sync=None),
    "skyrl-bf16-fp8-rollout": _skyrl(fp8=False, sync=None),
    "skyrl-bf16-rollout": _skyrl(quantization=None, sync=None),
    "verl-fp8-rollout": {"actor_rollout_ref": {"model": {"path": "tiny-rl"}, "actor": {"strategy": "megatron"},
                                               "rollout": {"name": "vllm", "quantization": "fp8"}},
                         "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"VLLM_USE_DEEP_GEMM_E8M0": "0"}}}}},
}


def job_config(arm: Arm) -> dict | None:
    """The RL job (a mapping as its YAML file holds it) that runs the arm's configuration, or None."""
    import copy
    return copy.deepcopy(JOBS[arm.job]) if arm.job else None


def all_linear_modules(spec) -> tuple[str, ...]:
    """Every GEMM module of the model by its exact name (exclusion patterns match whole names)."""
    return tuple(sorted({t.module for t in spec.tensors() if t.kind == LINEAR}))


def arm_config(arm: Arm, base: SyncConfig) -> SyncConfig:
    """The config the arm's engines are built from and its syncs are checked against."""
    if not arm.fp8:
        return base.with_(exclude=tuple(dict.fromkeys(base.exclude + all_linear_modules(base.spec))))
    if arm.trainer_precision == base.trainer.precision and arm.engine_quantization == base.rollout.quantization:
        return base
    return base.with_(trainer=replace(base.trainer, precision=arm.trainer_precision),
                      rollout=replace(base.rollout, quantization=arm.engine_quantization))
