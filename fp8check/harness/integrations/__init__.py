"""fp8check inside a user's own RL job and test suite: `check_sync` after a sync the user performed, against a
vLLM engine carrying fp8check's worker extension, and the pytest plugin."""
