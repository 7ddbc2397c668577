"""The GPU conformance configurations must be able to fail: each engine setting the reference models (DeepGEMM
E8M0 on/off, experts through DeepGEMM or Triton) installs different bytes, so a byte-for-byte match against real
vLLM (tests/gpu/test_vllm_conformance.py) pins which transform the engine actually ran."""
import pytest
import torch

from fp8check.e2e.conformance import configs
from fp8check.harness.formats.bytes import as_bytes
from fp8check.harness.sync.pipeline import fault_config, reference_sync


def _state(name):
    return reference_sync(configs()[name])[0].rollout.tensors


def _differing(a, b):
    return sorted(n for n in a if not torch.equal(as_bytes(a[n]), as_bytes(b[n])))


@pytest.mark.parametrize("off,on", [("dense-fp32", "dense-fp32-e8m0"), ("moe-fp32", "moe-fp32-e8m0"),
                                    ("dense-pow2", "dense-pow2-e8m0"), ("moe-pow2", "moe-pow2-e8m0")])
def test_e8m0_setting_changes_installed_linears(off, on):
    diff = _differing(_state(off), _state(on))
    assert diff and all(".experts." not in n for n in diff), diff   # Triton experts keep their bytes


def test_deepgemm_experts_are_requantized_too():
    diff = _differing(_state("moe-fp32-e8m0"), _state("moe-fp32-e8m0-deepgemm-experts"))
    assert diff and all(".experts." in n for n in diff), diff
