"""SkyRL 0.4.0's serialized FP8 weight sync, run from SkyRL's own functions, as a sync under fp8check's pytest plugin.

With `generator.inference_engine.fp8_weight_sync_mode: blockwise | mxfp8`, SkyRL's Megatron worker
(skyrl/backends/skyrl_train/workers/megatron/megatron_worker.py:1356-1401) does:

    config = resolve_serialized_fp8_config(mode, hf_config)      # the model's FP8 spec (Qwen3.5), the wire format,
                                                                  # power-of-two scales iff NVTE_FP8_BLOCK_SCALING_
                                                                  # FP32_SCALES=0 (the variable TE reads too)
    source = MegatronWeightSource(bridge, model, bf16)           # Megatron-Bridge's HF export, BF16
    source = SerializedFp8WeightSource(source, config)           # iter_serialized_fp8_tensors per exported weight

and vLLM's weight transfer sends the stream in chunks; on the engine SkyRL's receiver
(inference_servers/new_inference_worker_wrap.py:147-250, `_load_checkpoint_weights`) routes the batched-expert
tensors (`__skyrl_batched_moe_fp8__:` names) to FusedMoE's loader by `batched_moe_wire_targets()` and hands every
other tensor to the model's `load_weights`.

`skyrl_fp8_sync` below does exactly this with the functions imported from SkyRL's wheel (skyrl_loader):
`resolve_serialized_fp8_config`, `SerializedFp8WeightSource`, and for the receiver `SKYRL_BATCHED_MOE_FP8_PREFIX`
and `batched_moe_wire_targets`. Two parts are not SkyRL's code and are written here:
* the export (`bridge_export`): Megatron-Bridge's HF export as SkyRL receives it -- every weight in BF16 (with
  persistent FP8 parameters, `fp8_param`, the FP8 parameter dequantized to BF16, as Transformer Engine's
  Float8BlockwiseQTensor / MXFP8Tensor dequantize does), routed experts batched as Qwen3.5-MoE's HF checkpoint
  holds them (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first, and `mlp.experts.down_proj` [E, H, I]);
* the FusedMoE loader's per-expert step: vLLM's `weight_loader(param, w, name, shard_id, expert_id)` writes
  expert e's slice; here each expert's slice goes to the plugin's `load` under its checkpoint name
  (`mlp.experts.{e}.{gate,up,down}_proj.weight`, shard ids w1 / w3 / w2 as vLLM's expert mapping names them).

The plugin hands a sync function `(weights, masters, load)`: the learner's FP8 forward weights and BF16 masters in
HF names, and `load(items)`, the engine's loader, called once per bucket.
"""
from __future__ import annotations

import contextlib
import functools
import os
import types

import skyrl_loader

# vLLM's packed weight transfer cuts the stream into chunks; 1 MiB makes the tiny models go in several buckets
BUCKET_BYTES = 1 << 20
WIRES = {"block": "blockwise", "mxfp8": "mxfp8"}           # fp8check recipe granularity -> SkyRL's wire format
_SHARD_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}   # vLLM's FusedMoE shard ids


def hf_config(spec) -> types.SimpleNamespace:
    """The model's HF config as SkyRL's spec reads it (`resolve_text_config`: model_type, layer_types)."""
    d = dict(spec.hf_config())
    text = dict(d.get("text_config") or d)
    text.setdefault("model_type", spec.model_type)
    text.setdefault("layer_types", list(spec.layer_types))
    if "text_config" in d:
        d["text_config"] = types.SimpleNamespace(**text)
        return types.SimpleNamespace(**d)
    return types.SimpleNamespace(**text)


@contextlib.contextmanager
def scale_mode(pow2: bool):
    """NVTE_FP8_BLOCK_SCALING_FP32_SCALES as a SkyRL launcher sets it (0: power-of-two scales): the one variable
    Transformer Engine and SkyRL's serializer both read (quantize.py:20-33); put back after."""
    key, saved = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", os.environ.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES")
    os.environ[key] = "0" if pow2 else "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def serialized_config(spec, recipe):
    """SkyRL's SerializedFp8Config for this model and recipe, resolved as its Megatron worker resolves it."""
    s = skyrl_loader.load()
    with scale_mode(recipe.scale_format == "pow2"):
        return s.vllm_format.resolve_serialized_fp8_config(WIRES[recipe.granularity], hf_config(spec))


