"""The matrix's memos of pure functions: by tensor identity (the trainer's shared export) and by content (engine
buffers that repeat bytes). Neither may hand a changed tensor the result of the unchanged one."""
import torch

from fp8check.harness.memo import ContentMemo, IdentityMemo


def _counting(fn):
    calls = []

    def f():
        calls.append(1)
        return fn()
    return f, calls


def test_identity_memo_hits_the_same_object_and_misses_a_copy_or_a_write():
    m = IdentityMemo(1 << 20)
    a = torch.arange(16, dtype=torch.float32)
    f, calls = _counting(lambda: a * 2)
    first = m.get_for("x2", (a,), f)
    assert m.get_for("x2", (a,), f) is first and len(calls) == 1
    b = a.clone()                                  # same bytes, another object: computed for it
    assert torch.equal(m.get_for("x2", (b,), lambda: b * 2), first)
    a[3] = 100.0                                   # written in place: the old result is not reused
    again = m.get_for("x2", (a,), f)
    assert len(calls) == 2 and float(again[3]) == 200.0
    a.view(4, 4)[0, 0] = -1.0                      # through a view: the shared version counter moves too
    assert float(m.get_for("x2", (a,), f)[0]) == -2.0 and len(calls) == 3
    out = m.get_for("x2", (a,), f)
    out.add_(1)                                    # a caller wrote the result: recomputed, not handed out
    assert float(m.get_for("x2", (a,), f)[0]) == -2.0 and len(calls) == 4


def test_identity_memo_bounded_in_entries():
    m = IdentityMemo(1 << 20, max_entries=3)
    keep = [torch.zeros(1) for _ in range(5)]
    for t in keep:
        m.get_for("z", (t,), lambda: None)
    assert len(m) == 3


def test_content_memo_hits_equal_bytes_only():
    m = ContentMemo(1 << 20)
    a = torch.arange(64, dtype=torch.int32).view(torch.uint8)[:200]
    f, calls = _counting(lambda: a.float().sum())
    first = m.get_for("s", (a,), f)
    b = a.clone()
    assert m.get_for("s", (b,), lambda: b.float().sum()) is first and len(calls) == 1
    a[5] = 7                                       # the caller's buffer written: the memo kept its own copy
    assert m.get_for("s", (b,), lambda: torch.tensor(-2.0)) is first
    c = b.clone()
    w = c.view(torch.int64)
    w[0], w[1] = w[1].clone(), w[0].clone()        # same fingerprint (a sum of words), other bytes: computed
    got = m.get_for("s", (c,), lambda: torch.tensor(-1.0))
    assert float(got) == -1.0
    assert float(m.get_for("s", (b.view(torch.int8),), lambda: torch.tensor(-3.0))) == -3.0   # dtype is content


def test_identity_memo_never_serves_a_tensor_off_the_cpu():
    """On a GPU an extension's kernel (TE re-quantizing into its workspace) writes in place without moving the
    version counter: such tensors are computed every time (a meta tensor stands in for one here)."""
    m = IdentityMemo(1 << 20)
    a = torch.empty(16, device="meta")
    f, calls = _counting(lambda: torch.zeros(1))
    m.get_for("off-cpu", (a,), f)
    m.get_for("off-cpu", (a,), f)
    assert len(calls) == 2 and len(m) == 0
