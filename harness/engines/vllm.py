"""Live rollout adapter: a real vLLM 0.26 engine serving a tiny model with block-FP8 weights.

The engine starts from dummy weights with `quantization_config` from the SyncConfig (block shape, exclusion set
as `ignored_layers`), and receives syncs through vLLM's own layerwise reload
(`worker.model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`, reached through
`LLM.collective_rpc`). Everything it reports is read back from the worker: parameter bytes, data pointers,
how many times each layer's `process_weights_after_loading` ran. Reading never changes engine state.

Environment (read by vLLM when it starts, so set before this module creates the engine): VLLM_USE_DEEP_GEMM,
VLLM_USE_DEEP_GEMM_E8M0 from the config; VLLM_ENABLE_V1_MULTIPROCESSING=0 so callables reach the worker.
"""
from __future__ import annotations

import json
import os
from collections import Counter, defaultdict

import torch

from ..config import SyncConfig
from ..layouts import engine_module, rank_name, scale_name, weight_of_scale
from .cpu.rollout import SENTINEL
from .versions import param_versions, served_versions, versions_meta

PROMPT_LOGPROBS = 1


def engine_env(config: SyncConfig) -> dict[str, str]:
    """Environment a vLLM process needs for this config (explicit values: vLLM's defaults are not ours)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_DEEP_GEMM": "1" if config.rollout.use_deep_gemm else "0",
           "VLLM_USE_DEEP_GEMM_E8M0": "1" if config.deep_gemm_e8m0 else "0", "VLLM_DEEP_GEMM_WARMUP": "skip",
           "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "NCCL_NVLS_ENABLE": "0"}
    if config.rollout.moe_backend == "triton":
        env["VLLM_MOE_USE_DEEP_GEMM"] = "0"   # the selector only checks whether DeepGEMM MoE is requested
    return env


def write_model_dir(config: SyncConfig, path: str, ignored_layers=None) -> str:
    """A checkpoint directory vLLM can start from with load_format=dummy: just config.json."""
    os.makedirs(path, exist_ok=True)
    q = config.vllm_quantization_config()
    if ignored_layers is not None:
        q["ignored_layers"] = list(ignored_layers)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.spec.hf_config(q), f, indent=1)
    return path


# -- functions executed inside the vLLM worker (collective_rpc passes the worker as `self`) --------------------------
def _w_model(self):
    return self.model_runner.get_model()


def _w_params(self) -> dict:
    return {n: p for n, p in _w_model(self).named_parameters()}


def _w_layers(self) -> dict:
    """layer name -> module, for every module that owns parameters and has a quantization method (the layers
    whose post-load step a reload runs)."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    return {n: m for n, m in _w_model(self).named_modules()
            if isinstance(getattr(m, "quant_method", None), QuantizeMethodBase)
            and any(True for _ in m.named_parameters(recurse=False))}


def _w_instrument(self):
    """Count, per layer, how often vLLM asks for process_weights_after_loading (a completed layer) and how often
    it actually runs; `_fp8check_repeats` 0 or 2 injects the skipped / doubled post-load faults."""
    calls = self.__dict__.setdefault("_fp8check_calls", Counter())
    runs = self.__dict__.setdefault("_fp8check_runs", Counter())
    self.__dict__["_fp8check_repeats"] = 1
    for name, layer in _w_layers(self).items():
        qm = layer.quant_method
        orig = qm.__dict__.get("_fp8check_orig") or qm.process_weights_after_loading
        qm.__dict__["_fp8check_orig"] = orig

        def wrapped(lyr, _orig=orig, _name=name):
            calls[_name] += 1
            for _ in range(self.__dict__["_fp8check_repeats"]):
                runs[_name] += 1
                _orig(lyr)
        qm.process_weights_after_loading = wrapped
    return sorted(_w_layers(self))


def _w_reset_counts(self, repeats: int = 1):
    self.__dict__["_fp8check_calls"].clear()
    self.__dict__["_fp8check_runs"].clear()
    self.__dict__["_fp8check_repeats"] = repeats
    return True


