"""The GRPO loop: group sampling from the rollout engine, exact rewards, group advantages, the PPO-clip loss
against the rollout's log-probs, one AdamW step per batch, and after every step a weight sync through the one
pipeline (harness.sync.pipeline.run_sync) whose catalog findings are that step's verdicts.

    version v installed  ->  sample batch v  ->  train_step (v -> v+1)  ->  sync v+1 + catalog  ->  record step v

Engines are pluggable (e2e/rl/engines.py): the CPU learner and CPU reference rollout here, Megatron/TE and vLLM
with `engines="live"`. Each (arm, seed) run is independent; `run_comparison` runs them in worker processes
(one torch thread each: results depend on the thread count only through GEMM reduction order) and writes
`steps.jsonl` (one record per arm, seed and step) and `runs.jsonl` (one per run).

Pairing: within a seed every arm starts from the same masters (the reference trainer's step-0 weights for
that seed), sees the same prompts and draws the same sampling noise (harness.numerics.sampling), so per-step
differences between arms measure the arms, not the luck of the draw.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.kinds import Quantization
from fp8check.harness.sync.pipeline import DigestFirst, FullRead, run_sync
from fp8check.invariants import by_invariant
from fp8check.invariants.probes import probe_metrics

from .arms import ARMS, arm_config
from .clipping import bf16_reference_ratios
from .engines import build_engines
from .loss import PPOClipLoss, SFTLoss, group_advantages
from .task import EOS, DigitTask


@dataclass(frozen=True)
class LoopSettings:
    model: str = "tiny-rl"
    recipe: str = "blockwise-fp32"
    task: str = "copy"
    length: int = 4                   # digits per prompt
    prompts_per_step: int = 8
    group_size: int = 8               # completions per prompt (GRPO group)
    temperature: float = 1.0
    lr: float = 5e-4
    warmup_steps: int = 15            # supervised steps before RL (same data in every arm)
    eps_low: float = 0.2
    eps_high: float = 0.2             # DAPO: 0.28
    scale_advantages: bool = True     # GRPO's std normalisation (False: Dr. GRPO)
    engines: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)


def _seed(seed: int, step: int, stream: int) -> int:
    return (1_000_003 * (seed + 1) + 7919 * step + stream) % (2 ** 62)


def build_batch(prompts: list[list[int]], samples: dict, advantages: torch.Tensor, n: int, temperature: float) -> dict:
    """The trainer's batch (e2e/rl/engines.py): prompt + completion sequences and per-target tensors."""
    tok, lps, lengths = samples["tokens"], samples["logprobs"], samples["lengths"]
    B, M = tok.shape
    L = len(prompts[0])
    seqs = torch.cat([torch.tensor(prompts, dtype=torch.long).repeat_interleave(n, 0), tok], 1)
    mask = torch.zeros(B, L + M - 1, dtype=torch.bool)
    mask[:, L - 1:] = torch.arange(M)[None] < lengths[:, None]
    roll = torch.zeros(B, L + M - 1)
    roll[:, L - 1:] = lps.float()
    adv = torch.zeros(B, L + M - 1)
    adv[:, L - 1:] = advantages.float()[:, None]
    return {"sequences": seqs, "mask": mask, "rollout_logprobs": roll * mask, "advantages": adv * mask,
            "temperature": float(temperature)}


def sync_verdicts(res) -> dict:
    """A sync's verdict per invariant, and for each failing S invariant how many findings at which stage (the
    wire, the engine, ...; "capped": the catalog's "... and N more" summary finding), with the first message."""
    stages: dict = {}
    for f in res.findings:
        if f.verdict == "fail" and f.invariant_id.startswith("S"):
            st = stages.setdefault(f.invariant_id, {})
            key = f.evidence.get("stage") or ("capped" if f.message.startswith("... and") else "unstaged")
            st[key] = st.get(key, 0) + 1
    return {"verdicts": by_invariant(res.findings), "fired": res.fired, "unknown": res.unknown, "errors": res.errors,
            "stages": stages, "messages": {f.invariant_id: f.message for f in res.findings
                                           if f.verdict != "pass" and f.invariant_id.startswith("S")}}


