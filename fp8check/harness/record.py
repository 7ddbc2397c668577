"""The typed records beside a snapshot's tensors: what an engine reports about itself after a sync (EngineRecord),
what the learner reports (TrainerRecord), and what the wire carried (PayloadMeta).

Every engine (the CPU reference, vLLM, a user's own engine) produces an EngineRecord; the pipeline adds what it
measured (the sync version, install errors, the idempotence re-sync); the record is written into the snapshot
manifest and validated against these dataclasses when it is read (harness.schema). Checks read fields.

Conventions: parameter names are rank-named (`tp1:model.layers.0...` when the engine is tensor-parallel, see
harness.layouts.rank_name); a field that is None was not measured (a check needing it reports unknown), an empty
list was measured and found empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schema import SchemaError, from_data, to_data
from .sync.payload import TensorRecord
from .sync.transport import ReceiveReport

# declared post-load transforms (harness.numerics.transforms implements each kind)
POST_LOAD_KINDS = ("identity", "ue8m0_requant")
# declared activation quantizers of an engine's FP8 GEMMs (harness.numerics.forward implements each kind)
ACT_QUANT_KINDS = ("te", "te-delayed", "vllm", "vllm-ue8m0", "vllm-per-token", "mxfp8", "none")
# how an engine installs an update (ReloadContract.mode)
RELOAD_MODES = ("layerwise", "direct")


@dataclass
class UpdateRecord:
    """One weight update as the engine saw it."""
    version: int | None = None
    post_process: dict[str, int] = field(default_factory=dict)   # module -> post-load runs in this update
    completed: list[str] = field(default_factory=list)           # modules whose every element arrived
    untouched: list[str] = field(default_factory=list)           # modules nobody wrote
    partial: list[str] = field(default_factory=list)             # modules finished with unwritten rows
    dropped_loads: list[str] = field(default_factory=list)       # loads after their module completed
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return to_data(self)


@dataclass
class Generation:
    """A generation request the engine served: during an update, and which policy versions it read."""
    during_update: bool = False
    versions: list[int] = field(default_factory=list)


@dataclass
class Resync:
    """The idempotence probe: the same payload installed twice; `changed` names tensors whose bytes moved.
    `deferred`: not measured on this sync by the caller's schedule (it costs one more install; the periodic syncs
    measure it)."""
    changed: list[str] = field(default_factory=list)
    error: str | None = None
    deferred: bool = False


@dataclass
class DigestProof:
    """What a digest-first capture established: `matched` are the rank-named parameters whose device digest equals
    the digest of what a correct sync leaves there (the trainer's bytes through the layout map and the declared
    post-load transform): they hold exactly those bytes, up to a 2^-128 collision, and a snapshot represents them
    by them. `sentinel`: those of them whose bytes hold an element of all poison bytes (S1). It holds for the
    snapshot the capture made (`Snapshot.proof`) and is never written with one: a snapshot read back from disk, or
    one whose tensors were replaced, is compared in full."""
    matched: list[str] = field(default_factory=list)
    sentinel: list[str] = field(default_factory=list)


@dataclass
class PostLoad:
    """The engine's declared post-load transform: `kind` applied to exactly the rank-named FP8 parameters in
    `params` (the checks apply what the engine declares; conformance tests prove the declaration)."""
    kind: str = "identity"
    params: list[str] = field(default_factory=list)
    block_shape: list[int] = field(default_factory=lambda: [128, 128])

    def __post_init__(self):
        if self.kind not in POST_LOAD_KINDS:
            raise SchemaError(f"post_load.kind {self.kind!r} is not one of {POST_LOAD_KINDS}")


@dataclass
class ReloadContract:
    """How the engine installs an update, as it declares it. `layerwise` (vLLM's default): each layer is restored to
    its checkpoint form, loaded, post-processed and copied into place; a layer the update does not touch keeps its
    weights, a failed one is left unmaterialized (visible). `direct` (vLLM 0.34+, VLLM_RELOAD_MODE=direct): the
    checkpoint bytes are written into the live tensors and post-load processing reruns over the whole model; there
    is no rollback, and vLLM does not check its delivery contract (every checkpoint tensor of each module is
    delivered). `reprocesses_undelivered`: post-load runs over modules the update did not deliver; `rollback`: a
    failed update leaves weights the engine can serve."""
    mode: str = "layerwise"
    reprocesses_undelivered: bool = False
    rollback: bool = True
    source: str = ""                    # where the declaration comes from (the engine release, its setting)

    def __post_init__(self):
        if self.mode not in RELOAD_MODES:
            raise SchemaError(f"reload mode {self.mode!r} is not one of {RELOAD_MODES}")


@dataclass
class KVScale:
    """One attention layer's KV-cache quantization scales as the kernels read them."""
    k: float | None = None
    v: float | None = None
    q: float | None = None
    prob: float | None = None


@dataclass
class WakeEvent:
    """The last sleep/wake cycle: its level, which parameters' bytes the wake did not restore (level 1 must restore
    all), and whether a generation was served after a level-2 wake before the next weight sync."""
    level: int = 1
    changed: list[str] = field(default_factory=list)
    generated_before_sync: bool = False
    synced_since: bool = False
    syncs_since: int = 0                                   # weight syncs installed since this wake
    kv_scales_before: dict[str, "KVScale"] | None = None   # the KV-cache scales before the sleep
    kv_scales: dict[str, "KVScale"] | None = None          # ... and right after the wake (R1: as before, as declared)


@dataclass
class Outputs:
    """What the engine serves on fixed prompts (the cold-vs-warm differential compares these)."""
    greedy: list[list[int]] = field(default_factory=list)
    prompt_logprobs: list[list[float]] = field(default_factory=list)


@dataclass
class ServingState:
    """What the engine serves with beside the weights (the engine as RL stacks run it)."""
    cuda_graphs: bool = False
    kv_cache_dtype: str = "auto"
    kv_scales: dict[str, KVScale] | None = None        # attention layer -> scales now (None: not read)
    boot_kv_scales: dict[str, KVScale] | None = None   # as the engine left them at boot, before any pinning
    graph_storage: int | None = None                   # graph-visible tensors watched (params, buffers, KV cache)
    graph_storage_moved: list[str] | None = None       # graph-visible tensors whose storage moved since capture
    sleep_level: int = 0                               # 0 awake; 1 / 2 asleep at that level
    wake: WakeEvent | None = None
    outputs: Outputs | None = None


@dataclass
class EngineRecord:
    """An engine's report about itself after a sync."""
    engine: str
    tp_size: int = 1
    ignored_layers: list[str] | None = None          # quantization_config.ignored_layers (None: not reported)
    fp8_modules: list[str] | None = None             # modules the engine quantized (None: not reported)
    settings: dict[str, Any] = field(default_factory=dict)
    param_dtypes: dict[str, str] = field(default_factory=dict)
    storage_moved: list[str] | None = None           # parameters whose storage is not the one captured at start
    unmaterialized: list[str] = field(default_factory=list)   # parameters left on the meta device
    versions: dict[str, list[int]] | None = None     # parameter -> versions written into it
    updates: list[UpdateRecord] = field(default_factory=list)   # the last one (what the checks read: a record
    #                                                  stays one size however many syncs the engine has taken)
    generations: list[Generation] = field(default_factory=list)   # served since the last update began
    poisoned: bool = False                           # destinations were set to the sentinel before the sync
    online_quant: bool = False                       # the engine quantizes BF16 weights itself (naive sync)
    post_load: PostLoad = field(default_factory=PostLoad)
    act_quant: str = "none"
    serving: ServingState | None = None
    reload: ReloadContract | None = None             # how it installs (None: not declared; S7 reads it)
    observed: bool = False                           # a sync fp8check did not carry (a user's own): no versions,
    #                                                  no re-sync; the update is what the engine's hooks counted
    seconds: dict[str, float] = field(default_factory=dict)   # where producing this record took time in the
    #                                                  engine's process (its reads, its RPC): reported, never judged
    # filled in by the pipeline
    version: int | None = None                       # the version this sync installed
    errors: list[str] = field(default_factory=list)  # the engine refused the install
    resync: Resync | None = None

    def __post_init__(self):
        if self.act_quant not in ACT_QUANT_KINDS:
            raise SchemaError(f"act_quant {self.act_quant!r} is not one of {ACT_QUANT_KINDS}")

    @property
    def last_update(self) -> UpdateRecord | None:
        return self.updates[-1] if self.updates else None

    def to_json(self) -> dict:
        return to_data(self)

    @classmethod
    def from_json(cls, data, where: str = "rollout") -> "EngineRecord":
        return from_data(cls, data, where)


# TrainerRecord.engine of a reference snapshot that is not a learner's export but what an engine quantizing BF16
# itself must hold (check_sync on an online engine): its FP8 set is the engine's, not the learner's
ENGINE_RULE = "engine-rule"


@dataclass
class TrainerRecord:
    """What the learner reports beside its FP8 forward weights."""
    engine: str
    version: int | None = None
    fp8_param: bool = False
    act_quant: str = "te"
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):           # a manifest's value is checked where it is read, not where P1 uses it
        if self.act_quant not in ACT_QUANT_KINDS:
            raise SchemaError(f"act_quant {self.act_quant!r} is not one of {ACT_QUANT_KINDS}")

    def to_json(self) -> dict:
        return to_data(self)

    @classmethod
    def from_json(cls, data, where: str = "trainer") -> "TrainerRecord":
        return from_data(cls, data, where)


@dataclass
class PayloadMeta:
    """What one sync carried: the ordered manifest and what the receiver made of the buckets."""
    version: int
    records: list[TensorRecord] = field(default_factory=list)
    receive: ReceiveReport | None = None

    def to_json(self) -> dict:
        return to_data(self)

    @classmethod
    def from_json(cls, data, where: str = "payload") -> "PayloadMeta":
        return from_data(cls, data, where)


__all__ = ["ACT_QUANT_KINDS", "DigestProof", "EngineRecord", "Generation", "KVScale", "Outputs", "POST_LOAD_KINDS", "PayloadMeta",
           "PostLoad", "RELOAD_MODES", "ReloadContract", "Resync", "SchemaError", "ServingState", "TrainerRecord", "UpdateRecord", "WakeEvent"]
