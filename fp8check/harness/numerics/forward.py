"""Reference forward pass of the tiny models on CPU, in fp32, with each engine's FP8 GEMM emulated:
weight codes * scale_inv, and activations fake-quantized the way that engine's kernels quantize them
(Transformer Engine: 1x128 blocks with the TE scale rule; vLLM: per-token groups of 128 with
scale = max(amax, 1e-10) / 448, UE8M0-rounded when DeepGEMM's E8M0 path is on; MXFP8: 1x32 E8M0).

The point is not bit-exactness with a GPU GEMM (accumulation order differs) but a forward whose only FP8
inputs are the bytes each engine holds, so policy probes see exactly the weight mismatch a sync causes.

`logits` takes one sequence (a token list: [T, vocab]) or a batch of equal-length sequences (a LongTensor
[B, T]: [B, T, vocab]); a batch row computes what the same sequence alone computes, up to the GEMMs'
accumulation order (bit-equal on the dense models; MoE rows differ in the last bits). It is differentiable (the
RL loop's learner trains through it); with a KV cache it decodes one token at a time. `Weights.act_dtype` rounds activations the way an engine serving in that
dtype stores them (vLLM runs the model in bfloat16: every GEMM reads BF16 inputs and writes BF16 outputs,
logits included, and the residual stream is BF16); None (the default) keeps everything fp32.

High-precision weights may stay in the dtype they are held in (BF16): they are cast to fp32 where they are used
(embedding rows after the lookup, the lm head in vocabulary chunks), which gives the same values as casting them
first without holding an fp32 copy of a 151936-row vocabulary.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from ..formats import Recipe, dequantize_mxfp8, quantize_mxfp8
from ..formats.blockwise import dequantize_blockwise, to_float
from ..formats.cast import cast_to_fp8
from ..formats.recipe import blockwise_quantizer
from ..kinds import Granularity
from ..layouts import is_scale_name, scale_name, split_layer
from ..lazy import LazyMap
from ..models import ModelSpec

ActQuant = Callable[[torch.Tensor], torch.Tensor]


def te_act_quant(recipe: Recipe) -> ActQuant:
    """Transformer Engine: activations in 1x128 blocks, same amax -> scale rule as the weights."""
    if recipe.granularity is Granularity.MXFP8:
        return lambda x: dequantize_mxfp8(*quantize_mxfp8(x, recipe.fp8_dtype))
    block = (1, recipe.act_block_shape[1])

    def q(x: torch.Tensor) -> torch.Tensor:
        quantize = blockwise_quantizer(x)
        return dequantize_blockwise(*quantize(x, block, pow2=recipe.pow2, amax_epsilon=recipe.amax_epsilon,
                                              fp8_dtype=recipe.fp8_dtype), block)
    return q


def vllm_act_quant(recipe: Recipe, ue8m0: bool = False) -> ActQuant:
    """vLLM `per_token_group_quant_fp8` (group 128): s = max(amax, 1e-10) / 448, q = clamp(x / s)."""
    if recipe.granularity is Granularity.MXFP8:
        return lambda x: dequantize_mxfp8(*quantize_mxfp8(x, recipe.fp8_dtype))
    g = recipe.act_block_shape[1]

    def q(x: torch.Tensor) -> torch.Tensor:
        n, k = x.shape
        xp = (F.pad(x, (0, (-k) % g)) if k % g else x).reshape(n, -1, g)
        amax = xp.abs().amax(-1, keepdim=True).clamp(min=1e-10)
        s = amax / 448.0
        if ue8m0:
            s = torch.exp2(torch.ceil(torch.log2(s)))
        codes = cast_to_fp8(xp / s, recipe.fp8_dtype)
        return (to_float(codes) * s).reshape(n, -1)[:, :k]
    return q


def act_quant(kind: str, recipe: Recipe) -> ActQuant | None:
    """The activation quantizer an engine declares (EngineRecord.act_quant / TrainerRecord.act_quant)."""
    if kind == "none":
        return None
    if kind == "te":
        return te_act_quant(recipe)
    if kind in ("vllm", "vllm-ue8m0", "mxfp8"):
        return vllm_act_quant(recipe, ue8m0=kind == "vllm-ue8m0")
    if kind == "vllm-per-token":
        return NamedActQuant(online_per_tensor_act_quant)
    if kind == "te-delayed":
        raise ValueError("Transformer Engine's delayed scaling quantizes activations with scales from its amax "
                         "history, which a snapshot does not carry (the engines' measured log-probs do: --probes)")
    raise ValueError(f"unknown activation quantizer {kind!r}")


def online_per_tensor_act_quant(x: torch.Tensor, name: str) -> torch.Tensor:
    """vLLM's online per-tensor FP8 (`quantization="fp8"`) on Hopper: its CUTLASS linears quantize activations
    dynamically per token; its Triton MoE experts per tensor (fused_moe/utils.py: one scale over the expert
    GEMM's input; here over the rows the expert receives, which is what this forward hands it)."""
    from .online import per_tensor_activation_quant, per_token_activation_quant
    return per_tensor_activation_quant(x) if ".experts." in name else per_token_activation_quant(x)


class NamedActQuant:
    """An activation quantizer that needs the GEMM's module name: vLLM's online per-tensor method (per token for
    linears, per tensor for experts), TE's delayed scaling (one state per module's input). `Weights.linear` calls
    it as fn(x, name); every other quantizer as fn(x)."""

    def __init__(self, fn: Callable[[torch.Tensor, str], torch.Tensor]):
        self.fn = fn

    def __call__(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.fn(x, name)


@dataclass
class Weights:
    """HF-named weights for the forward: fp32 tensors, FP8 ones already dequantized (codes * scale_inv)."""
    tensors: dict[str, torch.Tensor]
    fp8: frozenset                      # names whose GEMM runs in FP8 (activations get fake-quantized)
    act_quant: ActQuant | None
    act_dtype: torch.dtype | None = None   # activations stored in this dtype (serving engines); None: fp32
    logit_scale: float = 1.0            # logits multiplied by this before the softmax (vLLM LogitsProcessor.scale)
    kv_quant: object = None             # K and V as the engine's KV cache holds them, f(t, layer prefix, "k" | "v")

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """An activation as the engine stores it (rounded to `act_dtype`, computed on in fp32)."""
        return x if self.act_dtype is None else x.to(self.act_dtype).float()

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = _f32(self.tensors[name + ".weight"])
        shp = x.shape
        x2 = self.act(x.reshape(-1, shp[-1]))
        if name + ".weight" in self.fp8 and self.act_quant is not None:
            x2 = self.act_quant(x2, name) if isinstance(self.act_quant, NamedActQuant) else self.act_quant(x2)
        return self.act((x2 @ w.t()).reshape(*shp[:-1], w.shape[0]))


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()


def dequantized(recipe: Recipe, state, fp8_names) -> LazyMap:
    """The forward's view of a codes/scale_inv state: FP8 weights dequantized when first read (then kept: the
    probe prompts reuse them), everything else as held (cast to fp32 at use)."""
    def value(n):
        return recipe.dequantize_weight(state[n], state[scale_name(n)]) if n in fp8_names else state[n]
    return LazyMap([n for n in state if not is_scale_name(n)], value, cache=True)


def dequantize_state(recipe: Recipe, state: dict[str, torch.Tensor], fp8_names) -> dict[str, torch.Tensor]:
    """codes/scale_inv pairs -> fp32 weights; other tensors -> fp32."""
    out = {}
    for n, t in state.items():
        if is_scale_name(n):
            continue
        if n in fp8_names:
            out[n] = recipe.dequantize_weight(t, state[scale_name(n)])
        else:
            out[n] = t.float()
    return out


def _rms(x, w, eps, centered: bool = False):
    """RMSNorm; `centered`: a zero-centered weight, the norm scales by 1 + w (vLLM's GemmaRMSNorm)."""
    w = _f32(w)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w if centered else w)


def _norm(spec: ModelSpec, x, w):
    """A decoder norm (input, post-attention, final, q / k): zero-centered where the model's are."""
    return _rms(x, w, spec.rms_norm_eps, spec.zero_centered_norms)


def _rope(x, theta, start=0, dims=None):   # x [..., T, h, D] at positions start.., neox style (rotate halves)
    """RoPE on the first `dims` dims of each head (default all: a partial rotary factor turns fewer), the rest
    passed through."""
    T, D = x.shape[-3], x.shape[-1]
    R = D if dims is None else dims
    inv = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.float32, device=x.device) / R))
    ang = torch.arange(start, start + T, dtype=torch.float32, device=x.device)[:, None] * inv[None]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : R // 2], x[..., R // 2:R]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return out if R == D else torch.cat([out, x[..., R:]], -1)