def run_arm(arm_name: str, seed: int, steps: int, settings: LoopSettings = LoopSettings(), on_step=None) -> dict:
    """One arm, one seed: `steps` GRPO steps. Returns {"run": header, "steps": [records]}; `on_step(record)` is
    called as each step completes."""
    arm = ARMS[arm_name]
    cfg = arm_config(arm, recommended_config(settings.model, settings.recipe, seed=seed))
    task = DigitTask(settings.task, settings.length)
    loss = PPOClipLoss(settings.eps_low, settings.eps_high)
    n = settings.group_size
    t_start = time.perf_counter()
    trainer, rollout, owned = build_engines(cfg, settings.engines, trainer_kwargs={"lr": settings.lr})
    # digest-first where the engine must hold the learner's bytes (a checkpoint engine); an engine that quantizes
    # the BF16 it is handed, or serves it, mismatches every FP8 parameter by design: read it whole
    digest_first = settings.engines != "cpu" and cfg.rollout.quantization is Quantization.CHECKPOINT
    capture = DigestFirst() if digest_first else FullRead()
    try:
        warm = [trainer.train_step(task.supervised(task.prompts(settings.prompts_per_step * n, _seed(seed, w, 3))),
                                   SFTLoss())["loss"] for w in range(settings.warmup_steps)]
        first = run_sync(cfg, trainer, rollout, naive=arm.naive, capture=capture)
        header = {"arm": arm.name, "seed": seed, "steps": steps, "settings": settings.to_dict(),
                  "config": cfg.to_dict(), "trainer": trainer.record().to_json(), "rollout": rollout.record().engine,
                  "warmup_loss": warm, "initial_sync": sync_verdicts(first)}
        records = []
        for step in range(steps):
            t0 = time.perf_counter()
            prompts = task.prompts(settings.prompts_per_step, _seed(seed, step, 1))
            samples = rollout.sample(prompts, n, task.max_tokens, settings.temperature, _seed(seed, step, 2), EOS)
            rewards = task.rewards(prompts, samples["tokens"], n)
            adv = group_advantages(rewards, n, settings.scale_advantages)
            batch = build_batch(prompts, samples, adv, n, settings.temperature)
            if arm.calibrate:
                batch["reference_ratios"] = bf16_reference_ratios(cfg.spec, trainer.master_hf(), batch["sequences"],
                                                                  settings.temperature)
            t1 = time.perf_counter()
            stats = trainer.train_step(batch, loss)
            t2 = time.perf_counter()
            res = run_sync(cfg, trainer, rollout, naive=arm.naive, capture=capture)
            t3 = time.perf_counter()
            rec = step_record(arm.name, seed, step, batch, samples, rewards, stats, loss, res)
            rec["seconds"] = {"sample": round(t1 - t0, 3), "train": round(t2 - t1, 3), "sync": round(t3 - t2, 3)}
            records.append(rec)
            if on_step is not None:
                on_step(rec)
        header["wall_seconds"] = round(time.perf_counter() - t_start, 2)
        return {"run": header, "steps": records}
    finally:
        for e in owned:
            e.close()


def step_record(arm: str, seed: int, step: int, batch: dict, samples: dict, rewards: torch.Tensor, stats: dict,
                loss: PPOClipLoss, res) -> dict:
    """One step's metrics: reward, entropy, length, the train-rollout mismatch and clip diagnostics over the
    batch's completion tokens (invariants.probes.probe_metrics, the P family's own function), and the verdicts
    of the sync that followed the step."""
    mask = batch["mask"]
    lp_train, lp_roll, adv = stats["logprobs"][mask], batch["rollout_logprobs"][mask], batch["advantages"][mask]
    m = probe_metrics([lp_train], [lp_roll], [adv], (stats["clip_low"], stats["clip_high"]))
    nominal = (1.0 - loss.eps_low, 1.0 + loss.eps_high)
    at = probe_metrics([lp_train], [lp_roll], [adv], nominal)       # what the nominal bounds would have clipped
    m.update(clip_fraction_pos_nominal=at["clip_fraction_pos"], clip_fraction_neg_nominal=at["clip_fraction_neg"])
    rec = {"arm": arm, "seed": seed, "step": step, "version": int(stats["version"]) - 1,
           "reward": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
           "accuracy": float((rewards == 1.0).double().mean()), "entropy": stats["entropy"],
           "response_length": float(samples["lengths"].double().mean()), "loss": stats["loss"],
           "grad_norm": stats["grad_norm"], **m,
           **{k: v for k, v in stats.items() if k.startswith("calib_")},
           "sync": sync_verdicts(res)}
    return rec


def jsonable(obj):
    """Records as strict JSON: non-finite floats (a clip fraction with no token of that sign) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def _worker(args):
    arm, seed, steps, settings = args
    torch.set_num_threads(1)
    return run_arm(arm, seed, steps, settings)


def run_comparison(arms, seeds: int, steps: int, settings: LoopSettings = LoopSettings(), out: str | None = None,
                   jobs: int | None = None, progress=None, seed_start: int = 0) -> dict:
    """Every arm x seed (seeds seed_start..seed_start+seeds-1), in `jobs` worker processes (default: one per CPU
    core, at most one per run; 1 runs in this process). Writes steps.jsonl and runs.jsonl under `out` when given."""
    tasks = [(a, s, steps, settings) for s in range(seed_start, seed_start + seeds) for a in arms]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    results = []

    def done(r):                  # the records so far on disk after every run: a part cut short keeps what ran
        results.append(r)
        if out:
            write_records(out, [x["run"] for x in results], [rec for x in results for rec in x["steps"]])
        if progress:
            progress(r["run"])
    if jobs == 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)         # the GEMMs are tiny: more threads only spin, and the results would differ
        try:
            for t in tasks:
                done(run_arm(*t))
        finally:
            torch.set_num_threads(threads)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
            for r in ex.map(_worker, tasks):
                done(r)
    return {"runs": [r["run"] for r in results], "steps": [rec for r in results for rec in r["steps"]]}


def write_records(out: str, runs: list[dict], steps: list[dict]):
    """steps.jsonl (one record per arm, seed and step) and runs.jsonl (one per run), strict JSON."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "steps.jsonl"), "w") as f:
        for rec in steps:
            f.write(json.dumps(jsonable(rec), allow_nan=False) + "\n")
    with open(os.path.join(out, "runs.jsonl"), "w") as f:
        for r in runs:
            f.write(json.dumps(jsonable(r), default=str, allow_nan=False) + "\n")
