"""The deterministic fp32 masters at (model, seed, step): the CPU reference trainer and the Megatron/TE adapter
both hold exactly these, so the two can be compared byte for byte.

Two schemes (`ModelSpec.weight_init`):
* `sequential` (the embedded tiny models): one generator draws every tensor in checkpoint order, then every
  optimizer step adds one generator's noise to every Megatron tensor in sorted order. Held as a dict, memoized.
* `per-tensor` (real shapes): every tensor, and its noise at every step, comes from seeds of its own (per 4M-element
  chunk), so any one tensor is generated alone, when it is read, and nothing is held: a 1-layer Qwen3-8B shape
  is 1.4 B parameters, 5.8 GB of fp32 masters. The same name gets the same values in a model cut to fewer layers.

The update is a stand-in gradient step: master + 1e-3 * N(0, 1), elementwise only (a data-dependent reduction
rounds differently with the thread count, and the GPU trainer worker must reproduce these masters bit for bit).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import torch

from ...lazy import LazyMap
from ...models import INIT, SEQUENTIAL, ModelSpec, get_model

STEP_NOISE = 2e-3 * 10 * 0.05      # lr 2e-3 times a stand-in gradient of scale 0.5
CHUNK = 1 << 22                    # elements per independently seeded chunk (16 MiB of fp32)


# -- sequential (tiny models) ---------------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def _sequential(model: str, seed: int, step: int) -> dict:
    from ...layouts.megatron import megatron_pieces
    from ...layouts.pieces import disassemble
    spec = get_model(model)
    if step == 0:
        pieces, shapes = megatron_pieces(spec)
        return {k: v.float() for k, v in disassemble(pieces, spec.init_weights(seed), shapes).items()}
    prev = _sequential(model, seed, step - 1)
    g = torch.Generator().manual_seed(10_000 * (seed + 1) + step - 1)
    return {k: prev[k] + STEP_NOISE * torch.randn(prev[k].shape, generator=g) for k in sorted(prev)}


# -- per tensor (real shapes) ---------------------------------------------------------------------------------------
def _seed(*parts) -> int:
    """A 32-bit seed (what torch's CPU generator uses) from the tensor's name, the draw and the chunk."""
    return int.from_bytes(hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=4).digest(), "little")


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(a, min(a + CHUNK, n)) for a in range(0, n, CHUNK)]


def _parallel(fn, spans):
    """Chunks are independent draws: run them on the threads torch may use (each op releases the GIL)."""
    threads = min(torch.get_num_threads(), len(spans))
    if threads <= 1:
        for s in spans:
            fn(s)
        return
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(fn, spans))


def per_tensor_master(spec: ModelSpec, seed: int, step: int, name: str) -> torch.Tensor:
    """One HF-named fp32 master at `step`: init ~ N(mean, std) of its kind, plus one noise draw per step."""
    t = _tensor_spec(spec, name)
    mean, std = INIT[t.kind]
    out = torch.empty(t.shape, dtype=torch.float32)
    flat = out.view(-1)

    def draw(span, what="init", j=0):
        a, b = span
        g = torch.Generator().manual_seed(_seed(seed, what, j, name, a // CHUNK))
        if what == "init":
            flat[a:b].normal_(mean, std, generator=g)
        else:
            flat[a:b].add_(torch.empty(b - a).normal_(0.0, 1.0, generator=g).mul_(STEP_NOISE))

    spans = _chunks(flat.numel())
    _parallel(draw, spans)
    for j in range(step):
        _parallel(lambda s, j=j: draw(s, "step", j), spans)
    return out


@lru_cache(maxsize=16)
def _tensor_specs(spec: ModelSpec) -> dict:
    return spec.tensor_map()


def _tensor_spec(spec: ModelSpec, name: str):
    return _tensor_specs(spec)[name]


@lru_cache(maxsize=16)
def _megatron_layout(spec: ModelSpec):
    from ...layouts.megatron import megatron_pieces
    pieces, shapes = megatron_pieces(spec)
    by_src: dict[str, list] = {}
    for p in pieces:
        by_src.setdefault(p.src, []).append(p)
    return by_src, shapes


def _megatron_master(spec: ModelSpec, seed: int, step: int, name: str) -> torch.Tensor:
    """A Megatron tensor from its HF members' masters: the HF tensor itself when it is the whole of it."""
    by_src, shapes = _megatron_layout(spec)
    pieces = by_src[name]
    hf = {}
    for p in pieces:
        if p.dst not in hf:
            hf[p.dst] = per_tensor_master(spec, seed, step, p.dst)
    if len(pieces) == 1 and tuple(hf[pieces[0].dst].shape) == tuple(shapes[name]):
        return hf[pieces[0].dst]
    out = torch.empty(shapes[name], dtype=torch.float32)
    for p in pieces:
        out[p.src_row:p.src_row + p.rows] = hf[p.dst][p.dst_row:p.dst_row + p.rows]
    return out


def device_masters(layout, seed: int, step: int, device="cuda", prev: dict | None = None) -> dict:
    """Deterministic fp32 masters generated on the device (real shapes: no host copy), Megatron names: the same
    distribution as the CPU reference's (GEMMs and embeddings N(0, 0.05), norms 1 + N(0, 0.1)), then each step
    an elementwise update from a per-step, per-tensor generator. What the learners hold on the device sync path
    (the Megatron/TE adapter and the reference trainer alike); not the host path's masters."""
    out = {}
    for i, (n, shape) in enumerate(sorted(layout.megatron_shapes.items())):
        g = torch.Generator(device=device).manual_seed(1_000_003 * (seed + 1) + 7919 * i + 104_729 * step)
        if prev is None:
            x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
            out[n] = 1.0 + 0.1 * x if "norm" in n or n.endswith("layer_norm_weight") else 0.05 * x
        else:
            out[n] = prev[n] + 1e-3 * torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    return out


# -- the two views ----------------------------------------------------------------------------------------------------
def megatron_masters(model: str, seed: int, step: int) -> Mapping[str, torch.Tensor]:
    """The fp32 masters at `step` under Megatron names (a dict for `sequential` models; generated when read for
    `per-tensor` ones). Callers never write them in place."""
    spec = get_model(model)
    if spec.weight_init == SEQUENTIAL:
        return _sequential(model, seed, step)
    return LazyMap(_megatron_layout(spec)[1], lambda k: _megatron_master(spec, seed, step, k))


def masters_hf(config, step: int) -> Mapping[str, torch.Tensor]:
    """The fp32 masters at `step` under HF names (both trainers, CPU and Megatron/TE, hold exactly these)."""
    spec = config.spec
    if spec.weight_init == SEQUENTIAL:
        return dict(_sequential_hf(config.model, config.seed, step))
    return LazyMap([t.name for t in spec.tensors()], lambda n: per_tensor_master(spec, config.seed, step, n))


@lru_cache(maxsize=8)
def _sequential_hf(model: str, seed: int, step: int) -> dict:
    """`_sequential`'s masters cut into HF tensors (`LayoutMap.megatron_to_hf` without scales, which reads only the
    model's Megatron pieces), memoized the same way: every sync reads them, and each fused tensor's members are
    copies. Callers never write them in place."""
    from ...layouts.megatron import megatron_pieces
    from ...layouts.pieces import assemble
    spec = get_model(model)
    return assemble(megatron_pieces(spec)[0], _sequential(model, seed, step), {t.name: t.shape for t in spec.tensors()})


def kv_calibration(config, step: int) -> dict[str, torch.Tensor]:
    """The job's calibrated FP8 KV-cache scales at `step` (fp32 scalars under vLLM's checkpoint names, empty
    without calibration). A deterministic stand-in for a calibration pass (amax of each layer's keys and values
    over calibration prompts / 448): per layer, different for k and v, and moving with the step as a job that
    recalibrates at every refit (NeMo RL) has them."""
    out = {}
    for n in config.kv_scale_names:
        layer = config.spec.layer_of(n)
        base = 0.02 * (1 + 0.25 * layer) * (1 + 0.01 * step)
        out[n] = torch.tensor(base if n.endswith("k_scale") else 0.6 * base, dtype=torch.float32)
    return out


__all__ = ["CHUNK", "STEP_NOISE", "device_masters", "kv_calibration", "masters_hf", "megatron_masters",
           "per_tensor_master"]
