"""The fault matrix's speed-ups give the answers they replace: the receiver's digest check beside the sender
(`faults.beside`: `digests_beside`, with or without the packing's record; `pack_beside` and `beside_the_sender`,
the pack and receive the matrix passes to `run_sync`) equals hashing the received bytes
(`transport.digests_hashed`, `transport.hashing`), and the reference
forwards shared by content (`FORWARDS`) are the forwards of the engine they are asked for."""
import json

import pytest
import torch

from fp8check.faults import beside
from fp8check.faults.beside import beside_the_sender, digests_beside, pack_beside
from fp8check.harness.config import recommended_config
from fp8check.harness.engines.cpu import rollout as rollout_module
from fp8check.harness.engines.registry import make_engine
from fp8check.harness.sync import transport
from fp8check.harness.sync.payload import TensorRecord, digest_matches, dtype_name, payload_from_items, tensor_digest
from fp8check.harness.sync.pipeline import run_sync
from fp8check.harness.sync.transport import digests_hashed, flipped


def _raw(t):
    from fp8check.harness.formats.bytes import as_bytes
    return as_bytes(t).reshape(-1)


def test_digest_check_beside_the_sender_is_the_hash_check():
    a = torch.randn(64, 64).bfloat16()
    other = a.clone()
    other.view(torch.int16)[3, 5] ^= 1                       # one bit
    nan = a.clone()
    nan[0, 0] = float("nan")
    cases = [(a, a, tensor_digest(a)),                         # intact
             (a, a, tensor_digest(other)),                     # manifest describes other bytes
             (other, a, tensor_digest(a)),                     # wire corruption
             (a, other, tensor_digest(a)),                     # the sender's bytes are not the received ones
             (nan, nan.clone(), tensor_digest(nan)),           # NaN bytes compare as bytes
             (a.float().neg().mul(0), a.float().mul(0), tensor_digest(a.float().mul(0)))]   # -0 vs 0
    for got, sent, digest in cases:
        rec = TensorRecord("w", "hp", dtype_name(got.dtype), tuple(got.shape), None, 1, digest)
        assert digests_beside({"w": sent}, [(rec, got, _raw(got))]) == [digest_matches(got, digest)]
        assert digests_beside({}, [(rec, got, _raw(got))]) == [digest_matches(got, digest)]
        assert digests_hashed([(rec, got, _raw(got))]) == [digest_matches(got, digest)]


def test_bytes_known_from_the_packing_are_judged_as_hashed_ones(monkeypatch):
    """Beside the sender, bytes `pack_beside` copied that nobody wrote since are neither compared nor hashed. A
    bucket written in place, a header pointing elsewhere, a sender tensor written before or after the packing, a
    bucket rebuilt or given other data: each receive report equals the one from hashing every received tensor."""
    cfg = recommended_config("tiny-dense", "blockwise-fp32")

    def fresh():
        g = torch.Generator().manual_seed(0)
        sent = payload_from_items(cfg, [(f"w{i}", torch.randn(32, 64, generator=g).bfloat16()) for i in range(4)], 1)
        return sent, pack_beside(sent, 1 << 20)

    def mismatching(sent, buckets):
        payload, rep = beside_the_sender(buckets, True, sent)
        hashed_payload, hashed = transport.hashing(buckets, True, sent)
        assert rep.to_json() == hashed.to_json() and list(payload.tensors) == list(hashed_payload.tensors)
        return rep.digest_mismatch

    read = []
    digests, bytes_equal = beside.digests_hashed, beside.bytes_equal
    monkeypatch.setattr(beside, "digests_hashed", lambda received: read.extend(received) or digests(received))
    monkeypatch.setattr(beside, "bytes_equal", lambda a, b: read.append(1) or bytes_equal(a, b))
    assert mismatching(*fresh()) == [] and not read                  # intact: not one byte compared or hashed
    sent, buckets = fresh()
    buckets[0].data[3] ^= 0x10                           # the bucket written in place after the packing
    assert mismatching(sent, buckets) == ["w0"]
    sent, buckets = fresh()
    recs = buckets[0].header["records"]
    recs[0]["offset"], recs[1]["offset"] = recs[1]["offset"], recs[0]["offset"]    # the header points elsewhere
    assert mismatching(sent, buckets) == ["w0", "w1"]
    sent, buckets = fresh()
    sent.tensors["w2"].view(torch.int16)[0, 0] ^= 1      # a sender tensor written after the packing
    assert mismatching(sent, buckets) == []
    sent, _ = fresh()
    sent.tensors["w2"].view(torch.int16)[0, 0] ^= 1      # ... and before it: the manifest describes other bytes
    assert mismatching(sent, pack_beside(sent, 1 << 20)) == ["w2"]
    sent, buckets = fresh()
    buckets[0] = flipped(buckets[0], 5, 0x01)            # rebuilt: no packing record
    assert mismatching(sent, buckets) == ["w0"]
    sent, buckets = fresh()
    buckets[0].data = buckets[0].data.clone()
    buckets[0].data[3] ^= 0x10                           # other data under the bucket
    assert mismatching(sent, buckets) == ["w0"]


