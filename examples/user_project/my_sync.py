"""A user's own weight sync, as an RL stack writes one: map names, decide which GEMMs go as FP8, quantize,
bucket, and hand checkpoint-format tensors to the engine's loader. Two versions: a correct one, and the bug the
field keeps shipping -- an exclusion list matched by substring, so `mlp.gate` (the MoE router) also catches
`mlp.gate_proj`, which then goes out as BF16 into an FP8 parameter."""
from fp8check import get_recipe

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


# -- from the learner's own tensors: Megatron-Core names, TE's padded FP8 workspaces --------------------------------
RENAME = {"self_attention.linear_proj": "self_attn.o_proj", "self_attention.q_layernorm": "self_attn.q_norm",
          "self_attention.k_layernorm": "self_attn.k_norm", "mlp.linear_fc2": "mlp.down_proj"}


def _unpad(scale_inv, rows, cols, block=128):
    """TE stores blockwise scales padded to a multiple of 4 columns; the checkpoint grid is unpadded."""
    return scale_inv[: -(-rows // block), : -(-cols // block)].contiguous()


def megatron_sync(num_heads, num_kv_heads, head_dim, deinterleave=True, bucket_per_layer=True):
    """A sync from Megatron-Core's own tensors, as a user writes one for a Qwen3 dense model: rename, split
    `linear_qkv` (interleaved per query group: [q heads of group g, k_g, v_g]) and `linear_fc1` (gate | up),
    cut TE's padded scale layout to the unpadded grid, one bucket per decoder layer. `deinterleave=False` is the
    bug of reading `linear_qkv` as [Q; K; V]."""
    hpg = num_heads // num_kv_heads

    def split_rows(t, parts):                      # parts: [(hf name, rows)] in the tensor's row order
        out, row = {}, 0
        for name, n in parts:
            out.setdefault(name, []).append(t[row:row + n])
            row += n
        return {k: v[0] if len(v) == 1 else __import__("torch").cat(v) for k, v in out.items()}

    def qkv_parts(h, unit):                        # unit: rows per head (codes) or per head in blocks (scales)
        if not deinterleave:
            return [(h + "q_proj", num_heads * unit), (h + "k_proj", num_kv_heads * unit),
                    (h + "v_proj", num_kv_heads * unit)]
        return [p for _ in range(num_kv_heads)
                for p in ((h + "q_proj", hpg * unit), (h + "k_proj", unit), (h + "v_proj", unit))]

    def sync(weights, masters, load):
        layers = {}
        for name, t in weights.items():
            if name.endswith("_scale_inv"):
                continue
            scale = weights.get(name + "_scale_inv")
            hf, layer = None, -1
            if name == "embedding.word_embeddings.weight":
                hf = {"model.embed_tokens.weight": t}
            elif name == "decoder.final_layernorm.weight":
                hf = {"model.norm.weight": t}
            elif name == "output_layer.weight":
                hf = {"lm_head.weight": t}
            else:
                _, _, i, rest = name.split(".", 3)
                layer, h = int(i), f"model.layers.{i}."
                mod, leaf = rest.rsplit(".", 1)
                if leaf == "layer_norm_weight":
                    hf = {h + ("input_layernorm" if "linear_qkv" in mod else "post_attention_layernorm") + ".weight": t}
                elif mod in RENAME:
                    hf = {h + RENAME[mod] + "." + leaf: t}
                    if scale is not None:
                        hf[h + RENAME[mod] + ".weight_scale_inv"] = _unpad(scale, *t.shape)
                else:
                    a = h + ("self_attn." if "linear_qkv" in mod else "mlp.")
                    blocks = head_dim // 128 if scale is not None else None
                    if "linear_qkv" in mod:
                        parts, sparts = qkv_parts(a, head_dim), qkv_parts(a, blocks) if blocks else None
                    else:
                        half = t.shape[0] // 2
                        parts = [(a + "gate_proj", half), (a + "up_proj", half)]
                        sparts = [(a + "gate_proj", half // 128), (a + "up_proj", half // 128)] if blocks else None
                    hf = {k + ".weight": v for k, v in split_rows(t, parts).items()}
                    if scale is not None:
                        s = _unpad(scale, *t.shape)
                        hf.update({k + ".weight_scale_inv": v for k, v in split_rows(s, sparts).items()})
            layers.setdefault(layer if bucket_per_layer else 0, {}).update(hf)
        for _, bucket in sorted(layers.items()):
            load(list(bucket.items()))
    return sync
