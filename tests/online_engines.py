"""Shared by the tests of engines that quantize the BF16 they receive (rollout.quantization online-per-block /
online-per-tensor): the config, what a correct BF16 sync sends, the failing findings."""
from dataclasses import replace

from harness.config import recommended_config
from harness.engines.registry import make_engine


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