def _dequantized(codes, scale, recipe):
    """An FP8 parameter as Transformer Engine dequantizes it for an export: codes x scale in fp32, then BF16."""
    import torch
    c = codes.float()
    if recipe.granularity == "mxfp8":
        s = torch.exp2(scale.view(torch.uint8).float() - 127)
        s = s.repeat_interleave(32, dim=-1)[..., : c.shape[-1]]
    else:
        bn, bk = recipe.block_shape
        s = scale.float().repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)[: c.shape[-2], : c.shape[-1]]
    return (c * s).to(torch.bfloat16)


def bridge_export(spec, weights, masters, recipe, fp8_param: bool):
    """Megatron-Bridge's HF export, in checkpoint order: (name, BF16 tensor), routed experts batched per layer."""
    import torch

    def value(n):
        if fp8_param and n + "_scale_inv" in weights:
            return _dequantized(weights[n], weights[n + "_scale_inv"], recipe)
        return masters[n]
    done = set()
    for t in spec.tensors():
        n = t.name
        if ".mlp.experts." not in n:
            yield n, value(n)
            continue
        base = n.split(".mlp.experts.")[0] + ".mlp.experts"
        if base in done:
            continue
        done.add(base)
        E = spec.num_experts
        yield base + ".gate_up_proj", torch.stack([torch.cat([value(f"{base}.{e}.gate_proj.weight"),
                                                              value(f"{base}.{e}.up_proj.weight")]) for e in range(E)])
        yield base + ".down_proj", torch.stack([value(f"{base}.{e}.down_proj.weight") for e in range(E)])


def receive(bucket, load):
    """SkyRL's receiver (`_load_checkpoint_weights`): a batched-expert wire tensor is routed by SkyRL's own target
    map to the FusedMoE parameter and shard it loads into, one expert at a time; the rest goes to the model's
    loader as it is."""
    s = skyrl_loader.load()
    prefix, targets = s.vllm_format.SKYRL_BATCHED_MOE_FP8_PREFIX, s.fp8.batched_moe_wire_targets()
    out = []
    for name, t in bucket:
        if not name.startswith(prefix):
            out.append((name, t))
            continue
        ckpt = name.removeprefix(prefix)
        hit = next(((suffix, shard) for suffix, (_, shard) in targets.items() if ckpt.endswith(suffix)), None)
        if hit is None:
            raise ValueError(f"Unsupported batched MoE wire tensor name {name!r}")    # as SkyRL's receiver says
        suffix, shard = hit
        base, leaf = ckpt[: -len(suffix)] + ".experts", suffix.rsplit(".", 1)[1]
        out += [(f"{base}.{e}.{_SHARD_PROJ[shard]}.{leaf}", t[e]) for e in range(t.shape[0])]
    load(out)


def skyrl_fp8_sync(weights, masters, load, *, spec, recipe, fp8_param=False, bucket_bytes=BUCKET_BYTES):
    """SkyRL's serialized FP8 sync of the learner's export into the engine, bucket by bucket."""
    s = skyrl_loader.load()
    config = serialized_config(spec, recipe)
    source = s.sources.SerializedFp8WeightSource(list(bridge_export(spec, weights, masters, recipe, fp8_param)),
                                                 config)
    bucket, size = [], 0
    for name, t in source:
        bucket.append((name, t))
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            receive(bucket, load)
            bucket, size = [], 0
    if bucket:
        receive(bucket, load)


def sync_for(config):
    """The sync function for a SyncConfig (the plugin's `fp8check_config`)."""
    return functools.partial(skyrl_fp8_sync, spec=config.spec, recipe=config.recipe,
                             fp8_param=config.trainer.fp8_param)