def _attention(spec: ModelSpec, W: Weights, x, p, cache=None):            # x [..., T, H]
    lead, T, D, nh, nkv = x.shape[:-2], x.shape[-2], spec.head_dim, spec.num_heads, spec.num_kv_heads
    q = W.linear(x, p + "self_attn.q_proj")
    gate = None
    if spec.attn_output_gate:
        q, gate = q.view(*lead, T, nh, 2 * D).chunk(2, -1)
        gate = gate.reshape(*lead, T, nh * D)
    q = q.reshape(*lead, T, nh, D)
    k = W.linear(x, p + "self_attn.k_proj").view(*lead, T, nkv, D)
    v = W.linear(x, p + "self_attn.v_proj").view(*lead, T, nkv, D)
    if spec.qk_norm:
        q = W.act(_norm(spec, q, W.tensors[p + "self_attn.q_norm.weight"]))
        k = W.act(_norm(spec, k, W.tensors[p + "self_attn.k_norm.weight"]))
    cached = cache.get(p) if cache is not None else None
    start = 0 if cached is None else cached[0].shape[-3]
    R = spec.rotary_dim
    q, k = W.act(_rope(q, spec.rope_theta, start, R)), W.act(_rope(k, spec.rope_theta, start, R))
    if W.kv_quant is not None:           # an FP8 KV cache: attention reads K and V back from it
        k, v = W.kv_quant(k, p, "k"), W.kv_quant(v, p, "v")
    if cached is not None:
        k, v = torch.cat([cached[0], k], -3), torch.cat([cached[1], v], -3)
    if cache is not None:
        cache[p] = (k, v)
    rep = nh // nkv
    k, v = k.repeat_interleave(rep, -2), v.repeat_interleave(rep, -2)
    att = torch.einsum("...thd,...shd->...hts", q, k) / D ** 0.5
    causal = torch.triu(torch.ones(T, k.shape[-3], dtype=torch.bool, device=x.device), start + 1)
    att = att.masked_fill(causal, float("-inf")).softmax(-1)
    o = W.act(torch.einsum("...hts,...shd->...thd", att, v).reshape(*lead, T, nh * D))
    if gate is not None:
        o = W.act(o * torch.sigmoid(gate))
    return W.linear(o, p + "self_attn.o_proj")


