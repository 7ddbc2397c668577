"""The serving side of the CPU reference rollout: a mirror of what vLLM 0.26 serves with beside the weights
(read in its source, /work notes in docs/design.md "The engine as RL stacks run it"):

* KV-cache scales: with `quantization=fp8` every attention layer holds four fp32 0-d buffers `_k_scale`,
  `_v_scale`, `_q_scale`, `_prob_scale`. A dummy boot randomizes the (bf16, -1.0-initialized) scale parameters to
  one value x ~ U(-1e-3, 1e-3) per tensor, seed 1234; post-load then keeps x when x > 0 and uses 1.0 when x < 0
  (model_executor/layers/quantization/kv_cache.py). A reload that sends no scale tensors leaves them as they are.
  fp8check's adapter pins them to the declared rollout.kv_scale after boot and every wake (as SkyRL does).
* Graph-visible storage: captured CUDA graphs read raw pointers -- parameters, buffers (the shared rotary
  `cos_sin_cache`, the KV scales), the KV cache. The mirror watches parameters and buffers.
* Sleep mode: level 1 offloads the weights and restores them byte for byte on wake; level 2 discards them (only
  named buffers are saved and restored), so the weights are garbage until the next sync. Sleep clears the prefix
  cache; a weight sync does not (fp8check's adapter resets it after every install).
* Prefix cache: a repeated prompt reuses cached state; here, the greedy outputs computed under the weights of the
  time (what a stale cache serves after a sync that did not reset it).
"""
from __future__ import annotations

from copy import copy

import torch

from ...digest import state_digest
from ...formats.bytes import poison_
from ...layouts import rank_name
from ...layouts.vllm import vllm_name
from ...record import KVScale, Outputs, ServingState
from ..sleepwake import SleepWake, Sleeps
from ...memo import Memo

# reference forwards (prompt log-probs, greedy decodes) by the content of the engine state they read
FORWARDS = Memo(64 << 20)

SCALES = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")


def attention_layers(spec) -> list[str]:
    """The engine's attention layers (vLLM names: `model.layers.N.self_attn.attn`, a Qwen3.5 wrapper's
    `language_model.model.layers.N.self_attn.attn`)."""
    return [vllm_name(spec, f"{spec.layer_prefix(i)}self_attn.attn") for i, lt in enumerate(spec.layer_types)
            if lt == "full_attention"]


def rotary_buffer(spec) -> str:
    """The first attention layer's rotary cache (a buffer the captured graphs read)."""
    return attention_layers(spec)[0].removesuffix(".attn") + ".rotary_emb.cos_sin_cache"


