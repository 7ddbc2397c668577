"""Which arithmetic vLLM 0.26's torch.compile'd `per_block_cast_to_fp8` (vllm/utils/deep_gemm.py:661-681, the
online `fp8_per_block` method's quantizer) really runs: differing codes / scales of candidate CPU rules against
it, on the GPU machine. Prints one JSON line per shape."""
import json

import torch

from fp8check.harness.formats.cast import cast_to_fp8
from fp8check.harness.numerics.online import _blocks, _unblock


def candidates(w):
    n, k = w.shape
    xv = _blocks(w.float(), (128, 128))
    amax = xv.abs().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    inv448 = torch.tensor(1.0 / 448.0, dtype=torch.float32)
    out = {}
    for sname, sf in (("div", amax / 448.0), ("mul_inv", amax * inv448)):
        for qname, q in (("mul_rcp", xv * (1.0 / sf)), ("div", xv / sf)):
            out[f"sf_{sname}/q_{qname}"] = (_unblock(cast_to_fp8(q, torch.float8_e4m3fn), n, k),
                                           sf.reshape(xv.shape[0], xv.shape[2]))
    return out


def main():
    from vllm.utils.deep_gemm import per_block_cast_to_fp8 as compiled
    eager = getattr(compiled, "_torchdynamo_orig_callable", None) or getattr(compiled, "__wrapped__", None)
    for shape in [(1024, 512), (3072, 1024), (1000, 520)]:
        g = torch.Generator().manual_seed(shape[0])
        w = (torch.randn(*shape, generator=g) * 0.03).bfloat16()
        refs = {"compiled": compiled(w.cuda(), block_size=[128, 128], use_ue8m0=False)}
        if eager is not None:
            refs["eager"] = eager(w.cuda(), block_size=[128, 128], use_ue8m0=False)
        row = {"shape": list(shape)}
        for rname, (rq, rs) in refs.items():
            rq, rs = rq.cpu().view(torch.uint8), rs.cpu().float()
            for cname, (cq, cs) in candidates(w).items():
                row[f"{rname}~{cname}"] = [int((cq.view(torch.uint8) != rq).sum()), int((cs != rs).sum())]
        print(json.dumps(row))


if __name__ == "__main__":
    main()
