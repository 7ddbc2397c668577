"""Live trainer adapter: a Megatron-Core GPTModel with the Transformer Engine layer spec, in the precision the
config's `trainer.precision` names: TE's blockwise recipe (`fp8`), TE's per-tensor delayed scaling as Megatron-Core
runs `fp8_recipe="delayed"` (`fp8-delayed`), or BF16 (`bf16`).

The learner's FP8 forward weights are read from TE's own quantized tensors -- the weight workspaces a forward
with `is_first_microbatch=True` caches (`_fp8_workspaces["weight"]`, `"weight{i}"` for grouped experts), or the
parameters themselves with persistent FP8 parameters (`fp8_param`) -- never re-quantized by fp8check. TE stores
scale_inv padded to a multiple of 4 K-blocks; `te_to_wire` crops it to the unpadded grid. Under delayed scaling the
workspace is a `Float8Tensor` (`_data`, one `_scale_inv` [1]: the scale the cast used, set at the previous training
forward's autocast exit), and a forward fp8check runs only to read (`fp8_forward_weights`, `logprobs`) leaves the
amax history and scales as they were: TE max-accumulates every forward's amax into the next update.

Masters: the adapter loads the same deterministic masters as the CPU reference trainer (`megatron_masters`) so the two
can be compared byte for byte (conformance). `NVTE_FP8_BLOCK_SCALING_FP32_SCALES` is read when Transformer
Engine is imported, so the process must be started with it set (the Ray worker's runtime_env does that).
"""
from __future__ import annotations

import os
import socket

import torch

from ..config import TRAINER_PRECISIONS, SyncConfig
from ..formats import te_to_wire
from ..layouts import scale_name
from ..kinds import ScaleFormat
from ..record import TrainerRecord
from .cpu.masters import device_masters, kv_calibration
from .cpu.trainer import act_quant_kind, is_fp8_gemm, masters_hf, megatron_masters


def trainer_env(config: SyncConfig) -> dict[str, str]:
    fp32 = config.trainer_recipe.scale_format == ScaleFormat.FP32
    return {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1" if fp32 else "0",
            "NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def te_quantize_blockwise(x: torch.Tensor, *, pow2: bool, amax_epsilon: float = 0.0, block_scaling_dim: int = 2):
    """Transformer Engine's Float8BlockQuantizer on a CUDA tensor -> (codes, scale_inv wire grid,
    columnwise codes [K, N], columnwise scale_inv wire grid of the transposed data, raw TE rowwise scale)."""
    import transformer_engine.pytorch  # noqa: F401 - loads the extension; importing it first fails (H200 bench)
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    q = Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=True, amax_epsilon=amax_epsilon,
                             force_pow_2_scales=pow2, block_scaling_dim=block_scaling_dim)
    t = q(x)
    n, k = x.shape
    codes = t._rowwise_data.view(torch.float8_e4m3fn).cpu()
    raw = t._rowwise_scale_inv.cpu()
    s = te_to_wire(raw, (n, k), block_dim=block_scaling_dim)
    ccodes = t._columnwise_data.view(torch.float8_e4m3fn).cpu() if t._columnwise_data is not None else None
    cs = te_to_wire(t._columnwise_scale_inv.cpu(), (n, k), block_dim=block_scaling_dim, columnwise=True) \
        if t._columnwise_scale_inv is not None else None
    return codes, s, ccodes, cs, raw


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_te_fp8(t) -> bool:
    """A TE quantized tensor: blockwise (`_rowwise_data`) or delayed/current per-tensor (`Float8Tensor._data`)."""
    return getattr(t, "_rowwise_data", None) is not None or (
        getattr(t, "_data", None) is not None and getattr(t, "_scale_inv", None) is not None)


def _from_te(t, shape, device="cpu"):
    # always a copy: TE re-quantizes into the same workspace on the next forward
    if getattr(t, "_rowwise_data", None) is None:              # Float8Tensor: one fp32 scale_inv for the tensor
        codes = t._data.view(torch.float8_e4m3fn).reshape(shape).to(device, copy=True)
        return codes, t._scale_inv.reshape(1).to(device=device, dtype=torch.float32, copy=True)
    codes = t._rowwise_data.view(torch.float8_e4m3fn).reshape(shape).to(device, copy=True)
    return codes, te_to_wire(t._rowwise_scale_inv.to(device, copy=True), tuple(shape), block_dim=2)


