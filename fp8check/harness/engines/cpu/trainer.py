"""CPU reference trainer: a mirror of a Megatron-Core + Transformer Engine learner's numerics.

It holds fp32 masters under Megatron names (fused `linear_qkv`, `linear_fc1`, GDN `in_proj`), and its FP8
forward weights are what TE's blockwise quantizer makes of them: from the BF16 parameter (the default, TE
quantizes the module's BF16 weight) or, with persistent FP8 parameters (`fp8_param`), from the fp32 master
(TE `quantize_(master)` after the optimizer step). Fused tensors are quantized whole, as TE does; exporting to
HF names moves 128-row blocks together with their scales.
"""
from __future__ import annotations

import weakref

import torch

from ...config import SyncConfig
from ...layouts import is_scale_name, scale_name, weight_of_scale
from ...lazy import LazyMap
from ...memo import Memo
from ...numerics.forward import Weights, act_quant, dequantized, prompts_logprobs
from ...record import TrainerRecord
from .masters import device_masters, kv_calibration, masters_hf, megatron_masters
from ...kinds import Granularity

# The reference trainer is deterministic in (model, seed, step): the fault matrix builds hundreds of them, so the
# FP8 images and BF16 copies of the masters are memoized, per tensor (high-precision tensors are shared by every
# recipe), within a byte budget that holds one 1-layer Qwen3-8B export. Callers never mutate them in place.
FORWARD_MEMO_BYTES = 4 << 30
_FORWARD = Memo(FORWARD_MEMO_BYTES)


def act_quant_kind(config: SyncConfig) -> str:
    """Transformer Engine quantizes activations in 1x128 blocks with the weights' scale rule (MXFP8: 1x32); a
    BF16 learner not at all."""
    if not config.trainer_fp8:
        return "none"
    if config.delayed_scaling is not None:
        return "te-delayed"
    return "mxfp8" if config.recipe.granularity == Granularity.MXFP8 else "te"


def is_fp8_gemm(config: SyncConfig, megatron_name: str) -> bool:
    """The learner runs this Megatron tensor's GEMM in FP8."""
    return config.trainer_fp8 and megatron_name in config.layout.fp8_megatron


def te_forward_weight(config: SyncConfig, name: str, master: torch.Tensor):
    """What Transformer Engine's forward holds for one Megatron tensor given its fp32 master: (codes, scale_inv)
    for an FP8 GEMM (TE's quantizer of the BF16 parameter, or of the fp32 master with `fp8_param`), the BF16
    parameter otherwise. The one rule for the reference trainer and the CPU learner."""
    if is_fp8_gemm(config, name):
        return config.trainer_recipe.quantize_weight(master if config.trainer.fp8_param else master.to(torch.bfloat16))
    return master.to(torch.bfloat16)


def forward_weight(config: SyncConfig, step: int, name: str):
    """One Megatron tensor of the reference learner's forward at `step` (`te_forward_weight` of its master),
    memoized."""
    c = config
    key = (c.model, c.seed, step, name) + ((c.trainer_recipe, c.trainer.fp8_param) if is_fp8_gemm(c, name)
                                           else ("bf16",))
    return _FORWARD.get(key, lambda: te_forward_weight(c, name, megatron_masters(c.model, c.seed, step)[name]))


def hf_state(layout, megatron: dict[str, torch.Tensor], with_scales: bool) -> dict[str, torch.Tensor]:
    """`layout.megatron_to_hf` of a memoized Megatron forward state, memoized by its tensors' identity: the HF
    members of fused tensors are then the same tensors from sync to sync, so what is keyed by tensor identity
    downstream (the sender's digests, the declared post-load transform in S2/S3, the learner's log-probs) is
    computed once per distinct state. The entry holds weak references: it keeps no source alive, and a dead
    source's id reused by a new tensor misses."""
    key = ("hf", layout.spec, layout.fp8_hf, tuple(layout.block_shape), layout.trainer_granularity, with_scales,
           tuple((k, id(t)) for k, t in megatron.items()))
    hit = _FORWARD.lookup(key)
    if hit is None or any(ref() is not t for ref, t in zip(hit[0], megatron.values())):
        hit = _FORWARD.put(key, (tuple(weakref.ref(t) for t in megatron.values()),
                                 layout.megatron_to_hf(megatron, with_scales=with_scales)))
    return dict(hit[1])


def forward_state(names, weight) -> dict[str, torch.Tensor]:
    """A Megatron-named forward state: codes + `_scale_inv` for each FP8 GEMM, the BF16 parameter for the rest;
    `weight(name)` is one tensor's forward weight (`te_forward_weight`'s result)."""
    out = {}
    for k in names:
        w = weight(k)
        if isinstance(w, tuple):
            out[k], out[scale_name(k)] = w
        else:
            out[k] = w
    return out


def policy_weights(config: SyncConfig, hf) -> Weights:
    """The forward over a learner's HF-named export, as the probes read it: FP8 weights dequantized (when first
    read), TE's activation quantizer on every FP8 GEMM."""
    return Weights(dequantized(config.recipe, hf, config.trainer_fp8_tensors), config.trainer_fp8_tensors,
                   act_quant(act_quant_kind(config), config.recipe))


