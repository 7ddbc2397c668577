"""CPU reference trainer: a mirror of a Megatron-Core + Transformer Engine learner's numerics.

It holds fp32 masters under Megatron names (fused `linear_qkv`, `linear_fc1`, GDN `in_proj`), and its FP8
forward weights are what TE's blockwise quantizer makes of them: from the BF16 parameter (the default, TE
quantizes the module's BF16 weight) or, with persistent FP8 parameters (`fp8_param`), from the fp32 master
(TE `quantize_(master)` after the optimizer step). Fused tensors are quantized whole, as TE does; exporting to
HF names moves 128-row blocks together with their scales.
"""
from __future__ import annotations

import torch

from functools import lru_cache

from ...config import SyncConfig
from ...layouts import scale_name
from ...models import get_model
from ...numerics.forward import Weights, act_quant, dequantize_state, token_logprobs
from ...record import TrainerRecord


# The reference trainer is deterministic in (model, seed, step): the fault matrix builds hundreds of them, so
# masters and their FP8 images are memoized. Callers never mutate cached tensors in place.
@lru_cache(maxsize=64)
def megatron_masters(model: str, seed: int, step: int) -> dict:
    """The deterministic fp32 masters at `step` under Megatron names (the CPU reference and the Megatron/TE trainer
    both hold exactly these)."""
    from ...layouts.megatron import megatron_pieces
    from ...layouts.pieces import disassemble
    spec = get_model(model)
    if step == 0:
        pieces, shapes = megatron_pieces(spec)
        return {k: v.float() for k, v in disassemble(pieces, spec.init_weights(seed), shapes).items()}
    # elementwise only: a data-dependent reduction (a mean) rounds differently with the thread count, and the
    # GPU trainer worker must reproduce these masters bit for bit
    prev = megatron_masters(model, seed, step - 1)
    g = torch.Generator().manual_seed(10_000 * (seed + 1) + step - 1)
    lr = 2e-3
    return {k: prev[k] + (lr * 10 * 0.05) * torch.randn(prev[k].shape, generator=g) for k in sorted(prev)}


def masters_hf(config: SyncConfig, step: int) -> dict:
    """The fp32 masters at `step` under HF names (both trainers, CPU and Megatron/TE, hold exactly these)."""
    return config.layout.megatron_to_hf(megatron_masters(config.model, config.seed, step), with_scales=False)


def act_quant_kind(config: SyncConfig) -> str:
    """Transformer Engine quantizes activations in 1x128 blocks with the weights' scale rule (MXFP8: 1x32)."""
    return "mxfp8" if config.recipe.granularity == "mxfp8" else "te"


_EXPORTS: dict = {}


@lru_cache(maxsize=4096)
def _quantized(model: str, seed: int, step: int, name: str, recipe, from_master: bool):
    m = megatron_masters(model, seed, step)[name]
    return recipe.quantize_weight(m if from_master else m.to(torch.bfloat16))


class ReferenceTrainer:
    engine = "cpu-reference-trainer"

    def __init__(self, config: SyncConfig):
        self.config = config
        self.layout = config.layout
        self.step = 0
        self.masters = dict(megatron_masters(config.model, config.seed, 0))
        self._fp8_cache: dict | None = None

    # -- optimizer ----------------------------------------------------------------------------------------------
    def optimizer_step(self) -> int:
        """A deterministic update of every master (a stand-in gradient step, lr 2e-3 in `_masters`; what matters
        here is that every tensor, codes and scales, changes between versions)."""
        self.step += 1
        self.masters = dict(megatron_masters(self.config.model, self.config.seed, self.step))
        self._fp8_cache = None
        return self.step

    # -- the learner's FP8 forward weights ----------------------------------------------------------------------
    def fp8_forward_weights(self) -> dict[str, torch.Tensor]:
        """Megatron-named: codes + `_scale_inv` for FP8 GEMMs, BF16 for everything else."""
        if self._fp8_cache is None:
            out = {}
            r = self.config.trainer_recipe
            for k, m in self.masters.items():
                if k in self.layout.fp8_megatron:
                    q, s = _quantized(self.config.model, self.config.seed, self.step, k, r,
                                      self.config.trainer.fp8_param)
                    out[k], out[scale_name(k)] = q, s
                else:
                    out[k] = m.to(torch.bfloat16)
            self._fp8_cache = out
        return self._fp8_cache

    def export_hf(self) -> dict[str, torch.Tensor]:
        """Trainer snapshot in HF names: exactly the bytes the learner's forward uses (a fresh dict; the
        tensors are shared with a memo and must not be written in place)."""
        c = self.config
        key = (c.model, c.seed, self.step, c.trainer_recipe, c.trainer.fp8_param, c.fp8_tensors)
        hit = _EXPORTS.get(key)
        if hit is None:
            hit = _EXPORTS[key] = self.layout.megatron_to_hf(self.fp8_forward_weights())
            if len(_EXPORTS) > 64:
                _EXPORTS.pop(next(iter(_EXPORTS)))
        return dict(hit)

    def master_hf(self) -> dict[str, torch.Tensor]:
        return masters_hf(self.config, self.step)

    def record(self) -> TrainerRecord:
        return TrainerRecord(self.engine, self.step, self.config.trainer.fp8_param, act_quant_kind(self.config))

    def forward_weights(self) -> Weights:
        hf = self.export_hf()
        return Weights(dequantize_state(self.config.recipe, hf, self.config.fp8_tensors), self.config.fp8_tensors,
                       act_quant(act_quant_kind(self.config), self.config.recipe))

    def logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        W = self.forward_weights()
        return [token_logprobs(self.config.spec, W, p) for p in prompts]
