"""The trainer side of vLLM's own weight transfer (0.27+) as a sync path fp8check drives and observes
(`rollout.install=weight_source`): the payload's tensors as a `WeightSource`, vLLM's
`IPCTrainerWeightTransferEngine.trainer_init(init_info, client=, source=)`, and `send_weights()`, which drives
`start_weight_update`, `update_weights` and `finish_weight_update` on the client. fp8check's client forwards each to
the engine's workers (collective_rpc: the workers carry these methods in every release; the offline `LLM` only until
0.31) and keeps a log of what it forwarded, so the update record says what vLLM's own path delivered and the catalog
judges it like any other install.

The source's form is the engine's (`vllm_api` fact `weight_source_form`): `__iter__` and a `metadata()` method
until 0.32, `iter_full()` and a cached `metadata` property from 0.33. It subclasses the engine's own `WeightSource`
class, so vLLM's checks on a source (0.33's cached-property rule, `implements_iter_full`, `owned_names`) run on it.
"""
from __future__ import annotations

from functools import cached_property


def weight_source(base, param_meta, form: str, items, device=None):
    """A `base` (vLLM's WeightSource class) over `items` ((name, tensor)); `param_meta`: vLLM's ParamMeta;
    `device`: where iteration puts each tensor (CUDA IPC sends device tensors)."""
    items = list(items)

    def _metas():
        return [param_meta(n, t.dtype, tuple(t.shape)) for n, t in items]

    def _tensors():
        for n, t in items:
            yield n, (t if device is None else t.to(device))

    if form == "iter_full":
        class PayloadSource(base):
            metadata = cached_property(lambda self: _metas())

            def iter_full(self):
                return _tensors()
    elif form == "iter":
        class PayloadSource(base):
            def metadata(self):
                return _metas()

            def __iter__(self):
                return _tensors()
    else:
        raise ValueError(f"unknown WeightSource form {form!r} (harness.engines.vllm_api)")
    PayloadSource.__qualname__ = PayloadSource.__name__ = "FP8CheckPayloadSource"
    return PayloadSource()


class ObservedClient:
    """vLLM's `VLLMWeightSyncClient` (four methods, structural) over the engine's workers, keeping a log of every call
    and of the names each update carried. `rpc(method, *args)`: the adapter's collective_rpc."""

    def __init__(self, rpc):
        self._rpc = rpc
        self.calls: list[str] = []
        self.names: list[str] = []
        self.weight_version = None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.calls.append("init")
        self._rpc("init_weight_transfer_engine", dict(init_info))

    def start_weight_update(self) -> None:
        self.calls.append("start")
        self._rpc("start_weight_update")

    def update_weights(self, update_info) -> None:
        self.calls.append("update")
        infos = update_info if isinstance(update_info, list) else [update_info]
        for info in infos:
            self.names.extend(info.get("names", ()) if isinstance(info, dict) else getattr(info, "names", ()))
        self._rpc("update_weights", update_info)

    def finish_weight_update(self, weight_version=None) -> None:
        self.calls.append("finish")
        self.weight_version = weight_version
        self._rpc("finish_weight_update")

    def problems(self, sent: list[str]) -> list[str]:
        """What the log shows went wrong with one `send_weights` round (empty: one start, updates, one finish,
        every sent tensor carried once)."""
        out = []
        round_ = [c for c in self.calls if c != "init"]
        if round_[:1] != ["start"] or round_[-1:] != ["finish"] or round_.count("start") != 1 \
                or round_.count("finish") != 1 or "update" not in round_:
            out.append(f"vLLM's weight transfer did not run start, update(s), finish once: {round_}")
        missing = sorted(set(sent) - set(self.names))
        if missing:
            out.append(f"vLLM's weight transfer carried {len(set(self.names) & set(sent))} of {len(set(sent))} "
                       f"tensors (first missing: {missing[0]})")
        dup = sorted({n for n in self.names if self.names.count(n) > 1})
        if dup:
            out.append(f"vLLM's weight transfer carried {len(dup)} tensors more than once (first: {dup[0]})")
        return out


def send_weights(facts, client: ObservedClient, items, device=None) -> ObservedClient:
    """One round of vLLM's trainer-side transfer of `items` ((name, tensor)) through `client` (its log says what
    was carried, also when the round raised). The engine must run `weight_transfer_config={"backend": "ipc"}`."""
    if facts.trainer_transfer is None:
        raise RuntimeError(f"rollout.install=weight_source: vLLM {facts.version} has no trainer-side weight transfer "
                           f"engine (from 0.27); use rollout.install=reload")
    from vllm.distributed.weight_transfer import base, ipc_engine
    engine_cls = getattr(ipc_engine, facts.trainer_transfer)
    source = weight_source(base.WeightSource, base.ParamMeta, facts.weight_source_form, items, device)
    trainer = engine_cls.trainer_init(ipc_engine.IPCTrainerInitInfo(rank=0), client=client, source=source)
    trainer.send_weights()
    return client


__all__ = ["ObservedClient", "send_weights", "weight_source"]