def _fp8_meta_states(model) -> list:
    """Every TE delayed-scaling state tensor of the model (per module, forward and backward) as (attribute,
    tensor): its scale and amax history, which TE's fused update writes in place."""
    out = []
    for mod in model.modules():
        meta = getattr(mod, "fp8_meta", None)
        if not isinstance(meta, dict):
            continue
        for key in ("scaling_fwd", "scaling_bwd"):
            st = meta.get(key)
            for attr in ("scale", "amax_history"):
                t = getattr(st, attr, None)
                if torch.is_tensor(t):
                    out.append((attr, t))
    return out


class kept_fp8_state:
    """A forward that only reads (export, probes) leaves TE's delayed-scaling state as it found it: without this an
    inference forward's amaxes (the probe prompts' activations) would max-accumulate into the next training
    forward's scale update. A state the read forward created (TE makes them at a module's first FP8 forward) is
    left as TE creates it: scale 1, amax history 0."""

    def __init__(self, model, enabled: bool):
        self.model, self.enabled = model, enabled

    def __enter__(self):
        self.saved = {id(t): (t, t.clone()) for _, t in _fp8_meta_states(self.model)} if self.enabled else {}
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        with torch.no_grad():
            for attr, t in _fp8_meta_states(self.model):
                if id(t) in self.saved:
                    t.copy_(self.saved[id(t)][1])
                else:
                    t.fill_(1.0 if attr == "scale" else 0.0)
        return False


def megatron_fp8_weights(model, layout, device="cpu", fp8=None) -> tuple[dict, dict]:
    """The learner's FP8 forward weights of any Megatron-Core model with the TE layer spec (fp8check's trainer or a
    user's, after a forward under an FP8 recipe): Megatron-named codes + `_scale_inv` (the unpadded wire grid;
    [1] under delayed scaling) read from Transformer Engine's weight workspaces (or persistent FP8 parameters),
    never re-quantized; BF16 for every other parameter. `fp8`: the Megatron tensors the learner runs in FP8
    (default the layout's FP8 set; empty for a BF16 learner). Returns (tensors, where each FP8 weight came from)."""
    fp8 = layout.fp8_megatron if fp8 is None else fp8
    params = dict(model.named_parameters())
    out, source = {}, {}
    for mname, mod in model.named_modules():
        ws = getattr(mod, "_fp8_workspaces", None) or {}
        for key, t in ws.items():
            if not key.startswith("weight") or not _is_te_fp8(t):
                continue
            pname = f"{mname}.{key}"
            if pname in fp8:
                out[pname], out[scale_name(pname)] = _from_te(t, params[pname].shape, device)
                source[pname] = "workspace"
    for n, p in params.items():
        if n in out:
            continue
        if n in fp8:
            if _is_te_fp8(p):                                     # persistent FP8 parameter
                out[n], out[scale_name(n)] = _from_te(p, p.shape, device)
                source[n] = "fp8_param"
            else:
                raise RuntimeError(f"{n}: no FP8 weight found in Transformer Engine's workspaces (run a forward "
                                   f"under the FP8 recipe first)")
        else:
            out[n] = p.detach().to(device=device, dtype=torch.bfloat16, copy=True)
    return out, source


