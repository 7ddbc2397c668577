"""vLLM's weight checksum as fp8check mirrors it (harness.engines.vllm_checksum) against hashlib over bytes made
here, and the two oracles side by side on the CPU mirror of vLLM (e2e.oracles): a demonstration of what vLLM's
round trip and fp8check's catalog each see, on fp8check's CPU engines and fp8check's mirror of vLLM's algorithm --
not vLLM running."""
import hashlib
import struct

import numpy as np
import pytest
import torch

from fp8check.harness.engines.vllm_checksum import (checksum_prefix, compare_checksums, snapshot_checksums,
                                                    tensor_checksum, weight_checksums)


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_fp8_codes_hash_as_their_bytes():
    raw = np.random.default_rng(0).integers(0, 256, size=(6, 10), dtype=np.uint8)
    t = torch.from_numpy(raw.copy()).view(torch.float8_e4m3fn)
    assert tensor_checksum(t) == _sha(raw.tobytes())


def test_a_transposed_view_hashes_in_its_logical_order():
    # vLLM's online per-tensor codes are a transposed view; `.contiguous()` hashes them as the view reads
    raw = np.random.default_rng(1).integers(0, 256, size=(4, 8), dtype=np.uint8)
    t = torch.from_numpy(raw.copy()).view(torch.float8_e4m3fn).t()
    assert tensor_checksum(t) == _sha(np.ascontiguousarray(raw.T).tobytes())
    assert tensor_checksum(t) != _sha(raw.tobytes())


def test_bf16_and_a_scalar_fp32():
    bits = np.random.default_rng(2).integers(-2**15, 2**15, size=(3, 5), dtype=np.int16)
    assert tensor_checksum(torch.from_numpy(bits.copy()).view(torch.bfloat16)) == _sha(bits.astype("<i2").tobytes())
    assert tensor_checksum(torch.tensor(0.5, dtype=torch.float32)) == _sha(struct.pack("<f", 0.5))


def test_keys_and_compare_as_the_endpoint_answers():
    a = torch.zeros(2, dtype=torch.bfloat16)
    b = torch.ones(2, dtype=torch.bfloat16)
    cs = weight_checksums({"x.weight": a, "y.weight": b}, tp=1)
    assert set(cs) == {"dp0:pp0:pcp0:tp1:x.weight", "dp0:pp0:pcp0:tp1:y.weight"}
    assert checksum_prefix(dp=2, pp=1, pcp=0, tp=3) == "dp2:pp1:pcp0:tp3:"
    assert compare_checksums(cs, dict(cs)) == {"match": True, "mismatches": []}
    changed = dict(cs, **{"dp0:pp0:pcp0:tp1:x.weight": _sha(b"other")})
    extra = dict(cs, **{"dp0:pp0:pcp0:tp1:z.weight": _sha(b"")})
    assert compare_checksums(changed, cs) == {"match": False, "mismatches": ["dp0:pp0:pcp0:tp1:x.weight"]}
    assert compare_checksums(cs, extra)["mismatches"] == ["dp0:pp0:pcp0:tp1:z.weight"]     # missing on one side


def test_snapshot_keys_map_to_each_workers_prefix():
    t = torch.arange(4, dtype=torch.uint8)
    got = snapshot_checksums({"tp0:m.w": t, "tp1:m.w": t + 1})
    assert got == {"dp0:pp0:pcp0:tp0:m.w": _sha(bytes([0, 1, 2, 3])), "dp0:pp0:pcp0:tp1:m.w": _sha(bytes([1, 2, 3, 4]))}


# -- the two oracles (CPU mirror) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fault,vllm_match,fp8check_fires", [
    (None, True, set()),
    ("kv_scale_placeholder", True, {"R1"}),         # a buffer: vLLM hashes parameters only
    ("stale_layer_unstamped", True, {"S2"}),        # the sender's bytes, the same twice: the round trip holds
    ("norm_dropped", False, {"S1"}),                # never re-sent after the reset: both see it
])
def test_two_oracles(fault, vllm_match, fp8check_fires):
    from fp8check.e2e.oracles import round_trip
    row = round_trip(fault)
    assert row.vllm_match is vllm_match, row.vllm_mismatches
    assert fp8check_fires <= set(row.fired), row.fired
    assert (row.verdict == "pass") is (not fp8check_fires), (row.verdict, row.fired)
    if not vllm_match:
        assert any(m.endswith("layernorm.weight") for m in row.vllm_mismatches), row.vllm_mismatches


def test_mirror_hashes_every_parameter_and_no_kv_scale():
    """The CPU mirror's checksums: one per engine parameter (no KV-cache scale: a buffer in vLLM), and a flipped
    code moves exactly its parameter's checksum."""
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.registry import make_engine
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    rollout = make_engine("rollout", "cpu-reference", cfg)
    before = rollout.weight_checksums()
    assert set(before) == {checksum_prefix() + n for n in cfg.layout.vllm_param_shapes(0)}
    assert not [k for k in before if "k_scale" in k or "v_scale" in k]
    name, t = next((n, t) for n, t in rollout.params[0].items() if t.dtype == torch.float8_e4m3fn)
    t.view(torch.uint8)[0, 0] ^= 1
    assert compare_checksums(rollout.weight_checksums(), before)["mismatches"] == [checksum_prefix() + name]
