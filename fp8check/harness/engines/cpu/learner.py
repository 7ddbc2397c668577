"""CPU learner: a trainable mirror of a Megatron-Core + Transformer Engine FP8 learner, for the end-to-end RL
loop (e2e/rl). Unlike the reference trainer (a deterministic stand-in update), it really learns:

* fp32 masters under Megatron names (fused `linear_qkv`, `linear_fc1`), initialised exactly as the reference
  trainer's step 0 (`megatron_masters`), updated by AdamW (one step per `optimizer_step`; `adamw_step` is
  torch.optim.AdamW's arithmetic, written out because constructing a torch optimizer imports torch._dynamo,
  seconds per worker process);
* FP8 forward weights = Transformer Engine's blockwise quantization of the BF16 parameter (`Recipe.quantize_weight`
  of `master.to(bfloat16)`, fused tensors quantized whole, as TE does; of the fp32 master with `fp8_param`),
  exactly what the reference trainer exports, so C1 judges it; every other tensor is the BF16 parameter;
* the forward (harness.numerics.forward) reads exactly those bytes: weights dequantized (codes * scale_inv),
  activations of every FP8 GEMM fake-quantized as TE does (`act_quant("te", recipe)`: 1x128 blocks), the rest
  in fp32. Gradients reach the masters through the straight-through estimator (the value is the quantized one,
  the derivative that of the identity), for weights and activations alike; the backward itself runs in fp32
  (TE's FP8 dgrad/wgrad GEMMs are not emulated).

`train_step(batch, loss)` is the RL extension the loop needs beyond the trainer protocol (e2e/rl/engines.py
states it precisely): one forward of the FP8 policy on the batch, the loop's loss, backward, one AdamW step.
"""
from __future__ import annotations

import torch

from ...config import TRAINER_PRECISIONS, SyncConfig
from ...layouts import scale_name
from ...numerics.forward import NamedActQuant, Weights, act_quant, logits, prompts_logprobs
from ...record import TrainerRecord
from .trainer import act_quant_kind, forward_state, is_fp8_gemm, megatron_masters, policy_weights, te_forward_weight


def adamw_step(params: list, state: list, step: int, lr: float, betas: tuple, eps: float, weight_decay: float):
    """One AdamW step (Loshchilov & Hutter; torch.optim.AdamW's default, non-amsgrad arithmetic) in place;
    `state` holds (exp_avg, exp_avg_sq) per parameter, `step` counts from 1."""
    b1, b2 = betas
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    with torch.no_grad():
        for p, (m, v) in zip(params, state):
            g = p.grad
            p.mul_(1 - lr * weight_decay)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v.sqrt() / c2 ** 0.5).add_(eps), value=-lr / c1)


