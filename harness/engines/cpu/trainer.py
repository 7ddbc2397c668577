"""CPU reference trainer: a mirror of a Megatron-Core + Transformer Engine learner's numerics.

It holds fp32 masters under Megatron names (fused `linear_qkv`, `linear_fc1`, GDN `in_proj`), and its FP8
forward weights are what TE's blockwise quantizer makes of them: from the BF16 parameter (the default, TE
quantizes the module's BF16 weight) or, with persistent FP8 parameters (`fp8_param`), from the fp32 master
(TE `quantize_(master)` after the optimizer step). Fused tensors are quantized whole, as TE does; exporting to
HF names moves 128-row blocks together with their scales.
"""
from __future__ import annotations

import torch

from ...config import SyncConfig
from ...layouts import scale_name
from .forward import Weights, dequantize_state, te_act_quant, token_logprobs


class ReferenceTrainer:
    engine = "cpu-reference-trainer"

    def __init__(self, config: SyncConfig):
        self.config = config
        self.layout = config.layout
        self.masters = {k: v.float() for k, v in self.layout.hf_to_megatron(config.spec.init_weights(config.seed)).items()}
        self.step = 0
        self._fp8_cache: dict | None = None

    # -- optimizer ----------------------------------------------------------------------------------------------
    def optimizer_step(self, lr: float = 2e-3) -> int:
        """A deterministic update of every master (a stand-in gradient step; what matters here is that every
        tensor, codes and scales, changes between versions)."""
        g = torch.Generator().manual_seed(10_000 * (self.config.seed + 1) + self.step)
        for k in sorted(self.masters):
            m = self.masters[k]
            self.masters[k] = m + lr * m.abs().mean().clamp(min=1e-3) * torch.randn(m.shape, generator=g) * 10
        self.step += 1
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
                    src = m if self.config.trainer.fp8_param else m.to(torch.bfloat16)
                    q, s = r.quantize_weight(src)
                    out[k], out[scale_name(k)] = q, s
                else:
                    out[k] = m.to(torch.bfloat16)
            self._fp8_cache = out
        return self._fp8_cache

    def export_hf(self) -> dict[str, torch.Tensor]:
        """Trainer snapshot in HF names: exactly the bytes the learner's forward uses."""
        return self.layout.megatron_to_hf(self.fp8_forward_weights())

    def master_hf(self) -> dict[str, torch.Tensor]:
        return self.layout.megatron_to_hf({k: v for k, v in self.masters.items()}, with_scales=False)

    def forward_weights(self) -> Weights:
        hf = self.export_hf()
        return Weights(dequantize_state(self.config.recipe, hf, self.config.fp8_tensors), self.config.fp8_tensors,
                       te_act_quant(self.config.recipe))

    def logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        W = self.forward_weights()
        return [token_logprobs(self.config.spec, W, p) for p in prompts]
