"""A user's own weight sync, as an RL stack writes one: map names, decide which GEMMs go as FP8, quantize,
bucket, and hand checkpoint-format tensors to the engine's loader. Two versions: a correct one, and the bug the
field keeps shipping -- an exclusion list matched by substring, so `mlp.gate` (the MoE router) also catches
`mlp.gate_proj`, which then goes out as BF16 into an FP8 parameter."""
from harness.formats import get_recipe

RECIPE = get_recipe("blockwise-fp32")
KEEP_BF16 = ("mlp.gate", "mlp.shared_expert_gate", "norm", "embed_tokens", "lm_head")   # routers stay BF16


def _sync(weights, masters, load, is_excluded, bucket=8):
    items = []
    for name, w in masters.items():
        module = name.rsplit(".", 1)[0]
        if is_excluded(name, module) or w.dim() != 2:
            items.append((name, w))
        else:
            q, s = RECIPE.quantize_weight(w)         # TE's blockwise rule on the BF16 weight: the learner's bytes
            items += [(name, q), (name + "_scale_inv", s)]
    for i in range(0, len(items), bucket):
        load(items[i:i + bucket])


def sync_correct(weights, masters, load):
    _sync(weights, masters, load, lambda name, module: any(module == p or module.endswith("." + p) for p in KEEP_BF16)
          or any(k in name for k in ("norm", "embed_tokens", "lm_head")))


def sync_substring_bug(weights, masters, load):
    _sync(weights, masters, load, lambda name, module: any(p in name for p in KEEP_BF16))
