"""The CPU reference engines: bit-exact mirrors of the Megatron-Core/TE learner and the vLLM 0.26 sampler."""