def _gated_delta_net(spec: ModelSpec, W: Weights, x, p):
    """Gated delta rule (Qwen3-Next / Qwen3.5 linear attention), recurrent form, one sequence at a time."""
    if x.dim() == 3:
        return torch.stack([_gated_delta_net(spec, W, xb, p) for xb in x])
    la = p + "linear_attn."
    T, Dh = x.shape[0], spec.linear_head_dim
    nk, nv, kd = spec.linear_num_k_heads, spec.linear_num_v_heads, spec.linear_key_dim
    qkv = W.linear(x, la + "in_proj_qkv")                       # [T, 2kd + vd]
    conv = _f32(W.tensors[la + "conv1d.weight"])               # [C, 1, K] depthwise, causal
    kern = conv.shape[-1]
    # the causal conv's output, the recurrence's output and the gated norm's are BF16 tensors in vLLM
    qkv = W.act(F.silu(F.conv1d(F.pad(qkv.t()[None], (kern - 1, 0)), conv, groups=conv.shape[0])[0].t()))
    q, k, v = qkv[:, :kd].view(T, nk, Dh), qkv[:, kd:2 * kd].view(T, nk, Dh), qkv[:, 2 * kd:].view(T, nv, Dh)
    z = W.linear(x, la + "in_proj_z").view(T, nv, Dh)
    beta = torch.sigmoid(W.linear(x, la + "in_proj_b"))       # [T, nv]
    dt_bias = _f32(W.tensors[la + "dt_bias"])
    g = -_f32(W.tensors[la + "A_log"]).exp() * F.softplus(W.linear(x, la + "in_proj_a") + dt_bias)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    q, k = q.repeat_interleave(nv // nk, 1) * Dh ** -0.5, k.repeat_interleave(nv // nk, 1)
    S = torch.zeros(nv, Dh, Dh, device=x.device)
    outs = []
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        # a row times S per head: bmm, not einsum("hkv,hk->hv"), which runs it on S's transpose, 8x slower on the CPU
        kv = torch.bmm(k[t][:, None], S)[:, 0]
        S = S + torch.einsum("hk,hv->hkv", k[t], (v[t] - kv) * beta[t][:, None])
        outs.append(torch.bmm(q[t][:, None], S)[:, 0])
    o = W.act(torch.stack(outs))                               # [T, nv, Dh]
    o = W.act(_rms(o, W.tensors[la + "norm.weight"], spec.rms_norm_eps) * F.silu(z))
    return W.linear(o.reshape(T, nv * Dh), la + "out_proj")


def _swiglu(W: Weights, x, p):
    return W.linear(W.act(F.silu(W.linear(x, p + "gate_proj")) * W.linear(x, p + "up_proj")), p + "down_proj")


def _moe(spec: ModelSpec, W: Weights, x, p):
    if x.dim() == 3:                                           # routing is per token: flatten the batch
        return _moe(spec, W, x.reshape(-1, x.shape[-1]), p).reshape(x.shape)
    logits = W.linear(x, p + "mlp.gate")                       # router, high precision
    probs = logits.softmax(-1)
    topv, topi = probs.topk(spec.top_k, -1)
    topv = topv / topv.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(spec.num_experts):
        rows, slot = (topi == e).nonzero(as_tuple=True)
        if rows.numel():
            out[rows] += topv[rows, slot, None] * _swiglu(W, x[rows], p + f"mlp.experts.{e}.")
    if spec.shared_expert_intermediate_size:
        sg = torch.sigmoid(W.linear(x, p + "mlp.shared_expert_gate"))
        out = out + sg * _swiglu(W, x, p + "mlp.shared_expert.")
    return W.act(out)


LM_HEAD_ROWS = 1 << 15        # vocabulary rows cast to fp32 at a time (the tiny models' vocabulary is one chunk)
LM_HEAD_DEVICE_ELEMS = 1 << 24   # on a GPU: a 64 MiB fp32 chunk (P1 beside the engines: 5 % of the payload)


def lm_head(xs: list[torch.Tensor], w: torch.Tensor) -> list[torch.Tensor]:
    """Logits of every sequence's final hidden states. Each vocabulary chunk of a BF16 head is cast once for all
    sequences; each sequence is still its own matmul per chunk."""
    rows = LM_HEAD_ROWS if w.device.type == "cpu" else max(1024, LM_HEAD_DEVICE_ELEMS // max(1, w.shape[-1]))
    if w.dtype == torch.float32 or w.shape[0] <= rows:
        wf = _f32(w)
        return [x @ wf.t() for x in xs]
    parts: list[list[torch.Tensor]] = [[] for _ in xs]
    for i in range(0, w.shape[0], rows):
        chunk = w[i:i + rows].float().t()
        for out, x in zip(parts, xs):
            out.append(x @ chunk)
    return [torch.cat(p, -1) for p in parts]


def _head(spec: ModelSpec, W: Weights) -> torch.Tensor:
    return W.tensors[spec.head_name]


def hidden_states(spec: ModelSpec, W: Weights, tokens, cache: dict | None = None) -> torch.Tensor:
    """fp32 final-norm hidden states: [T, hidden] for a token list, [B, T, hidden] for a LongTensor [B, T].
    `cache` (full-attention models only): a dict this call extends with every layer's keys and values, so a
    later call given only the next tokens continues the same sequences (a decoder's KV cache)."""
    if cache is not None and any(lt != "full_attention" for lt in spec.layer_types):
        raise ValueError(f"model {spec.name}: a KV cache needs full-attention layers only")
    x = _embed(spec, W, tokens)
    for i in range(spec.num_layers):
        x = _layer(spec, W, x, i, cache)
    return _final_norm(spec, W, x)


def _embed(spec: ModelSpec, W: Weights, tokens) -> torch.Tensor:
    emb = W.tensors[spec.embed_name]
    ids = (tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens)).to(emb.device)
    return W.act(_f32(emb[ids]))


def _layer(spec: ModelSpec, W: Weights, x: torch.Tensor, i: int, cache: dict | None = None) -> torch.Tensor:
    p, lt = spec.layer_prefix(i), spec.layer_types[i]
    h = W.act(_norm(spec, x, W.tensors[p + "input_layernorm.weight"]))
    x = W.act(x + (_attention(spec, W, h, p, cache) if lt == "full_attention" else _gated_delta_net(spec, W, h, p)))
    h = W.act(_norm(spec, x, W.tensors[p + "post_attention_layernorm.weight"]))
    return W.act(x + (_moe(spec, W, h, p) if spec.is_moe else _swiglu(W, h, p + "mlp.")))


def _final_norm(spec: ModelSpec, W: Weights, x: torch.Tensor) -> torch.Tensor:
    return W.act(_norm(spec, x, W.tensors[spec.final_norm_name]))


class LayerWindow(Mapping):
    """`tensors` read through a one-layer window: a value is computed (read from `tensors`) once and kept while the
    forward is in its layer, then dropped; tensors outside the layers (embeddings, final norm, head) are kept.
    Over a LazyMap that dequantizes on read, a layer-major forward then holds one layer's fp32 weights at a time
    (not three fp32 copies of every FP8 weight). `whole_layer=False`: only the last layer tensor read is kept (a
    forward of one batch reads each once: one fp32 weight at a time); `release` drops the layer's values (before
    the head)."""

    def __init__(self, tensors, whole_layer: bool = True):
        self._tensors, self._layer, self._held, self._whole = tensors, None, {}, whole_layer

    def release(self):
        self._held = {k: t for k, t in self._held.items() if self._layer_of(k) is None}
        self._layer = None

    @staticmethod
    def _layer_of(name: str):
        """The layer a tensor belongs to (its `...layers.N.` prefix); None outside the layers."""
        prefix = split_layer(name)[0]
        return prefix or None

    def __getitem__(self, name):
        v = self._held.get(name)
        if v is None:
            layer = self._layer_of(name)
            if layer is not None and (layer != self._layer or not self._whole):
                self.release()          # before the next value is made: one at a time at the peak
                self._layer = layer
            v = self._held[name] = self._tensors[name]
        return v

    def __contains__(self, name) -> bool:
        return name in self._tensors

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def logits(spec: ModelSpec, W: Weights, tokens, cache: dict | None = None) -> torch.Tensor:
    """fp32 logits: [T, vocab] for one sequence (a token list), [B, T, vocab] for a LongTensor [B, T]."""
    x = hidden_states(spec, W, tokens, cache)
    out = _scaled(W, lm_head([x.reshape(-1, x.shape[-1])], _head(spec, W))[0])
    return W.act(out).reshape(*x.shape[:-1], out.shape[-1])


def _scaled(W: Weights, lg: torch.Tensor) -> torch.Tensor:
    return lg if W.logit_scale == 1.0 else lg * W.logit_scale


def prompts_logprobs(spec: ModelSpec, W: Weights, prompts: list[list[int]], *,
                     layer_major: bool = False) -> list[torch.Tensor]:
    """`token_logprobs` of every prompt, the lm head read once for all of them. `layer_major`: every prompt through
    layer i before any enters layer i+1, weights read through a `LayerWindow` (each layer's weights computed once
    and dropped after it), prompts of one length as one batch [B, T] (a third of the launches for three prompts:
    on a GPU the probe forward is bound by launches and host round trips, not by its 36 tokens). Each batch row
    is the same sequence's operations, up to the GEMMs' accumulation order (a BLAS may sum a row in another order
    at another row count: bit-equal on some CPUs, float32 rounding apart on others). Only for stateless activation quantizers: a delayed-scaling state would see its calls in another
    order."""
    with torch.no_grad():
        if layer_major:
            groups: dict[int, list[int]] = {}
            for i, p in enumerate(prompts):
                groups.setdefault(len(p), []).append(i)
            window = LayerWindow(W.tensors, whole_layer=len(groups) > 1)
            W = replace(W, tensors=window)
            xs = [_embed(spec, W, torch.tensor([prompts[i] for i in ix])) for ix in groups.values()]
            for i in range(spec.num_layers):
                xs = [_layer(spec, W, x, i) for x in xs]
            window.release()
            xs = [_final_norm(spec, W, x) for x in xs]
            lgs: list = [None] * len(prompts)
            for ix, lg in zip(groups.values(), lm_head(xs, _head(spec, W))):
                for row, i in enumerate(ix):
                    lgs[i] = lg[row]
        else:
            lgs = lm_head([hidden_states(spec, W, p) for p in prompts], _head(spec, W))
        out = []
        for p, lg in zip(prompts, lgs):
            lp = W.act(_scaled(W, lg)).log_softmax(-1)
            out.append(lp[:-1].gather(-1, torch.tensor(p[1:], device=lp.device)[:, None])[:, 0])
    return out


def token_logprobs(spec: ModelSpec, W: Weights, tokens: list[int]) -> torch.Tensor:
    """log p(tokens[t+1] | tokens[:t+1]) for t in 0..T-2 (teacher forcing)."""
    return prompts_logprobs(spec, W, [tokens])[0]
