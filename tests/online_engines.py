"""Shared by the tests of engines that quantize the BF16 they receive (rollout.quantization online-per-block /
online-per-tensor): the config, what a correct BF16 sync sends, a sync into the CPU engine judged by check_sync,
the failing findings."""
from dataclasses import replace

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import check_sync


def online_config(quantization: str, model: str = "tiny-dense", tp: int = 1):
    base = recommended_config(model, "blockwise-fp32")
    return replace(base, rollout=replace(base.rollout, quantization=quantization, tp_size=tp))


def bf16_masters(cfg, step: int = 1) -> dict:
    """The reference learner's masters after `step` optimizer steps, as BF16: what a BF16 sync sends."""
    t = make_engine("trainer", "cpu-reference", cfg)
    for _ in range(step):
        t.optimizer_step()
    return {n: x.bfloat16() for n, x in t.master_hf().items()}


def fails(findings) -> list:
    return [f for f in findings if f.verdict == "fail"]


def synced(cfg, sent: dict, version: int = 1, installed: dict | None = None):
    """(engine, check_sync findings) after `installed` (default: `sent` itself; a stale tensor in it is a broken
    sync) went into the CPU reference engine at `version`, judged against `sent`."""
    eng = make_engine("rollout", "cpu-reference", cfg)
    eng.install([(n, t, version) for n, t in (sent if installed is None else installed).items()], version)
    return eng, check_sync(eng, sent, cfg, on_fail="return", version=version)


def stale_sync_failures(cfg, name: str) -> list:
    """The failing findings of a step-2 sync that sends tensor `name` from step 1."""
    sent, old = bf16_masters(cfg, 2), bf16_masters(cfg, 1)
    return fails(synced(cfg, sent, 2, {k: old[k] if k == name else t for k, t in sent.items()})[1])
