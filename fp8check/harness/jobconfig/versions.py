"""Which release of each stack pre-flight judges a job against, where that release refuses an FP8 configuration,
and the names an older (or unreleased) version of it used. One table each: the job rules cite from here, the
pre-flight header names the release, and the parity test walks the refusals.

SkyRL: the `skyrl` 0.4.0 wheel on PyPI (`pip download --no-deps skyrl==0.4.0`); paths are inside the wheel. Its
history: github.com/NovaSky-AI/SkyRL, tags skyrl-v0.1.0 (2026-03-11), skyrl-v0.2.0 (2026-04-22), skyrl-v0.3.0
(2026-07-16); the FP8 weight sync came in pull request #1898 (refs/pull/1898: e04ff1ab, 0010f48d, 42e8eec3, all
2026-08-10) and #2072 (MXFP8), released in 0.4.0.
"""
from __future__ import annotations

SKYRL_VERSION = "0.4.0"                    # the release every SkyRL rule and table here is read from
SKYRL_RELEASE = f"SkyRL {SKYRL_VERSION}"
# the stack -> the version of it pre-flight's rules read (the header of every run names it)
JUDGED = {
    "skyrl": f"{SKYRL_RELEASE} (PyPI skyrl=={SKYRL_VERSION})",
    "verl": "verl @1dda039b",
    "nemo-rl": "NeMo RL @7ea279ab",
    "fp8check": "fp8check's own keys",
}

U = "skyrl/train/utils/utils.py"
CFG = "skyrl/train/config/config.py"
Q = "skyrl/backends/skyrl_train/distributed/megatron/quantization_utils.py"
S = "skyrl/backends/skyrl_train/inference_servers/utils.py"
V = "skyrl/backends/skyrl_train/weight_sync/fp8/vllm_format.py"
FQ = "skyrl/backends/skyrl_train/weight_sync/fp8/quantize.py"
WS = "skyrl/backends/skyrl_train/weight_sync/weight_senders.py"
MW = "skyrl/backends/skyrl_train/workers/megatron/megatron_worker.py"

# Every place SkyRL 0.4.0 refuses an FP8 configuration (a raise or an assert), by the condition it refuses, each
# with the pre-flight rule that reports it. The first site is the one a run meets first.
SKYRL_REFUSALS = {
    "unsupported-wire": ("K2", f"{CFG}:1922-1926", f"{U}:669-673", f"{V}:115-119", f"{Q}:207-208"),
    "quantization-forced": ("K4", f"{S}:83 (_set_or_validate, {S}:61-63)"),
    "fp8-param-gather": ("K7", f"{U}:223-232"),
    "fp8-sync-needs-megatron": ("K8", f"{CFG}:1927-1928", f"{U}:675-676", f"{U}:664-668"),
    "load-format-dummy": ("K10", f"{S}:86 (_set_or_validate, {S}:61-63)"),
    "quantization-config-injected": ("K11", f"{S}:112-118 (_set_or_validate, {S}:61-63)"),
    "mxfp8-gdn-tp": ("K13", f"{Q}:114-163 (called at {MW}:240)"),
    "fp32-scales-e8m0": ("K14", f"{U}:1122-1128"),
    "pow2-scales-e8m0": ("K14", f"{U}:1130-1145"),
    "auto-wire-auto-recipe": ("K15", f"{Q}:177-183 (called at {U}:257-259)"),
    "sync-backend": ("K16", f"{CFG}:1929-1933", f"{U}:677-688", f"{WS}:202-203", f"{MW}:1360-1369"),
    "megatron-backends": ("K16", f"{U}:214-218"),
    "megatron-serves-vllm": ("K17", f"{U}:219"),
    "model-spec": ("K19", f"{S}:52-57", f"{V}:120-125"),
    "mxfp8-experts-k": ("K23", f"{FQ}:250-254", f"{FQ}:288-292"),
    "mx-cast-backend": ("K24", f"{FQ}:196-197", f"{FQ}:214"),
    "speculative-decoding": ("K25", f"{U}:360-364 (_validate_draft_weight_sync_cfg; trainer.mtp.enabled sets "
                                    f"speculative_config at {U}:332-340)"),
    "gpu-less-driver": ("K26", f"{U}:1097-1109"),
    "ignored-layers-override": ("X6", f"{S}:112-118 (_set_or_validate, {S}:61-63)"),
    "pow2-scales-fp8-param": ("C4", f"{U}:1114-1118"),
    "mxfp8-fp8-param": ("C4", f"{Q}:104-111"),
    "mxfp8-pre-blackwell": ("C5", f"{Q}:99-103 (validate_concrete_fp8_recipe, called at {U}:244-245 and on every "
                                   f"worker at {MW}:236)"),
    "unmerged-lora": ("C8", f"{U}:689-694"),
}


def skyrl_raises(condition: str) -> str:
    """'SkyRL 0.4.0 raises (file:line)' for one refusal of SKYRL_REFUSALS, at the site a run meets first: the text
    a finding cites (the rule's `source` lists every site)."""
    return f"{SKYRL_RELEASE} raises ({SKYRL_REFUSALS[condition][1]})"


def skyrl_source(*conditions: str) -> str:
    """The `source` of a rule mirroring these refusals: every site, SkyRL 0.4.0's paths."""
    return f"{SKYRL_RELEASE} " + "; ".join(site for c in conditions for site in SKYRL_REFUSALS[c][1:])


# Names from SkyRL's FP8 pull request (#1898, the SkyRL FP8 article's) that changed before the release: what each
# was, which SkyRL accepts it and which does not (github.com/NovaSky-AI/SkyRL, read with git).
SKYRL_PRE_RELEASE = {
    "serialized_blockwise": (
        "fp8_weight_sync_mode=serialized_blockwise",
        "accepted only on PR #1898's branch from e04ff1ab to 0010f48d (2026-08-10); commit 42e8eec3 the same day "
        "renamed it blockwise with no alias"),
    "NVTE_FP8_BLOCK_AMAX_EPSILON": (
        "NVTE_FP8_BLOCK_AMAX_EPSILON",
        "read only at PR #1898's first commit e04ff1ab (its amax_epsilon_patch.py and weight_sync/fp8/quantize.py:32); "
        "0010f48d dropped it (quantize.py now floors amax at 1e-10)"),
}
SKYRL_PRE_RELEASE_VERDICT = (
    "No SkyRL release accepts these names: 0.1.0, 0.2.0 and 0.3.0 have no FP8 weight sync (fp8_weight_sync_mode is "
    "an invalid field there: their config's strict key check raises), and 0.4.0 raises 'Unsupported "
    f"fp8_weight_sync_mode' ({CFG}:1922-1926) and reads NVTE_FP8_BLOCK_AMAX_EPSILON nowhere (nor does Transformer "
    "Engine 2.20.2)")
