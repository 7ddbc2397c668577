"""verl 0.9.1's FP8 rollout weight sync, run from verl's own functions, as a sync under fp8check's pytest plugin.

With `actor_rollout_ref.rollout.quantization=fp8` a verl rollout worker receives the actor's BF16 weights (HF
names) and quantizes them itself before loading them into the engine. On the SGLang rollout
(verl/workers/rollout/sglang_rollout/sglang_rollout.py, `update_weights`) that is:

    quant_config = build_sglang_fp8_quant_config(hf_config)        # block [128, 128], ignored_layers if any
    weights = SGLangFP8QuantizerHelper(quant_config).quant_weights_by_name(weights, dtype=hf_config.dtype)
    async for params_batch in get_named_tensor_buckets(weights, update_weights_bucket_bytes):
        await sgl_update_weights(engine, params_batch, ...)         # here: the plugin's `load`

`verl_fp8_rollout` below does exactly this with the functions imported from the installed verl (verl_loader),
inside a world-size-1 gloo process group, as a verl worker runs inside torch.distributed. The TRT-LLM rollout
uses TRTLLMFP8QuantizerHelper, a subclass of the same FP8QuantizerHelper with nothing overridden, so its name
rules and numerics are the same. verl's vLLM rollout (verl/utils/vllm/vllm_quant_utils.py::quant_weights) picks
the FP8 tensors by the vLLM model's parameter dtypes instead of by name and calls the same scaled_fp8_blockwise;
it needs vllm importable, so it is not loaded here (on CPU).

The plugin hands a sync function `(weights, masters, load)`: the learner's FP8 forward weights (not used here:
verl's rollout never sees them, it re-quantizes the BF16 weights), the BF16 masters in HF names (what verl's actor
sends), and `load(items)`, the engine's loader, called once per bucket.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket

import verl_loader

BLOCK = [128, 128]
# verl's default update_weights_bucket_megabytes is 2048 (one bucket for a tiny model); 1 MiB makes the tiny
# models go in several buckets, as a real model does.
BUCKET_MB = 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def single_rank_process_group():
    """A world-size-1 gloo process group for the duration (a verl worker always runs in one); torn down after,
    and MASTER_ADDR / MASTER_PORT put back as they were. An already initialized group is used as it is."""
    import torch.distributed as dist
    if dist.is_initialized():
        yield
        return
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    try:
        dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def _update_weights(masters, load, *, ignored_layers=(), bucket_mb=BUCKET_MB):
    import torch
    verl = verl_loader.load()
    # verl's actor hands the rollout GPU tensors (where verl's Triton kernel runs); fp8check's reference engine
    # takes host tensors, so each bucket goes back to the CPU before `load` (a no-op on a CPU machine)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    named_tensors = ((name, t.to(device)) for name, t in masters.items())
    # the HF config of a BF16 checkpoint has no quantization_config: verl builds the block-FP8 one
    quant_config = verl.sglang_fp8_utils.build_sglang_fp8_quant_config(None, ignored_layers=list(ignored_layers))
    assert quant_config["weight_block_size"] == BLOCK
    helper = verl.sglang_fp8_utils.SGLangFP8QuantizerHelper(quant_config)
    weights = helper.quant_weights_by_name(named_tensors, dtype=torch.bfloat16)
    async for bucket in verl.sglang_utils.get_named_tensor_buckets(weights, bucket_mb << 20):
        load([(name, t.cpu()) for name, t in bucket])


def verl_fp8_rollout(weights, masters, load, *, ignored_layers=(), bucket_mb=BUCKET_MB):
    """verl's SGLang FP8 rollout update_weights on the BF16 masters, in a world-size-1 process group.
    `ignored_layers`: verl's knob for layers to keep BF16 (quantization_config.ignored_layers or the
    SGLANG_FP8_IGNORED_LAYERS environment variable; matched per dotted name component)."""
    with single_rank_process_group():
        asyncio.run(_update_weights(masters, load, ignored_layers=ignored_layers, bucket_mb=bucket_mb))


def verl_fp8_rollout_ignoring(*ignored_layers):
    """verl_fp8_rollout with `ignored_layers` set, the fix a verl user has for a layer verl's name rules miss."""
    return functools.partial(verl_fp8_rollout, ignored_layers=ignored_layers)


def verl_fp8_rollout_no_process_group(weights, masters, load, *, bucket_mb=BUCKET_MB):
    """The same update_weights called with no torch.distributed process group: quant_weights_by_name calls
    torch.distributed.get_rank() inside its try block, which raises, and its `except Exception` logs the error and
    yields the BF16 tensor instead (verl ships this fallback)."""
    import torch.distributed as dist
    assert not dist.is_initialized()
    asyncio.run(_update_weights(masters, load, bucket_mb=bucket_mb))
