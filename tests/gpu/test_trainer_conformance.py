"""The live trainer (Megatron-Core + Transformer Engine, blockwise recipe) holds exactly the FP8 bytes the CPU
reference trainer computes for the same masters: TE's own quantized weights, read from its workspaces."""
from dataclasses import replace

import pytest
import torch

from fp8check.harness.config import recommended_config
from fp8check.harness.engines.cpu.trainer import ReferenceTrainer
from fp8check.harness.formats.bytes import as_bytes

from .conftest import record

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model,recipe,fp8_param", [("tiny-dense", "blockwise-fp32", False),
                                                     ("tiny-dense", "blockwise-pow2", False),
                                                     ("tiny-dense", "blockwise-fp32", True),
                                                     ("tiny-moe", "blockwise-fp32", False)])
def test_megatron_fp8_weights_match_reference(trainer, release, model, recipe, fp8_param):
    cfg = recommended_config(model, recipe)
    cfg = replace(cfg, trainer=replace(cfg.trainer, fp8_param=fp8_param))
    a = trainer(cfg)
    step = a.optimizer_step()
    live = a.export_hf()
    info = a.record().info
    release(a)
    ref = ReferenceTrainer(cfg)
    for _ in range(step):
        ref.optimizer_step()
    exp = ref.export_hf()
    diff = []
    for n, t in exp.items():
        g = live.get(n)
        if g is None or g.shape != t.shape or g.dtype != t.dtype or not torch.equal(as_bytes(g), as_bytes(t)):
            diff.append({"tensor": n, "live": None if g is None else [list(g.shape), str(g.dtype)],
                         "ref": [list(t.shape), str(t.dtype)],
                         "differing": None if g is None or g.shape != t.shape else
                         int((as_bytes(g) != as_bytes(t)).sum())})
    record("megatron_trainer_conformance", model=model, recipe=recipe, fp8_param=fp8_param, tensors=len(exp),
           differing=len(diff), first=diff[:8], loss=info.get("loss"), sources=sorted(set(info["sources"].values())))
    assert info.get("loss") is not None and info["loss"] == info["loss"], "the FP8 forward/backward did not run"
    assert not diff, f"{len(diff)}/{len(exp)} tensors differ from the CPU reference: {diff[:3]}"
