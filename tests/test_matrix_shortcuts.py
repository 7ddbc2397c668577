"""The fault matrix's speed-ups give the answers they replace: the receiver's digest check beside the sender
(`_digest_ok`) equals hashing the received bytes, and the reference forwards shared by content (`FORWARDS`) are
the forwards of the engine they are asked for."""
import torch

from harness.config import recommended_config
from harness.engines.registry import make_engine
from harness.sync.payload import digest_matches, tensor_digest
from harness.sync.pipeline import run_sync
from harness.sync.transport import _digest_ok


def _raw(t):
    from harness.formats.bytes import as_bytes
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
        assert _digest_ok("w", got, _raw(got), digest, {"w": sent}) == digest_matches(got, digest)
        assert _digest_ok("w", got, _raw(got), digest, None) == digest_matches(got, digest)


def test_shared_forwards_follow_the_engine_state():
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    a, b = make_engine("rollout", "cpu-reference", cfg), make_engine("rollout", "cpu-reference", cfg)
    for r in (a, b):
        run_sync(cfg, trainer, r, checks=False, master=False)
    prompts = [[1, 2, 3, 4, 5, 6]]
    assert a.forward_key("x") == b.forward_key("x")
    assert torch.equal(a.generate_logprobs(prompts)[0], b.generate_logprobs(prompts)[0])
    with torch.no_grad():                                     # one byte of one kernel tensor changes the key
        name = next(n for n in b._graph[0] if n.endswith("down_proj.weight"))
        b._graph[0][name].view(torch.uint8)[0, 0] ^= 1
    assert a.forward_key("x") != b.forward_key("x")
    from harness.numerics.forward import prompts_logprobs
    fresh = prompts_logprobs(cfg.spec, b.hf_weights(), prompts)[0]
    assert torch.equal(b.generate_logprobs(prompts)[0], fresh)
    greedy = b.greedy([[7, 8, 9, 10]], 4)
    from harness.numerics.sampling import sample
    assert greedy == [sample(cfg.spec, b.hf_weights(), [[7, 8, 9, 10]], 1, 4, temperature=0.0).tokens[0].tolist()]
