"""What differs between the vLLM releases fp8check's adapter runs on, in one place.

Each `Fact` is one difference (or one thing the adapter relies on that did not change): its value from each release
on (`steps`), the file in vLLM's wheel that shows it and the text there (`marker`), and why fp8check cares. The
adapter reads the release from the engine it starts or is handed (`vllm.__version__`, in the engine's process and
in every worker) and resolves the facts once (`facts_for`); nothing else in the adapter or its worker extension
compares versions. `tests/test_vllm_api.py` reads the cited file of every vLLM release it finds (/tmp/src/vllm-X, or
the wheel in /tmp/wheels) and holds each step's marker to it: present in the releases of its step, absent from the
others (a file the release lacks counts as absent).

Read releases: 0.26.0 through 0.34.0, every minor. A release newer than the newest read minor resolves to the newest
facts with `verified=False` (the adapter says so in its record); one older than 0.26 is refused in one line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

READ_RELEASES = ("0.26.0", "0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
METADATA = "vllm-{version}.dist-info/METADATA"


class UnsupportedVLLM(ValueError):
    """A vLLM release older than any fp8check's adapter was read against."""


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a release string as vLLM reports it (`0.30.0`, `0.31.0rc1`, `0.26.1.dev4+gabc`)."""
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if m is None:
        raise UnsupportedVLLM(f"vllm.__version__ {text!r} is not a release number (expected e.g. 0.30.0)")
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(frozen=True)
class Step:
    """From release `since` on (until the next step), the fact has `value`; `marker` (when given) stands in `file`
    exactly in those releases."""
    since: str
    value: object
    file: str
    marker: str | None


@dataclass(frozen=True)
class Fact:
    name: str
    steps: tuple[Step, ...]
    why: str

    def at(self, version: tuple[int, int, int]) -> object:
        value = self.steps[0].value
        for s in self.steps:
            if parse_version(s.since) <= version:
                value = s.value
        return value


def _f(name: str, why: str, *steps) -> Fact:
    return Fact(name, tuple(Step(*s) for s in steps), why)


FACTS: dict[str, Fact] = {f.name: f for f in (
    # -- what the bundle must bring (docs/vllm-versions.md, ci/stage_vllm.sh) ----------------------------------------------
    _f("torch", "vLLM's compiled kernels and its DeepGEMM are built against this torch: the release pins it exactly",
       ("0.26.0", "2.11.0", METADATA, "Requires-Dist: torch==2.11.0"),
       ("0.27.0", "2.13.0", METADATA, "Requires-Dist: torch==2.13.0"),
       ("0.33.0", "2.14.0", METADATA, "Requires-Dist: torch==2.14.0")),
    _f("deep_gemm_needs_nvcc", "DeepGEMM is switched off where nvcc >= 12.9 is missing: the engine then keeps FP32 "
                               "block scales (no UE8M0 requantization); fp8check reads which from the engine",
       ("0.26.0", False, "vllm/utils/deep_gemm.py", None),
       ("0.34.0", True, "vllm/utils/deep_gemm.py", "def _deep_gemm_nvcc_path")),
    # -- the install paths -------------------------------------------------------------------------------------------
    _f("reload_weights", "fp8check's own sync: the worker's layerwise reload of checkpoint-format tensors",
       ("0.26.0", "worker.reload_weights", "vllm/v1/worker/gpu_worker.py", "def reload_weights(")),
    _f("reload_lifecycle", "a bucketed update (vLLM's own weight transfer) begins and ends the reload through this "
                           "pair; from 0.34 `start_reload` / `finish_reload(model, model_config, device)`, which "
                           "honour VLLM_RELOAD_MODE",
       ("0.26.0", "layerwise", "vllm/model_executor/model_loader/reload/layerwise.py",
        "def initialize_layerwise_reload(model: torch.nn.Module):"),
       ("0.34.0", "lifecycle", "vllm/model_executor/model_loader/reload/lifecycle.py",
        "def start_reload(model: torch.nn.Module)")),
    _f("reload_modes", "VLLM_RELOAD_MODE=direct writes the checkpoint into the live tensors and reruns post-load "
                       "processing in place: no rollback, and the delivery contract is not checked there (S7 holds "
                       "it: `reload_contract`)",
       ("0.26.0", ("layerwise",), "vllm/envs.py", None),
       ("0.34.0", ("layerwise", "direct"), "vllm/envs.py", '"VLLM_RELOAD_MODE"')),
    _f("trainer_transfer", "the trainer side of a weight transfer as an engine over a `WeightSource`: "
                           "`IPCTrainerWeightTransferEngine.trainer_init(init_info, client=, source=)`, then "
                           "`send_weights()` drives start / update / finish on the client (rollout.install="
                           "weight_source)",
       ("0.26.0", None, "vllm/distributed/weight_transfer/ipc_engine.py", None),
       ("0.27.0", "IPCTrainerWeightTransferEngine", "vllm/distributed/weight_transfer/ipc_engine.py",
        "class IPCTrainerWeightTransferEngine(")),
    _f("weight_source_form", "how a `WeightSource` yields the trainer's tensors: `__iter__` and a `metadata()` "
                             "method; from 0.33 `iter_full()` and `metadata` as a cached_property (vLLM refuses a "
                             "subclass whose metadata is not one)",
       ("0.26.0", "iter", "vllm/distributed/weight_transfer/base.py",
        "def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:"),
       ("0.33.0", "iter_full", "vllm/distributed/weight_transfer/base.py", "def iter_full(self)")),
    _f("finish_takes_weight_version", "the client's `finish_weight_update(weight_version=None)`: the version the "
                                      "engine serves after the update",
       ("0.26.0", False, "vllm/distributed/weight_transfer/base.py", None),
       ("0.27.0", True, "vllm/distributed/weight_transfer/base.py", "def finish_weight_update(self, weight_version")),
    _f("llm_weight_update_methods", "the offline `LLM` carries start / update / finish_weight_update until 0.31; "
                                    "from 0.32 only the workers do (fp8check reaches them through collective_rpc "
                                    "in every release)",
       ("0.26.0", True, "vllm/entrypoints/llm.py", "def start_weight_update(self)"),
       ("0.32.0", False, "vllm/entrypoints/llm.py", None)),
    _f("worker_weight_update_methods", "the workers' start / update / finish_weight_update, what the weight_source "
                                       "path's client calls",
       ("0.26.0", True, "vllm/v1/worker/gpu_worker.py", "def start_weight_update(self)")),
    # -- what the extension reads and the checks mirror --------------------------------------------------------------
    _f("worker_extension", "fp8check's methods reach every worker as vLLM mixes `worker_extension_cls` in",
       ("0.26.0", "worker_extension_cls", "vllm/config/parallel.py", "worker_extension_cls: str")),
    _f("quantize_method_base", "the extension counts post-load runs on every layer whose quant_method is one",
       ("0.26.0", "QuantizeMethodBase", "vllm/model_executor/layers/quantization/base_config.py",
        "class QuantizeMethodBase")),
    _f("block_fp8_scale_name", "a block-FP8 linear keeps its FP32 block scales as `weight_scale_inv`",
       ("0.26.0", "weight_scale_inv", "vllm/model_executor/layers/quantization/fp8.py", '"weight_scale_inv"')),
    _f("ue8m0_requant", "DeepGEMM's E8M0 mode requantizes FP32-scale block weights after loading "
                        "(harness.numerics mirrors it op for op; the rule did not change)",
       ("0.26.0", "requant_weight_ue8m0_inplace", "vllm/model_executor/layers/quantization/utils/fp8_utils.py",
        "requant_weight_ue8m0_inplace(wq, ws, block_size=quant_block_shape)")),
    _f("deep_gemm_shape_rule", "which linears DeepGEMM takes (N % 64, K % 128): vllm_numerics.requant_applies",
       ("0.26.0", (64, 128), "vllm/utils/deep_gemm.py", "N_MULTIPLE = 64")),
    _f("e8m0_reader", "the extension reads UE8M0 as the engine resolved it",
       ("0.26.0", "is_deep_gemm_e8m0_used", "vllm/utils/deep_gemm.py", "def is_deep_gemm_e8m0_used() -> bool:")),
    _f("kv_scale_buffers", "the KV-cache scales are buffers (`_k_scale`, `_v_scale`), not parameters: R1 reads them; "
                           "vLLM's weight checksum does not hash them",
       ("0.26.0", ("_k_scale", "_v_scale"), "vllm/model_executor/layers/attention/attention.py",
        'register_buffer("_k_scale"')),
    _f("wake_resets_kv_scales", "after a wake the V1 runner resets k / v scales to 1.0 until 0.28; from 0.29 no "
                                "runner touches them: an RL stack with calibrated scales must set them again "
                                "(fp8check's own engine pins them after every wake; R1 judges the wake)",
       ("0.26.0", ("k", "v"), "vllm/v1/worker/gpu_model_runner.py", "def init_fp8_kv_scales"),
       ("0.29.0", (), "vllm/v1/worker/gpu_model_runner.py", None)),
    _f("model_runner_v1", "0.34 removed the V1 GPU model runner: the V2 runner (vllm/v1/worker/gpu/) is the only one",
       ("0.26.0", True, "vllm/v1/worker/gpu_model_runner.py", "class GPUModelRunner("),
       ("0.34.0", False, "vllm/v1/worker/gpu_model_runner.py", None)),
    _f("online_per_tensor_scale", "vLLM's online per-tensor FP8 (quantization='fp8' on BF16) takes one amax per "
                                  "rank until 0.27; from 0.28 the max over the tensor-parallel group, so every "
                                  "rank of a sharded layer holds the same scale. fp8check mirrors the per-rank "
                                  "rule (harness.numerics.online): on 0.28+ with TP > 1 the adapter refuses",
       ("0.26.0", "rank", "vllm/model_executor/layers/quantization/online/fp8.py", None),
       ("0.28.0", "tp-group", "vllm/model_executor/layers/quantization/online/fp8.py",
        "amax_for_tp_weight_quant(")),
    # -- vLLM's own weight checker: the second oracle ------------------------------------------------------------------
    _f("weight_checksums", "one SHA-256 per parameter (named_parameters: no buffers) of its bytes on the CPU, keyed "
                           "`dp{dp}:pp{pp}:pcp{pcp}:tp{tp}:name` (harness.engines.vllm_checksum mirrors it); over "
                           "collective_rpc, or POST /weight_checker with VLLM_SERVER_DEV_MODE=1",
       ("0.26.0", False, "vllm/v1/worker/gpu_worker.py", None),
       ("0.32.0", True, "vllm/v1/worker/gpu_worker.py", "def compute_weight_checksums(self)")),
)}


@dataclass(frozen=True)
class VLLMFacts:
    """The facts resolved for one release (`version`); `verified`: the release's minor is one fp8check read."""
    version: str
    verified: bool
    values: dict

    def __getattr__(self, name):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"no vLLM fact {name!r} (harness.engines.vllm_api.FACTS)")

    def direct_reload(self, env_mode: str | None) -> bool:
        """Whether updates run in VLLM_RELOAD_MODE=direct, given the engine process's value of that variable."""
        return (env_mode or "layerwise") == "direct" and "direct" in self.reload_modes


def facts_for(version: str) -> VLLMFacts:
    """The facts of release `version` (as `vllm.__version__` reports it)."""
    v = parse_version(version)
    oldest, newest = parse_version(READ_RELEASES[0]), parse_version(READ_RELEASES[-1])
    if v < oldest:
        raise UnsupportedVLLM(f"vLLM {version} is older than {READ_RELEASES[0]}, the oldest release fp8check's "
                              f"adapter was read against; use vLLM {READ_RELEASES[0]} or newer")
    return VLLMFacts(".".join(map(str, v)), v[:2] <= newest[:2], {name: f.at(v) for name, f in FACTS.items()})


def engine_facts() -> VLLMFacts:
    """The facts of the vLLM installed in this process (the engine's or a worker's)."""
    import vllm
    return facts_for(vllm.__version__)


__all__ = ["FACTS", "Fact", "READ_RELEASES", "Step", "UnsupportedVLLM", "VLLMFacts", "engine_facts", "facts_for",
           "parse_version"]