def _w_counts(self) -> tuple:
    return dict(self.__dict__["_fp8check_calls"]), dict(self.__dict__["_fp8check_runs"])


def _w_info(self) -> dict:
    return {n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch."),
                "ptr": None if p.is_meta else p.data_ptr(), "meta": p.is_meta}
            for n, p in _w_params(self).items()}


def _w_read(self, names=None) -> dict:
    """Parameters as the kernels read them; a parameter left on the meta device (never materialized by a
    reload) has no bytes and is left out (metadata lists it as unmaterialized)."""
    ps = _w_params(self)
    return {n: p.detach().to("cpu", copy=True) for n, p in ps.items()
            if (names is None or n in names) and not p.is_meta}


def _w_poison(self):
    with torch.no_grad():
        for p in _w_params(self).values():
            if not p.is_meta and p.numel():
                p.data.reshape(-1).view(torch.uint8).fill_(SENTINEL)
    return True


def _w_reload(self, items: list):
    dev = next(iter(_w_params(self).values())).device
    self.model_runner.reload_weights(weights_iterator=((n, t.to(dev)) for n, t in items), is_checkpoint_format=True)
    torch.cuda.synchronize()
    return True


def _w_load_direct(self, items: list):
    """The direct path (`model.load_weights`), as some RL stacks call it; fails after the first post-load."""
    dev = next(iter(_w_params(self).values())).device
    with torch.no_grad():
        return sorted(_w_model(self).load_weights(iter([(n, t.to(dev)) for n, t in items])) or [])


def _w_quantize_online(self, items: list, block: list):
    """Naive sync: the engine quantizes BF16 weights itself with vLLM's own block quantizer."""
    from vllm.utils.deep_gemm import per_block_cast_to_fp8
    out = []
    for n, t, fp8 in items:
        if fp8:
            q, s = per_block_cast_to_fp8(t.cuda().float(), block_size=block, use_ue8m0=False)
            out += [(n, q.cpu()), (scale_name(n), s.float().cpu())]
        else:
            out.append((n, t))
    return out


def _w_digests(self, seeds: tuple) -> dict:
    from .digest import device_digest
    return {n: device_digest(p.detach(), seeds) for n, p in _w_params(self).items()}


