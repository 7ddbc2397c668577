"""A user project: NeMo RL's FP8 generation refit (NeMo RL's own quantizer, executed from its source) under
fp8check's pytest plugin (entry point `pytest11`, installed with fp8check). The engine fixture is NeMo RL's engine:
fp8check's engine behind NeMo RL's load path."""
import json
import os
import sys
from dataclasses import replace

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

# the tiny models gain nothing from intra-op threads, and OpenMP's spinning threads slow a busy 2-core machine
torch.set_num_threads(1)


@pytest.fixture
def fp8check_engine(request, fp8check_config):
    """The vLLM engine NeMo RL builds (a block-FP8 checkpoint engine with NeMo RL's ignored_layers: the marker's
    `nemo_ignored`, default the config's exclusion set) behind NeMo RL's load path with NeMo RL's own quantizer.
    CPU: fp8check's reference engine; `--fp8check-live`: vLLM, one per configuration for the session."""
    from nemo_rl_sync import NemoRLEngine, nemo_cast
    cfg = fp8check_config
    m = request.node.get_closest_marker("nemo_rl")
    ignored = (m.kwargs.get("ignored_layers") if m else None)
    inner_cfg = replace(cfg, rollout=replace(cfg.rollout, quantization="checkpoint"))   # what vLLM is started as
    if request.config.getoption("--fp8check-live"):
        from fp8check.harness.engines.remote import Remote
        live = request.getfixturevalue("_fp8check_live_engines")
        key = json.dumps([inner_cfg.to_dict(), ignored], sort_keys=True, default=str)
        if key not in live:
            kw = {} if ignored is None else {"ignored_layers": ignored}
            live[key] = Remote("rollout", "vllm", inner_cfg, ray=True, num_gpus=0.05, **kw)
        inner = live[key]
    else:
        from fp8check.harness.engines.registry import make_engine
        inner = make_engine("rollout", "cpu-reference", inner_cfg,
                            **({} if ignored is None else {"ignored_layers": ignored}))
    yield NemoRLEngine(inner, cfg, nemo_cast(cfg.recipe.scale_format == "pow2"))


def pytest_configure(config):
    config.addinivalue_line("markers", "nemo_rl(ignored_layers=None): the ignored_layers NeMo RL starts vLLM with")