class MegatronTrainer:
    engine = "megatron-core+transformer-engine"
    precisions = TRAINER_PRECISIONS          # it runs every trainer.precision

    def __init__(self, config: SyncConfig, seed: int = 1234, lr: float = 1e-3, betas: tuple = (0.9, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.0, max_grad_norm: float | None = 1.0):
        """`lr`, `betas`, `eps`, `weight_decay`, `max_grad_norm`: the RL update's AdamW (`train_step`, as the CPU
        learner's); `optimizer_step` is the deterministic stand-in update the conformance tests compare with the
        CPU reference."""
        if "linear_attention" in config.spec.layer_types:
            from .protocol import EngineError
            raise EngineError(f"model {config.model}: this adapter builds GPTModel with the TE layer spec, which has "
                              f"no gated delta-net layer; use the cpu-reference trainer")
        torch.set_num_threads(4)
        self.hparams = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        self.max_grad_norm = max_grad_norm
        want = trainer_env(config)["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"]
        if os.environ.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0") != want:
            raise RuntimeError(f"NVTE_FP8_BLOCK_SCALING_FP32_SCALES must be {want} in this process before "
                               f"Transformer Engine is imported (start the worker with trainer_env(config))")
        import torch.distributed as dist
        import torch.nn.functional as F
        from megatron.core import parallel_state
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.transformer_config import TransformerConfig
        self.config = config
        self.layout = config.layout
        spec = config.spec
        torch.cuda.set_device(0)
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(_free_port())
            dist.init_process_group("nccl", rank=0, world_size=1)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        model_parallel_cuda_manual_seed(seed)
        kw = dict(num_layers=spec.num_layers, hidden_size=spec.hidden_size, ffn_hidden_size=spec.intermediate_size,
                  num_attention_heads=spec.num_heads, num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim,
                  normalization="RMSNorm", layernorm_epsilon=spec.rms_norm_eps, qk_layernorm=spec.qk_norm,
                  gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
                  hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
                  apply_rope_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
                  masked_softmax_fusion=False, gradient_accumulation_fusion=False)
        self.delayed = config.delayed_scaling is not None
        if config.trainer_fp8_tensors:     # a BF16 learner, or a config whose every GEMM is excluded, trains in BF16
            kw.update(fp8="e4m3", fp8_recipe="delayed" if self.delayed else "blockwise",
                      fp8_param=config.trainer.fp8_param)
            if self.delayed:               # Megatron-Core's TEDelayedScaling reads these three
                t = config.trainer
                kw.update(fp8_margin=t.margin, fp8_amax_history_len=t.amax_history_len,
                          fp8_amax_compute_algo=t.amax_compute_algo)
        if spec.is_moe:
            kw.update(num_moe_experts=spec.num_experts, moe_router_topk=spec.top_k,
                      moe_ffn_hidden_size=spec.moe_intermediate_size, moe_grouped_gemm=True,
                      moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                      moe_token_dispatcher_type="alltoall", moe_router_padding_for_fp8=True,
                      moe_router_pre_softmax=False)
            if spec.shared_expert_intermediate_size:
                kw.update(moe_shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
                          moe_shared_expert_gate=True)
        self.tcfg = TransformerConfig(**kw)
        layer_spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=spec.num_experts or None, moe_grouped_gemm=spec.is_moe, qk_layernorm=spec.qk_norm)
        self.model = GPTModel(config=self.tcfg, transformer_layer_spec=layer_spec, vocab_size=spec.vocab_size,
                              max_sequence_length=1024, position_embedding_type="rope",
                              rotary_base=int(spec.rope_theta),
                              share_embeddings_and_output_weights=spec.tie_word_embeddings).cuda()
        names = {n for n, _ in self.model.named_parameters()}
        missing = sorted(set(self.layout.megatron_shapes) - names)
        if missing:
            raise RuntimeError(f"Megatron model lacks parameters the layout map expects: {missing[:5]}")
        self.step = 0
        self.load_masters(0)

    # -- weights -----------------------------------------------------------------------------------------------
    def load_masters(self, step: int):
        if self.config.trainer.device:
            self.masters = device_masters(self.layout, self.config.seed, step,
                                          prev=getattr(self, "masters", None) if step else None)
            masters = self.masters
        else:
            masters = megatron_masters(self.config.model, self.config.seed, step)
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                src = masters[n].to("cuda")
                if hasattr(p, "quantize_"):              # persistent FP8 parameter: TE quantizes from fp32
                    p.quantize_(src)
                else:
                    p.copy_(src.to(p.dtype))
        self._fresh = False

    def optimizer_step(self) -> int:
        """Advance to the next deterministic masters (the CPU reference's step), after a real forward/backward
        under FP8 (the gradients prove the learner runs; the update itself is the reference's)."""
        self.last_loss = self.train_forward_backward()
        self.step += 1
        self.load_masters(self.step)
        return self.step

    def _forward(self, tokens: torch.Tensor, labels=None):
        pos = torch.arange(tokens.shape[1], device="cuda")[None].expand(tokens.shape[0], -1)
        self.model.set_is_first_microbatch()            # re-quantize and re-cache the FP8 weights
        return self.model(input_ids=tokens, position_ids=pos, attention_mask=None, labels=labels)

    def train_forward_backward(self) -> float:
        g = torch.Generator().manual_seed(self.step)
        tokens = torch.randint(0, self.config.spec.vocab_size, (2, 64), generator=g).cuda()
        self.model.train()
        loss = self._forward(tokens, labels=tokens).float().mean()
        loss.backward()
        self.model.zero_grad(set_to_none=True)
        self._fresh = True
        return float(loss)

    def fp8_forward_weights(self) -> dict:
        """Megatron-named codes + `_scale_inv` (wire grid) from TE's own quantized tensors; BF16 elsewhere."""
        if not self._fresh:
            with torch.no_grad(), kept_fp8_state(self.model, self.delayed):
                self.model.eval()
                self._forward(torch.zeros(1, 64, dtype=torch.long, device="cuda"))
            self._fresh = True
        fp8 = frozenset(n for n in self.layout.fp8_megatron if is_fp8_gemm(self.config, n))
        out, self.sources = megatron_fp8_weights(self.model, self.layout,
                                                 device="cuda" if self.config.trainer.device else "cpu", fp8=fp8)
        return out

    def export_hf(self) -> dict:
        """The FP8 forward bytes read from TE's workspaces, and the job's calibrated KV-cache scales (the same
        calibration the reference trainer holds) where the config has them."""
        return {**self.layout.megatron_to_hf(self.fp8_forward_weights(), with_scales=self.config.trainer_fp8),
                **kv_calibration(self.config, self.step)}

    # -- the RL loop's update (e2e/rl/engines.py RLTrainer.train_step) -------------------------------------------
    def train_step(self, batch: dict, loss) -> dict:
        """One RL update on the FP8 policy: the per-target log-probs of `batch["sequences"]` from the learner's own
        FP8 forward (TE re-quantizes the BF16 weights: exactly the bytes `export_hf` returns), `loss`, backward,
        gradient clipping (norm 1.0), one AdamW step on fp32 masters, copied into the BF16 parameters."""
        import torch.nn.functional as F
        from .cpu.learner import adamw_step
        seqs = batch["sequences"].cuda()
        T = seqs.shape[1]
        inp = F.pad(seqs, (0, (-T) % 64))               # FP8 GEMMs want token counts in multiples of 16
        if getattr(self, "_rl", None) is None:
            masters = {n: m.detach().to("cuda", torch.float32, copy=True) for n, m in
                       (self.masters.items() if self.config.trainer.device
                        else megatron_masters(self.config.model, self.config.seed, self.step).items())}
            self._rl = {"masters": masters, "state": [(torch.zeros_like(m), torch.zeros_like(m))
                                                      for m in masters.values()], "t": 0}
        self.model.train()
        self.model.zero_grad(set_to_none=True)
        logits = self._forward(inp)[:, : T - 1].float()
        lp_all = (logits / batch["temperature"]).log_softmax(-1)
        lp = lp_all.gather(-1, seqs[:, 1:, None])[..., 0]
        with torch.no_grad():
            entropy = -(lp_all.exp() * lp_all).sum(-1)
        dev = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
        value, stats = loss(lp, entropy, dev)
        value.backward()
        params = dict(self.model.named_parameters())
        masters = self._rl["masters"]
        grads = []
        for n, m in masters.items():
            p = params[n]
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            m.grad = torch.zeros_like(m) if g is None else g.detach().float()
            grads.append(m.grad)
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        scale = min(1.0, self.max_grad_norm / (float(norm) + 1e-6)) if self.max_grad_norm else 1.0
        for g in grads:
            g.mul_(scale)
        self._rl["t"] += 1
        adamw_step(list(masters.values()), self._rl["state"], self._rl["t"], **self.hparams)
        with torch.no_grad():
            for n, m in masters.items():
                m.grad = None
                p = params[n]
                p.quantize_(m) if hasattr(p, "quantize_") else p.copy_(m.to(p.dtype))
        self.model.zero_grad(set_to_none=True)
        self._fresh = False
        self.step += 1
        out = {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in stats.items()}
        return {**out, "grad_norm": float(norm), "loss": float(value.detach()), "version": self.step}

    def delayed_state(self) -> list:
        """TE's delayed-scaling state of every module, copied to the host in module order (scale and amax history,
        forward and backward): what a forward that only reads must leave unchanged."""
        return [t.detach().cpu().clone() for _, t in _fp8_meta_states(self.model)]

    def master_hf(self) -> dict:
        if getattr(self, "_rl", None) is not None:
            return self.layout.megatron_to_hf({n: m.detach() for n, m in self._rl["masters"].items()},
                                              with_scales=False)
        if self.config.trainer.device:
            return self.layout.megatron_to_hf(self.masters, with_scales=False)
        return masters_hf(self.config, self.step)

    def record(self) -> TrainerRecord:
        return TrainerRecord(self.engine, self.step, self.config.trainer.fp8_param, act_quant_kind(self.config), {
            "env": {k: os.environ.get(k) for k in ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES",)},
            "cuda": torch.cuda.get_device_name(0), "sources": dict(getattr(self, "sources", {})),
            "loss": getattr(self, "last_loss", None)})

    def logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        out = []
        with torch.no_grad(), kept_fp8_state(self.model, self.delayed):
            self.model.eval()
            for p in prompts:
                n = len(p)
                padded = p + [0] * ((-n) % 64)         # FP8 GEMMs want token counts in multiples of 16
                logits = self._forward(torch.tensor([padded], device="cuda"))
                lp = logits[0, : n - 1].float().log_softmax(-1)
                out.append(lp.gather(-1, torch.tensor(p[1:], device="cuda")[:, None])[:, 0].double().cpu())
            self._fresh = True
        return out