@pytest.mark.parametrize("name", [None, "bytes_corrupted", "bytes_corrupted_unverified", "bucket_truncated",
                                  "bucket_lost", "scale_dropped"])
def test_the_matrix_receives_beside_the_sender_with_the_answer_of_hashing(name):
    """The fault matrix passes `pack_beside` and `beside_the_sender` (its reference engines receive in the sender's
    process); a sync received that way gives the receive report and the findings of one whose receiver hashes
    every tensor."""
    from fp8check.faults import FAULTS
    from fp8check.faults import matrix
    from fp8check.harness.sync.pipeline import fault_config, reference_sync
    assert (matrix.PACK, matrix.RECEIVE) == (pack_beside, beside_the_sender)
    fault = FAULTS[name] if name else None
    cfg = fault_config(recommended_config("tiny-dense", "blockwise-fp32"), fault)
    text = lambda res: ([json.dumps(f.to_json(), sort_keys=True, default=str) for f in res.findings],   # noqa: E731
                        res.report.to_json())
    hashed = reference_sync(cfg, fault=fault, receive=transport.hashing)[0]
    besides = reference_sync(cfg, fault=fault, receive=beside_the_sender, pack=pack_beside)[0]
    assert text(besides) == text(hashed)
    assert bool(hashed.report.digest_mismatch) == (name in ("bytes_corrupted", "bytes_corrupted_unverified"))


@pytest.mark.parametrize("kept", [True, False])
def test_shared_forwards_follow_the_engine_state(kept, monkeypatch):
    """`kept=False`: a state too large to copy is keyed by its digests."""
    if not kept:
        monkeypatch.setattr(rollout_module, "STATE_COPY_BYTES", 1 << 20)
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    a, b = make_engine("rollout", "cpu-reference", cfg), make_engine("rollout", "cpu-reference", cfg)
    for r in (a, b):
        run_sync(cfg, trainer, r, checks=False, master=False)
    prompts = [[1, 2, 3, 4, 5, 6]]
    assert isinstance(a._state(), int) == kept              # a number in the memo of states, or the digests
    assert a.forward_key("x") == b.forward_key("x")
    assert torch.equal(a.generate_logprobs(prompts)[0], b.generate_logprobs(prompts)[0])
    with torch.no_grad():                                     # one byte of one kernel tensor changes the key
        name = next(n for n in b._graph[0] if n.endswith("down_proj.weight"))
        b._graph[0][name].view(torch.uint8)[0, 0] ^= 1
    assert a.forward_key("x") != b.forward_key("x")
    from fp8check.harness.numerics.forward import prompts_logprobs
    fresh = prompts_logprobs(cfg.spec, b.hf_weights(), prompts)[0]
    assert torch.equal(b.generate_logprobs(prompts)[0], fresh)
    greedy = b.greedy([[7, 8, 9, 10]], 4)
    from fp8check.harness.numerics.sampling import sample
    assert greedy == [sample(cfg.spec, b.hf_weights(), [[7, 8, 9, 10]], 1, 4, temperature=0.0).tokens[0].tolist()]


def test_outputs_measured_on_weights_held_once_are_the_engines_forwards():
    """`measure_outputs` dequantizes the engine's weights once for its decode and its scores: the outputs equal
    those of an engine that computes each forward alone, a state written while they are held gets its own
    weights, and nothing is held after."""
    cfg = recommended_config("tiny-hybrid", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    eng = make_engine("rollout", "cpu-reference", cfg)
    run_sync(cfg, trainer, eng, checks=False, master=False)
    prompts = [[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]]
    rollout_module.FORWARDS.clear()
    out = eng.measure_outputs(prompts, 3)
    assert eng._held is None
    W = eng.hf_weights()
    from fp8check.harness.numerics.forward import prompts_logprobs
    from fp8check.harness.numerics.sampling import sample
    assert out.greedy == sample(cfg.spec, W, prompts, 1, 3, temperature=0.0).tokens.tolist()
    assert out.prompt_logprobs == [[float(x) for x in t] for t in prompts_logprobs(cfg.spec, W, prompts)]
    with eng._weights_held():
        first = eng._forward_weights()
        assert eng._forward_weights() is first
        name = next(n for n in eng._graph[0] if n.endswith("down_proj.weight"))
        with torch.no_grad():
            eng._graph[0][name].view(torch.uint8)[0, 0] ^= 1
        again = eng._forward_weights()
        assert again is not first and all(torch.equal(again.tensors[n], t) for n, t in eng.hf_weights().tensors.items())


def test_hf_masters_are_the_layout_of_the_megatron_masters():
    """The HF masters, memoized per (model, seed, step), are the layout's map of the Megatron masters there."""
    from fp8check.harness.engines.cpu.masters import _sequential, masters_hf
    for model in ("tiny-dense", "tiny-moe", "tiny-hybrid"):
        for seed in (0, 3):
            cfg = recommended_config(model, "blockwise-fp32", seed=seed)
            for step in (1, 2):
                want = cfg.layout.megatron_to_hf(_sequential(model, seed, step), with_scales=False)
                got = masters_hf(cfg, step)
                assert list(got) == list(want) and all(torch.equal(got[n], want[n]) for n in want), (model, seed, step)
