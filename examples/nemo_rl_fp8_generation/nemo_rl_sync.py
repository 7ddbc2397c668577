"""NeMo RL's FP8 generation refit as a sync under fp8check's pytest plugin, with NeMo RL's own quantizer on the
engine's load path.

With `policy.generation.vllm_cfg.precision: fp8` NeMo RL (NVIDIA-NeMo/RL 7ea279ab,
nemo_rl/models/generation/vllm/quantization/fp8.py) starts vLLM as a block-FP8 checkpoint engine --
`quantization="fp8"`, `hf_overrides.quantization_config` = {weight_block_size [128, 128], ignored_layers: every
module of the first / last `num_*_layers_in_bf16` layers and every module whose name contains a
`quantization_ignored_layer_kws` keyword} (`init_fp8`, fp8.py:189-312) -- and patches the worker so that each
refit goes through its `load_weights` (fp8.py:476-530): the trainer streams the policy's BF16 weights in HF names;
a tensor whose vLLM module holds FP8 weights is quantized on its own by `cast_tensor_to_fp8_blockwise` and loaded
with its `_scale_inv`; every other tensor is loaded as sent.

Here the plugin's `load(bucket)` is the refit's transport, and the engine behind it is `NemoRLEngine`: fp8check's
engine (the CPU reference, or vLLM with `--fp8check-live`) started from NeMo RL's checkpoint config, behind
NeMo RL's load path, whose quantizer is NeMo RL's own `cast_tensor_to_fp8_blockwise`, executed from its source
(nemo_rl_loader). Which tensors it quantizes (NeMo's `_is_fp8_weight`: the tensor's vLLM module holds FP8
weights) is read from the engine, since NeMo's test needs a live vLLM model; the per-tensor dispatch is
fp8check's `harness.numerics.nemo_rl.load_weights`, given NeMo's function to call.
"""
from __future__ import annotations

import nemo_rl_loader

from fp8check.harness.layouts import engine_module, is_scale_name
from fp8check.harness.numerics.nemo_rl import load_weights

# NeMo RL's refit buffer is sized in GiB (one bucket for a tiny model); 1 MiB makes the tiny models go in several
# buckets, as a real model does
BUCKET_MB = 1


def nemo_rl_refit(weights, masters, load, *, bucket_mb=BUCKET_MB):
    """NeMo RL's refit of FP8 generation: the policy's BF16 weights in HF names (its Megatron-Bridge export), in
    buckets; the learner's FP8 forward weights (`weights`) are not what NeMo RL sends."""
    bucket, size = [], 0
    for name, t in masters.items():
        bucket.append((name, t))
        size += t.numel() * t.element_size()
        if size >= bucket_mb << 20:
            load(bucket)
            bucket, size = [], 0
    if bucket:
        load(bucket)


def nemo_ignored_layers(modules, kws, first: int = 0, last: int = 0, num_layers: int = 0) -> list[str]:
    """The ignored_layers NeMo RL's `init_fp8` builds (fp8.py:256-303) over the model's module names: the modules
    of the first / last layers kept in BF16, then every module name containing a keyword (a substring match)."""
    layers = set(range(first)) | set(range(num_layers - last, num_layers)) if (first or last) else set()
    out = [m for m in modules if any(f"layers.{i}." in m for i in layers)]
    return out + [m for m in modules if any(k in m for k in kws) and m not in out]


class NemoRLEngine:
    """The engine NeMo RL runs for FP8 generation: `engine`, a block-FP8 checkpoint engine started with NeMo RL's
    ignored_layers, behind NeMo RL's `load_weights` with NeMo RL's own quantizer (`cast`). Everything but the load
    path is the engine's own."""

    def __init__(self, engine, config, cast):
        self.engine, self.config, self.cast = engine, config, cast
        fp8_modules = set(engine.record().fp8_modules or ())
        self.fp8_names = frozenset(p.src for p in config.layout.vllm[0]
                                   if engine_module(p.dst) in fp8_modules and not is_scale_name(p.src))

    def _load(self, items):
        return list(load_weights(items, self.fp8_names, self.config.engine_recipe, self.cast))

    def install(self, items, version=None, **kw):
        return self.engine.install(self._load(items), version, **kw)

    def load_bucket(self, items):
        return self.engine.load_bucket(self._load(items))

    def __getattr__(self, name):
        return getattr(self.engine, name)


def nemo_cast(pow2: bool):
    """NeMo RL's own `cast_tensor_to_fp8_blockwise`, with `pow2_weight_scaling_factors` as given."""
    return nemo_rl_loader.load(pow2).cast_tensor_to_fp8_blockwise
