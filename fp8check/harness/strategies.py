"""Hypothesis strategies for fuzzing FP8 sync code (fp8check's own tests use them; so can yours).

    from hypothesis import given
    from fp8check import strategies as fst

    @given(fst.weights(), fst.recipes())
    def test_my_sender_keeps_trainer_bytes(w, recipe): ...

Strategies: `shapes`, `weights` (wide dynamic range, zero / NaN / inf / subnormal blocks), `recipes`,
`model_specs` (small tiny-model variants whose GEMM dims stay block-aligned), `sync_configs`, `fault_params`.
Hypothesis is an extra (`pip install 'fp8check[strategies]'`); without it importing this module is one line saying so.
"""
from __future__ import annotations

try:
    from hypothesis import strategies as st
except ImportError:
    raise ImportError("fp8check.strategies needs Hypothesis: pip install 'fp8check[strategies]'") from None
import torch

from .config import RolloutConfig, SyncConfig
from .formats import RECIPES, get_recipe
from .models import ModelSpec, register_model

__all__ = ["shapes", "weights", "recipes", "model_specs", "sync_configs", "fault_params"]


def shapes(max_side: int = 300, min_side: int = 1):
    """2D shapes, often not multiples of 128 (partial edge blocks)."""
    side = st.one_of(st.integers(min_side, max_side), st.sampled_from([128, 129, 256, 127, 1, 255]))
    return st.tuples(side, side)


@st.composite
def weights(draw, shape=None, dtypes=(torch.bfloat16, torch.float32, torch.float16)):
    """A weight tensor with per-block magnitudes from subnormal to huge, and special blocks."""
    n, k = draw(shape if shape is not None else shapes(260))
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, k), generator=g)
    lo, hi = {torch.float16: (-6, 4), torch.bfloat16: (-30, 30), torch.float32: (-30, 30)}[dtype]
    gn, gk = -(-n // 128), -(-k // 128)
    mag = 10.0 ** torch.empty((gn, gk)).uniform_(lo, hi, generator=g)
    x = x * mag.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    special = draw(st.sampled_from(["none", "zero_block", "nan", "inf", "subnormal", "near448", "exact448"]))
    if special == "zero_block":
        x[:128, :128] = 0
    elif special == "nan":
        x[draw(st.integers(0, n - 1)), draw(st.integers(0, k - 1))] = float("nan")
    elif special == "inf":
        x[draw(st.integers(0, n - 1)), draw(st.integers(0, k - 1))] = draw(st.sampled_from([float("inf"), -float("inf")]))
    elif special == "subnormal":
        x = x.sign() * torch.finfo(torch.float32).tiny / draw(st.sampled_from([2.0, 7.0, 1000.0]))
    elif special == "near448":
        x = x / x.abs().amax().clamp(min=1e-30) * draw(st.sampled_from([447.9, 448.0, 448.1, 464.0]))
    elif special == "exact448":
        x[0, 0] = 448.0
    finfo = torch.finfo(dtype)
    x = torch.where(torch.isfinite(x), x.clamp(-finfo.max, finfo.max), x)
    return x.to(dtype)


def recipes(names=tuple(RECIPES)):
    return st.sampled_from(list(names)).map(get_recipe)


_SPECS: dict = {}


@st.composite
def model_specs(draw):
    """Small dense / MoE specs (1-2 layers, dims multiples of 128), registered under a derived name."""
    moe = draw(st.booleans())
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]))
    hidden = draw(st.sampled_from([128, 256]))
    inter = draw(st.sampled_from([128, 256]))
    layers = draw(st.integers(1, 2))
    kw = dict(vocab_size=256, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
              head_dim=128, intermediate_size=inter, qk_norm=draw(st.booleans()))
    if moe:
        kw.update(num_experts=draw(st.sampled_from([2, 4])), top_k=1, moe_intermediate_size=128,
                  shared_expert_intermediate_size=draw(st.sampled_from([0, 128])),
                  default_exclude=("mlp.gate", "mlp.shared_expert_gate"),
                  engine_high_precision=("mlp.shared_expert_gate",))
    name = "gen-" + "-".join(f"{k}{v}" for k, v in sorted(kw.items()) if not isinstance(v, tuple))
    if name not in _SPECS:
        _SPECS[name] = register_model(ModelSpec(name, "Generated", "generated", **kw))
    return _SPECS[name]


@st.composite
def sync_configs(draw, specs=None):
    """A configuration that should sync cleanly: recommended engine settings for the recipe."""
    spec = draw(specs if specs is not None else model_specs())
    recipe = draw(recipes())
    tp = draw(st.sampled_from([t for t in (1, 2) if spec.num_kv_heads % t == 0 and spec.hidden_size // t >= 128
                               and spec.intermediate_size // t >= 128 and spec.num_heads % t == 0
                               and (not spec.is_moe or spec.moe_intermediate_size // t >= 128)
                               and (not spec.shared_expert_intermediate_size
                                    or spec.shared_expert_intermediate_size // t >= 128)]))
    return SyncConfig(model=spec.name, recipe=recipe, gpu_arch=recipe.native_arch,
                      rollout=RolloutConfig(tp_size=tp, moe_backend=draw(st.sampled_from(["triton", "deep_gemm"]))),
                      seed=draw(st.integers(0, 3)))


def fault_params():
    """Which tensor / element / bit a parameterised fault hits."""
    return st.fixed_dictionaries({"index": st.integers(0, 50), "element": st.integers(0, 10 ** 6),
                                  "bit": st.integers(0, 31)})
