"""The streaming state digest's word constants and its multiplier rule, in a leaf both implementations read
(harness.digest on any device, harness.digest_triton on CUDA): one source, so the two can never disagree on a
constant (torch is imported only to make the table)."""
KEYS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F)
MASK32 = 0xFFFFFFFF
BLOCK_WORDS = 4096             # word i sits at t = i mod BLOCK_WORDS of block k = i div BLOCK_WORDS


def fmix32_int(h: int) -> int:
    """MurmurHash3's finalizer on a Python int (scalars and the tables)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def in_block(t: int, j: int) -> int:
    """P_j[t]: lane j's multiplier of position t inside a block (odd)."""
    return (fmix32_int(t ^ KEYS[j]) * 2 + 1) & MASK32


def of_block(k: int, j: int) -> int:
    """Q_j[k]: lane j's multiplier of block k (odd; k may exceed 2^32 for tensors past 16 GiB)."""
    key = KEYS[j]
    return (fmix32_int((k & MASK32) ^ key ^ fmix32_int((k >> 32) ^ key)) * 2 + 1) & MASK32


_TABLES: dict = {}


def block_table(device):
    """P as int32 [4, BLOCK_WORDS] on `device` (made once per device: 64 KiB), for both implementations."""
    key = str(device)
    p = _TABLES.get(key)
    if p is None:
        import torch
        signed = [[v - (1 << 32) if v >= 1 << 31 else v for v in (in_block(t, j) for t in range(BLOCK_WORDS))]
                  for j in range(4)]
        p = _TABLES[key] = torch.tensor(signed, dtype=torch.int32).to(device)
    return p
