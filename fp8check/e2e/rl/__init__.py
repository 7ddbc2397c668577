"""The end-to-end RL comparison (`fp8check e2e`): a small GRPO loop on an embedded tiny model and an exactly
rewarded digit task, run under BF16, naive FP8, on-policy FP8 and calibrated clipping, with every step's weight
sync checked by the catalog, per-step mismatch metrics, paired statistics over seeds, plots and a report."""
