"""The streaming state digest's word constants, in a leaf both implementations read (harness.digest on any
device, harness.digest_triton on CUDA): one source, so the two can never disagree on a constant."""
KEYS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F)
MASK32 = 0xFFFFFFFF