def straight_through(value: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`value` in the forward, d/d`source` = identity in the backward. Exact: `source - source.detach()` is +0."""
    return value.detach() + (source - source.detach())


def straight_through_quantizer(quant):
    """An activation quantizer whose gradient is the identity's (TE's FP8 cast as the backward sees it)."""
    if quant is None:
        return None
    return lambda x: straight_through(quant(x.detach()), x)


class CpuLearner:
    engine = "cpu-learner"
    precisions = TRAINER_PRECISIONS          # it runs every trainer.precision

    def __init__(self, config: SyncConfig, *, lr: float = 1e-3, betas: tuple = (0.9, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.0, max_grad_norm: float | None = 1.0):
        self.config = config
        self.layout = config.layout
        self.step = 0
        self.masters = {k: torch.nn.Parameter(v.detach().clone().float())
                        for k, v in megatron_masters(config.model, config.seed, 0).items()}
        self.hparams = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        self.adam_state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.masters.values()]
        self.max_grad_norm = max_grad_norm
        self._fp8: dict | None = None
        self._hf: dict | None = None
        # TE delayed scaling (trainer.precision=fp8-delayed): one state per FP8 weight and per GEMM input, keyed by
        # Megatron tensor (q|k|v is one te.Linear: one weight quantizer, one input quantizer)
        self.delayed = config.delayed_scaling
        self.weight_states = {k: self.delayed.state() for k in self.masters if is_fp8_gemm(config, k)} \
            if self.delayed else {}
        self.input_states: dict = {}
        self._gemm_of = {p.dst.removesuffix(".weight"): p.src for p in self.layout.megatron}

    # -- optimizer ----------------------------------------------------------------------------------------------
    def optimizer_step(self) -> int:
        """One AdamW step with the gradients accumulated since the last step (none: a step on zero gradients),
        then the gradients are cleared and the FP8 forward weights re-derived from the new masters."""
        params = list(self.masters.values())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.step += 1
        adamw_step(params, self.adam_state, self.step, **self.hparams)
        for p in params:
            p.grad = None
        self._fp8 = self._hf = None
        return self.step

    def train_step(self, batch, loss) -> dict:
        """One RL update (e2e/rl/engines.py `RLTrainer.train_step`): `loss(logprobs, entropy, batch)` on the FP8
        forward's per-target log-probs [B, T-1] of `batch["sequences"]` (at `batch["temperature"]`), backward,
        gradient clipping, one AdamW step. Returns the loss's stats plus `grad_norm`, `loss` and the new
        `version`."""
        seqs = batch["sequences"]
        for k, st in self.weight_states.items():      # the step's one cast of each weight records its amax
            st.observe(self.masters[k].detach().to(torch.bfloat16))
        lg = logits(self.config.spec, self.train_weights(record=True), seqs)[:, :-1]
        for st in list(self.weight_states.values()) + list(self.input_states.values()):
            st.update(self.delayed, self.config.recipe.fp8_dtype)     # the fp8_autocast exit
        lp_all = (lg / batch["temperature"]).log_softmax(-1)
        lp = lp_all.gather(-1, seqs[:, 1:, None])[..., 0]
        with torch.no_grad():
            entropy = -(lp_all.exp() * lp_all).sum(-1)
        value, stats = loss(lp, entropy, batch)
        for p in self.masters.values():
            p.grad = None
        value.backward()
        params = list(self.masters.values())
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm) if self.max_grad_norm \
            else torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        stats = {**stats, "grad_norm": float(norm), "loss": float(value.detach())}
        stats["version"] = self.optimizer_step()
        return stats

    # -- the learner's FP8 forward weights ----------------------------------------------------------------------
    def fp8_forward_weights(self) -> dict[str, torch.Tensor]:
        """Megatron-named: codes + `_scale_inv` for FP8 GEMMs, the BF16 parameter for everything else (the
        reference trainer's rule, `te_forward_weight`, over this learner's masters)."""
        if self._fp8 is None:
            self._fp8 = forward_state(self.masters, self._forward_weight)
        return self._fp8

    def _forward_weight(self, k: str):
        m = self.masters[k].detach()
        if k in self.weight_states:            # delayed scaling: the scale the next forward finds, state untouched
            return self.weight_states[k].cast(m.to(torch.bfloat16), self.config.recipe.fp8_dtype, record=False)
        return te_forward_weight(self.config, k, m)

    def _input_quant(self, record: bool):
        """TE delayed scaling of a GEMM's input: the module's current input scale (recording the amax in a
        training forward), dequantized, gradients straight through."""
        dt = self.config.recipe.fp8_dtype

        def q(x, name):
            key = self._gemm_of.get(name, name)
            st = self.input_states.get(key)
            if st is None:
                st = self.input_states[key] = self.delayed.state()
            codes, s_inv = st.cast(x, dt, record=record)
            return straight_through(codes.float() * s_inv, x)
        return q

    def train_weights(self, record: bool = False) -> Weights:
        """HF-named weights for a differentiable forward: exactly the FP8 forward bytes (dequantized), with the
        masters' gradients through the straight-through estimator; TE's activation quantizer likewise (delayed
        scaling: each GEMM input at its module's current scale; `record`: a training forward, amaxes recorded)."""
        fp8, recipe = self.fp8_forward_weights(), self.config.trainer_recipe
        fwd = {}
        for k, p in self.masters.items():
            v = recipe.dequantize_weight(fp8[k], fp8[scale_name(k)]) if is_fp8_gemm(self.config, k) \
                else fp8[k].float()
            fwd[k] = straight_through(v, p)
        hf = self.layout.megatron_to_hf(fwd, with_scales=False)
        if self.delayed:
            return Weights(hf, self.config.trainer_fp8_tensors, NamedActQuant(self._input_quant(record)))
        quant = act_quant(act_quant_kind(self.config), self.config.recipe)
        return Weights(hf, self.config.trainer_fp8_tensors, straight_through_quantizer(quant))

    def export_hf(self) -> dict[str, torch.Tensor]:
        """The learner's FP8 forward weights in HF names: exactly the bytes its forward uses (a fresh dict;
        the tensors are shared with a cache and must not be written in place)."""
        if self._hf is None:
            self._hf = self.layout.megatron_to_hf(self.fp8_forward_weights(), with_scales=self.config.trainer_fp8)
        return dict(self._hf)

    def master_hf(self) -> dict[str, torch.Tensor]:
        return self.layout.megatron_to_hf({k: p.detach() for k, p in self.masters.items()}, with_scales=False)

    def record(self) -> TrainerRecord:
        return TrainerRecord(self.engine, self.step, self.config.trainer.fp8_param, act_quant_kind(self.config),
                             info={"optimizer": "AdamW", **self.hparams})

    def forward_weights(self) -> Weights:
        if self.delayed:                       # the stateful input quantizer, read without recording
            with torch.no_grad():
                w = self.train_weights()
            return Weights({k: v.detach() for k, v in w.tensors.items()}, w.fp8, NamedActQuant(self._input_quant(False)))
        return policy_weights(self.config, self.export_hf())

    def logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        return prompts_logprobs(self.config.spec, self.forward_weights(), prompts)