class ReferenceTrainer:
    engine = "cpu-reference-trainer"

    def __init__(self, config: SyncConfig, device: str | None = None):
        """`device`: where the learner's tensors live (default: "cuda" on the device sync path, `trainer.device`;
        else the host, memoized). On a device it holds that path's masters (`device_masters`, the ones the
        Megatron/TE adapter holds there) and computes its FP8 forward weights, export and log-probs where they
        live: the same TE-exact quantizer and reference forward, at real shapes without a host copy."""
        config.spec.require_modelled()
        self.config = config
        self.layout = config.layout
        self.step = 0
        self._fp8_cache: dict | None = None
        self.device = device if device is not None else ("cuda" if config.trainer.device else None)
        self._dev: tuple | None = None            # (step, masters) on the device
        self._hf_cache: dict | None = None        # the device export of the current step (stable identities)
        if self.device is not None:
            self.engine = f"reference-trainer-{torch.device(self.device).type}"

    @property
    def masters(self):
        """The fp32 masters at the current step, Megatron names (generated when read at real shapes)."""
        if self.device is not None:
            return self._device_masters()
        return megatron_masters(self.config.model, self.config.seed, self.step)

    def _device_masters(self) -> dict:
        """`device_masters` at the current step, chained from step 0 (each step's update reads the previous)."""
        if self._dev is None or self._dev[0] > self.step:
            self._dev = (0, device_masters(self.layout, self.config.seed, 0, self.device))
        while self._dev[0] < self.step:
            k = self._dev[0] + 1
            self._dev = (k, device_masters(self.layout, self.config.seed, k, self.device, prev=self._dev[1]))
        return self._dev[1]

    # -- optimizer ----------------------------------------------------------------------------------------------
    def optimizer_step(self) -> int:
        """A deterministic update of every master (a stand-in gradient step, harness.engines.cpu.masters; what
        matters here is that every tensor, codes and scales, changes between versions)."""
        self.step += 1
        self._fp8_cache = self._hf_cache = None
        return self.step

    # -- the learner's FP8 forward weights ----------------------------------------------------------------------
    def fp8_forward_weights(self, step: int | None = None) -> dict[str, torch.Tensor]:
        """Megatron-named: codes + `_scale_inv` for FP8 GEMMs, BF16 for everything else (at `step`, default the
        current one)."""
        if step is not None and step != self.step:
            return self._forward_at(step)
        if self._fp8_cache is None:
            self._fp8_cache = self._forward_at(self.step)
        return self._fp8_cache

    def _forward_at(self, step: int) -> dict[str, torch.Tensor]:
        if self.device is not None:
            if step != self.step:
                raise LookupError(f"the learner on {self.device} keeps its current step ({self.step}) only")
            m = self._device_masters()
            return forward_state(self.layout.megatron_shapes, lambda k: te_forward_weight(self.config, k, m[k]))
        return forward_state(self.layout.megatron_shapes, lambda k: forward_weight(self.config, step, k))

    def export_hf(self) -> dict[str, torch.Tensor]:
        """Trainer snapshot in HF names: exactly the bytes the learner's forward uses, and the job's calibrated
        KV-cache scales where it has them (a fresh dict; the tensors are shared with a memo and must not be
        written in place)."""
        kv = kv_calibration(self.config, self.step)
        if self.device is not None:
            if self._hf_cache is None:
                self._hf_cache = self.layout.megatron_to_hf(self.fp8_forward_weights(),
                                                            with_scales=self.config.trainer_fp8)
            return {**self._hf_cache, **{n: t.to(self.device) for n, t in kv.items()}}
        return {**hf_state(self.layout, self.fp8_forward_weights(), self.config.trainer_fp8), **kv}

    def export_hf_at(self, step: int):
        """What `export_hf` returned at `step` (the reference is deterministic in the step), as a mapping that
        makes each tensor when read (on a device: the current step only)."""
        if self.device is not None:
            if step != self.step:
                raise LookupError(f"the learner on {self.device} keeps its current step ({self.step}) only")
            return self.export_hf()
        names = list(self.layout.megatron_shapes) + [scale_name(k) for k in self.layout.megatron_shapes
                                                     if is_fp8_gemm(self.config, k)]

        def megatron(k):
            w = forward_weight(self.config, step, weight_of_scale(k) if is_scale_name(k) else k)
            return w if not isinstance(w, tuple) else (w[1] if is_scale_name(k) else w[0])
        hf = self.layout.megatron_to_hf_lazy(LazyMap(names, megatron), with_scales=self.config.trainer_fp8)
        kv = kv_calibration(self.config, step)
        return {**dict(hf.items()), **kv} if kv else hf

    def master_hf(self) -> dict[str, torch.Tensor]:
        if self.device is not None:
            return self.layout.megatron_to_hf(self._device_masters(), with_scales=False)
        return masters_hf(self.config, self.step)

    def record(self) -> TrainerRecord:
        return TrainerRecord(self.engine, self.step, self.config.trainer.fp8_param, act_quant_kind(self.config))

    def forward_weights(self) -> Weights:
        return policy_weights(self.config, self.export_hf())

    def logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """The learner's log-probs, memoized by what `policy_weights` reads: the export's tensors by identity (see
        `hf_state`), the calibrated KV scales by value, the recipe, the FP8 GEMMs and the activation quantizer."""
        c, hf = self.config, self.export_hf()
        kv = set(c.kv_scale_names)
        state = [(n, t) for n, t in hf.items() if n not in kv]
        key = ("logprobs", c.spec, c.recipe, c.trainer_fp8_tensors, act_quant_kind(c),
               tuple((n, id(t)) for n, t in state), tuple((n, float(hf[n])) for n in sorted(kv) if n in hf),
               tuple(map(tuple, prompts)))
        hit = _FORWARD.lookup(key)
        if hit is None or any(ref() is not t for ref, (_, t) in zip(hit[0], state)):
            hit = _FORWARD.put(key, (tuple(weakref.ref(t) for _, t in state),
                                     prompts_logprobs(c.spec, policy_weights(c, hf), prompts)))
        return [t.clone() for t in hit[1]]
