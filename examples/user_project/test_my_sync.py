"""A user's test file for their own sync code, in their style, with fp8check's pytest plugin (installed with
fp8check; nothing to import). Run: `pytest examples/user_project` (add --fp8check-live on a GPU machine)."""
import pytest
from hypothesis import given, settings, strategies as st

from fp8check import SyncCheckFailed
from my_sync import sync_correct, sync_substring_bug


def test_my_sync_installs_the_learners_bytes(fp8check_sync):
    fp8check_sync(sync_correct)


def test_the_substring_exclusion_bug_is_caught(fp8check_sync):
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(sync_substring_bug)
    assert "gate" in str(e.value) and {"S1", "S2"} & {f.invariant_id for f in e.value.findings if f.verdict == "fail"}


@pytest.mark.fp8check(model="tiny-moe")
def test_my_sync_on_a_moe_model(fp8check_sync):
    fp8check_sync(sync_correct)


@settings(max_examples=3, deadline=None)
@given(bucket=st.integers(1, 64))
def test_bucketing_never_matters(bucket):
    """Fuzz a sync parameter: every bucket size installs the same bytes (fixtures are not shared with
    Hypothesis examples, so the checker is built per example)."""
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.integrations.pytest_plugin import SyncChecker
    from my_sync import _sync
    cfg = recommended_config("tiny-dense", "blockwise-fp32")
    trainer = make_engine("trainer", "cpu-reference", cfg)
    trainer.optimizer_step()
    checker = SyncChecker(cfg, trainer, make_engine("rollout", "cpu-reference", cfg))
    checker(lambda w, m, load: _sync(w, m, load, lambda n, mod: any(k in n for k in ("norm", "embed", "lm_head")),
                                      bucket=bucket))


def _megatron(config, **kw):
    from my_sync import megatron_sync
    s = config.spec
    return megatron_sync(s.num_heads, s.num_kv_heads, s.head_dim, **kw)


def test_my_megatron_side_sync_installs_the_learners_bytes(fp8check_sync, fp8check_config):
    """Megatron-named tensors and TE's padded scale workspaces in; the user's own renaming, de-interleaving and
    un-padding out, one bucket per layer (all buckets one update, as vLLM's weight transfer receives them)."""
    fp8check_sync(_megatron(fp8check_config), names="megatron")


def test_qkv_read_without_deinterleaving_is_caught(fp8check_sync, fp8check_config):
    with pytest.raises(SyncCheckFailed) as e:
        fp8check_sync(_megatron(fp8check_config, deinterleave=False), names="megatron")
    fired = {f.invariant_id for f in e.value.findings if f.verdict == "fail"}
    assert {"S2", "S4"} <= fired and "k_proj" in str(e.value)
