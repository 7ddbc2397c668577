"""S7's idempotence probe judges what a sync defines. On the H200 the verl example's "no process group" case (every
GEMM sent BF16, no scale sent) fired S7 on real vLLM and not on the CPU mirror. The cause: vLLM 0.26's layerwise
reload materializes a layer that was only partly loaded with `torch.empty_strided` (model_loader/reload/meta.py,
`materialize_meta_tensor`) and copies every one of its tensors into the kernel's storage at finalize
(layerwise.py, `_layerwise_process` -> `_copy_and_restore_kernel_tensors`), so a scale nobody sent holds whatever
the CUDA caching allocator's block held -- different after the re-sync, whose allocation history differs (the
plugin re-synced with one `reload_weights` where the sync had come in buckets) -- while the mirror fills those
elements with the poison byte, the same every time. The re-sync now repeats the sync as it came (its buckets) and
compares the parameters the sync writes whole (`LayoutMap.written_by`); what it leaves unwritten is S1's.

`AllocatorRollout` is the mirror with vLLM's allocator as it behaves here: a fresh checkpoint buffer holds bytes
that differ from reload to reload."""
import itertools

import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.cpu.rollout import ReferenceRollout
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.integrations.check import SyncCheckFailed
from fp8check.harness.integrations.pytest_plugin import SyncChecker
from fp8check.harness.sync.pipeline import run_sync
from fp8check.faults import FAULTS


class AllocatorRollout(ReferenceRollout):
    """Unwritten elements of a partly loaded layer hold what an allocator's block held: new bytes every reload."""
    _draw = itertools.count(1)

    def _checkpoint_buffer(self, name, like, whole=False):
        buf = super()._checkpoint_buffer(name, like, whole)
        g = torch.Generator().manual_seed(next(self._draw))
        raw = buf.view(-1).view(torch.uint8) if buf.numel() else buf
        raw.copy_(torch.randint(0, 255, raw.shape, dtype=torch.uint8, generator=g))
        return buf


class NotIdempotent(ReferenceRollout):
    """An engine whose post-load writes the install's count into the first code of every FP8 weight: a second
    install of the same bytes leaves other bytes, a real S7."""
    _installs = itertools.count(1)

    def start_update(self, version=None):
        self._n = next(self._installs) % 100
        return super().start_update(version)

    def _finish(self, rank, mod, staged, rec):
        super()._finish(rank, mod, staged, rec)
        for n, t in self.params[rank].items():
            if t.dtype == torch.float8_e4m3fn and mod == self.param_module(n):
                t.view(torch.uint8).view(-1)[0] = self._n


def every_gemm_bf16(weights, masters, load):
    """verl's silent fallback without a process group: every weight as the BF16 master, no scale, two buckets."""
    items = [(n, masters[n]) for n in masters]
    load(items[: len(items) // 2])
    load(items[len(items) // 2:])


def failing(engine_cls, model, sync=every_gemm_bf16):
    cfg = recommended_config(model, "blockwise-fp32")
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()
    with pytest.raises(SyncCheckFailed) as e:
        SyncChecker(cfg, t, engine_cls(cfg))(sync)
    return {f.invariant_id for f in e.value.findings if f.verdict == "fail"}


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe", "tiny-hybrid"])
def test_unwritten_bytes_do_not_decide_s7(model):
    """The same verdicts whatever fills what the sync did not write: the mirror's poison or an allocator's bytes."""
    assert failing(AllocatorRollout, model) == failing(ReferenceRollout, model) == {"S1", "S2", "S3", "S4", "S5",
                                                                                      "S6"}


def test_a_real_idempotence_failure_still_fails_s7():
    def own_bytes(weights, masters, load):
        load(list(weights.items()))
    assert "S7" in failing(NotIdempotent, "tiny-dense", own_bytes)


def test_the_resync_repeats_the_sync_bucket_by_bucket():
    calls = []

    class Recording(ReferenceRollout):
        def start_update(self, version=None):
            calls.append("start")
            return super().start_update(version)

        def load_bucket(self, items):
            calls.append(len(list(items)) if not isinstance(items, list) else len(items))
            return super().load_bucket(items)

        def finish_update(self):
            calls.append("finish")
            return super().finish_update()

    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()
    weights = list(t.export_hf().items())

    def three_buckets(w, m, load):
        for i in range(3):
            load(weights[i::3])
    SyncChecker(cfg, t, Recording(cfg))(three_buckets)
    sizes = [len(weights[i::3]) for i in range(3)]
    assert calls == ["start", *sizes, "finish"] * 2


def test_the_pipeline_resync_judges_what_the_sync_writes():
    """fp8check's own sync with one scale dropped (fault scale_dropped): S1, S3, S4 -- and no S7 on an engine whose
    unwritten bytes differ after the re-sync."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    t = make_engine("trainer", "cpu-reference", cfg)
    t.optimizer_step()
    res = run_sync(cfg, t, AllocatorRollout(cfg), fault=FAULTS["scale_dropped"], probes=False)
    fired = {f.invariant_id for f in res.findings if f.verdict == "fail"}
    assert {"S1", "S3", "S4"} <= fired and "S7" not in fired