class ServingMirror(Sleeps):
    """Mixed into ReferenceRollout: buffers, KV scales, sleep/wake, greedy decoding with a prefix cache."""

    def _init_serving(self, seed: int):
        cfg = self.config
        spec = cfg.spec
        self.buffers: list[dict[str, torch.Tensor]] = []
        for _ in range(self.tp):
            b = {rotary_buffer(spec): torch.zeros((1024, spec.head_dim), dtype=torch.bfloat16)}
            for layer in attention_layers(spec):
                for s in SCALES:
                    b[f"{layer}.{s}"] = torch.tensor(1.0, dtype=torch.float32)
            self.buffers.append(b)
        self._boot_kv_scales(seed)
        self.boot_kv_scales = self.kv_scales()
        if self._pins_kv:
            self.pin_kv_scales(cfg.rollout.kv_scale)
        self._watched = {**self._ptrs(), **self._buffer_ptrs()}   # what the captured graphs read
        self.sleepwake = SleepWake()
        self._prefix_cache: dict = {}
        self.outputs: Outputs | None = None
        self.logit_scale = 1.0                                 # vLLM LogitsProcessor.scale

    def _boot_kv_scales(self, seed: int):
        """vLLM's dummy boot then `BaseKVCacheMethod.process_weights_after_loading`."""
        x = float(torch.empty((), dtype=torch.bfloat16).uniform_(-1e-3, 1e-3, generator=torch.Generator()
                                                                  .manual_seed(seed)))
        v = x if x > 0 else 1.0
        for b in self.buffers:
            for n, t in b.items():
                if n.rsplit(".", 1)[1] in SCALES:
                    t.fill_(v)

    @property
    def _pins_kv(self) -> bool:
        """A uniform KV scale is pinned by the adapter after boot and every wake; calibrated ones come with syncs."""
        return self.config.rollout.pin_kv_scales and not self.config.calibrated_kv

    def _load_kv_scale(self, name: str, value: torch.Tensor):
        """A calibrated scale (`model.layers.N.self_attn.k_scale`) into every rank's kernel buffer
        (`...self_attn.attn._k_scale`, the engine's name), as vLLM's KV-cache post-load copies the loaded scale into
        it."""
        layer, which = vllm_name(self.config.spec, name).rsplit(".", 1)
        for b in self.buffers:
            b[f"{layer}.attn._{which}"].fill_(float(value))

    def _buffer_ptrs(self) -> dict[str, int]:
        return {rank_name(n, r, self.tp): t.data_ptr() for r, b in enumerate(self.buffers) for n, t in b.items()}

    # -- KV scales ------------------------------------------------------------------------------------------
    def kv_scales(self) -> dict[str, KVScale]:
        out = {}
        for r, b in enumerate(self.buffers):
            for layer in attention_layers(self.config.spec):
                out[rank_name(layer, r, self.tp)] = KVScale(*(float(b[f"{layer}.{s}"]) for s in SCALES))
        return out

    def set_kv_scales(self, values: dict):
        """Every attention layer's KV-cache scales named in `values` ({"k": 1.0, ...}), on every rank."""
        names = {f"_{which}_scale": float(v) for which, v in values.items()}
        for b in self.buffers:
            for n, t in b.items():
                leaf = n.rsplit(".", 1)[1]
                if leaf in names:
                    t.fill_(names[leaf])

    def pin_kv_scales(self, value: float):
        self.set_kv_scales({which: value for which in ("k", "v", "q", "prob")})

    def _after_reload(self):
        """The end of an install: buffers stay where the graphs read them, the prefix cache is reset (fp8check's
        adapter does it after every install), the sampler's logits are unscaled, the last wake counts the sync."""
        self._prefix_cache.clear()
        self.logit_scale = 1.0
        self.sleepwake.synced()

    # -- sleep / wake ---------------------------------------------------------------------------------------
    def sleep(self, level: int = 1):
        self.sleepwake.begin_sleep(level, self.state_digests, self.kv_scales)
        self._saved_buffers = [{n: t.clone() for n, t in b.items()} for b in self.buffers]
        self._prefix_cache.clear()                             # LLM.sleep clears the prefix cache
        self.sleepwake.slept(level)

    def wake(self, kv_scales: dict | None = None):
        """`kv_scales` (a fault, fp8check's own engines only): the wake leaves these KV-cache scales ({"k": 0.0},
        {"k": 1.0, "v": 1.0}) in every attention layer, as the engine bugs it mirrors do."""
        self.sleepwake.begin_wake()
        level = self.sleepwake.awake()
        if level == 2:                                         # weights discarded, buffers restored
            for params in self._graph:
                for t in params.values():
                    poison_(t)
            for b, saved in zip(self.buffers, self._saved_buffers):
                for n, t in b.items():
                    t.copy_(saved[n])
        self.set_kv_scales(kv_scales or {})
        after = self.state_digests()
        if self._pins_kv:
            self.pin_kv_scales(self.config.rollout.kv_scale)
        self.sleepwake.woke(level, after, self.kv_scales())

    def _note_generation(self):
        self.sleepwake.note_generation()
        self.sleepwake.refuse_if_asleep("generation")

    # -- serving ----------------------------------------------------------------------------------------------
    def greedy(self, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
        """Greedy decoding of the engine's kernel tensors (temperature-0 `sample`, which reads a KV cache where
        the model allows); a repeated prompt hits the prefix cache."""
        from ...numerics.sampling import sample
        self._note_generation()
        keys = [(tuple(p), max_tokens) for p in prompts]
        todo = {}                          # prompts neither in this engine's prefix cache nor decoded before
        state = None                       # the engine-state part of the key: digested once per call
        for key in keys:
            if key not in self._prefix_cache and key not in todo:
                state = state or self.forward_key()
                fkey = state + ("greedy", *key)
                hit = FORWARDS.lookup(fkey)
                if hit is None:
                    todo[key] = fkey
                else:
                    self._prefix_cache[key] = hit.tolist()
        if todo:                           # one batched decode per prompt length (rows are independent)
            W = self._forward_weights()
            by_len: dict = {}
            for key in todo:
                by_len.setdefault(len(key[0]), []).append(key)
            for group in by_len.values():
                toks = sample(self.config.spec, W, [list(k[0]) for k in group], 1, max_tokens, temperature=0.0).tokens
                for key, row in zip(group, toks):
                    self._prefix_cache[key] = FORWARDS.put(todo[key], row.clone()).tolist()
        return [list(self._prefix_cache[key]) for key in keys]

    def measure_outputs(self, prompts: list[list[int]], max_tokens: int = 8) -> Outputs:
        """Greedy outputs and prompt log-probs on fixed prompts, kept in the record (the differential's input); both
        forwards read the weights dequantized once."""
        with self._weights_held():
            g = self.greedy(prompts, max_tokens)
            lp = [[float(x) for x in t] for t in self.generate_logprobs(prompts)]
        self.outputs = Outputs(g, lp)
        return self.outputs

    def serving_state(self) -> ServingState:
        now = {**self._ptrs(), **self._buffer_ptrs()}
        return ServingState(cuda_graphs=self.config.rollout.cuda_graphs, kv_cache_dtype=self.config.rollout.kv_cache_dtype,
                            kv_scales=self.kv_scales(), boot_kv_scales=self.boot_kv_scales, graph_storage=len(self._watched),
                            graph_storage_moved=sorted(n for n, p in self._watched.items() if now.get(n) != p),
                            sleep_level=self.sleep_level, wake=copy(self.wake_event), outputs=self.outputs)

    def serving_digest(self) -> str:
        """Digest of every buffer (the cold-vs-warm differential compares them too)."""
        return state_digest(torch.cat([t.reshape(-1).float() for b in self.buffers for t in b.values()]))