class VLLMEngine:
    """One vLLM engine in this process (the Ray rollout worker owns one)."""
    engine = "vllm-0.26"

    def __init__(self, config: SyncConfig, workdir: str, gpu_memory_utilization: float = 0.12, seed: int = 0,
                 ignored_layers=None):
        for k, v in engine_env(config).items():
            os.environ[k] = v
        from vllm import LLM
        self.config = config
        self.ignored_layers = list(config.ignored_layers if ignored_layers is None else ignored_layers)
        self.tp = config.rollout.tp_size
        self.model_dir = write_model_dir(config, os.path.join(workdir, f"{config.model}-model"), self.ignored_layers)
        self.llm = LLM(model=self.model_dir, load_format="dummy", enforce_eager=True,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=256, max_num_seqs=8,
                       max_num_batched_tokens=512, skip_tokenizer_init=True, dtype="bfloat16",
                       attention_backend="TRITON_ATTN", seed=seed, tensor_parallel_size=self.tp)
        self.layers = self.rpc(_w_instrument)[0]
        self.ptrs_at_start = self._ptrs()
        self.versions: list[dict] = [defaultdict(set) for _ in range(self.tp)]
        self.updates: list[dict] = []
        self.generations: list[dict] = []
        self.poisoned = False

    def rpc(self, fn, *args):
        return self.llm.collective_rpc(fn, args=args)

    def _ptrs(self) -> dict:
        return {rank_name(n, r, self.tp): i["ptr"] for r, info in enumerate(self.rpc(_w_info)) for n, i in info.items()}

    # -- sync ------------------------------------------------------------------------------------------------
    def poison(self):
        self.rpc(_w_poison)
        self.poisoned = True

    def reload_weights(self, items, version: int | None = None, *, post_process_repeats: int = 1,
                       direct: bool = False):
        """items: (name, cpu tensor, version). Returns the update record."""
        items = list(items)
        self.rpc(_w_reset_counts, post_process_repeats)
        rec = {"version": version, "post_process": {}, "completed": [], "untouched": [], "partial": [],
               "dropped_loads": [], "errors": []}
        self.updates.append(rec)
        try:
            if direct or self.config.rollout.install == "load_weights":
                self.rpc(_w_load_direct, [(n, t) for n, t, _ in items])
            else:
                self.rpc(_w_reload, [(n, t) for n, t, _ in items])
        except Exception as e:  # noqa: BLE001 - the engine refused; record it like the reference does
            rec["errors"].append(f"{e.__class__.__name__}: {e}")
            raise
        finally:
            for r, (calls, runs) in enumerate(self.rpc(_w_counts)):
                for layer in self.layers:
                    rec["post_process"][layer] = runs.get(layer, 0)
                    (rec["completed"] if calls.get(layer) else rec["untouched"]).append(rank_name(layer, r, self.tp))
            for r, vs in enumerate(param_versions(self.config, items)):
                for n, v in vs.items():
                    self.versions[r][n] = v
        return rec

    def quantize_online(self, items):
        """Naive path: BF16 weights quantized inside the engine with vLLM's per_block_cast_to_fp8."""
        fp8 = self.config.fp8_tensors
        out = self.rpc(_w_quantize_online, [(n, t, n in fp8) for n, t, _ in items],
                       list(self.config.recipe.block_shape))[0]
        ver = {n: v for n, _, v in items}
        return [(n, t, ver.get(n, ver.get(weight_of_scale(n)))) for n, t in out]

    # -- reading (never mutates) ---------------------------------------------------------------------------------
    def kernel_tensors(self, names=None) -> dict:
        return {rank_name(n, r, self.tp): t for r, ps in enumerate(self.rpc(_w_read, names)) for n, t in ps.items()}

    def device_digests(self, seeds) -> dict:
        return {rank_name(n, r, self.tp): d for r, ds in enumerate(self.rpc(_w_digests, seeds)) for n, d in ds.items()}

    def metadata(self) -> dict:
        info = self.rpc(_w_info)
        ptrs = {rank_name(n, r, self.tp): i["ptr"] for r, inf in enumerate(info) for n, i in inf.items()}
        fp8_modules = sorted({engine_module(n) for n, i in info[0].items() if i["dtype"] == "float8_e4m3fn"})
        return {
            "engine": self.engine, "tp_size": self.tp, "ignored_layers": list(self.ignored_layers),
            "fp8_modules": fp8_modules, "poisoned": self.poisoned,
            "settings": engine_env(self.config),
            "param_dtypes": {rank_name(n, r, self.tp): i["dtype"] for r, inf in enumerate(info) for n, i in inf.items()},
            "storage_moved": sorted(n for n in ptrs if ptrs[n] != self.ptrs_at_start.get(n)),
            "unmaterialized": sorted(rank_name(n, r, self.tp) for r, inf in enumerate(info) for n, i in inf.items()
                                     if i.get("meta")),
            "versions": versions_meta(self.versions, self.tp),
            "updates": list(self.updates), "generations": list(self.generations),
        }

    def generate_logprobs(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced log-probs of each prompt's tokens (vLLM prompt_logprobs), as the sampler scores them."""
        from vllm import SamplingParams
        sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=PROMPT_LOGPROBS, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        res = []
        for p, o in zip(prompts, outs):
            lp = [float(o.prompt_logprobs[i][p[i]].logprob) for i in range(1, len(p))]
            res.append(torch.tensor(lp, dtype=torch.float64))
        self.generations.append({"during_update": False, "versions": served_versions(self.versions)})
        return res

    def greedy(self, prompts, max_tokens: int = 8) -> list[list[int]]:
        from vllm import SamplingParams
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False, ignore_eos=True)
        return [list(o.outputs[0].token_ids) for o in
                self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)]
