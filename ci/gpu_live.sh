#!/bin/bash
# `fp8check live` on a machine with the GPU stack: bash ci/gpu_live.sh [dense|moe|all|scale]
# dense: 2 checked optimizer steps, then every live-injectable fault (each followed by a clean re-sync);
# moe: 2 steps, then the expert-specific fault and a scale fault; scale: Qwen3-8B / Qwen3-30B-A3B shapes cut to a
# few layers on the device path, with faults at that size. JSON reports under ${OUT:-./gpu-results}.
set -uo pipefail
GPU_ENV=${GPU_ENV:-/tmp/gpu-env.sh}     # another staged vLLM: GPU_ENV=/tmp/gpu-env-vllm-VERSION.sh (ci/stage_vllm.sh)
[[ -f $GPU_ENV ]] && source "$GPU_ENV"
OUTDIR=${OUT:-$PWD/gpu-results}; mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FP8CHECK="python3 -m fp8check"             # the console script, without needing `pip install -e .`
rc=0
if [[ ${1:-all} == scale ]]; then      # real shapes, the device path (weights GPU to GPU)
  for spec in "qwen3-8b 4 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block scale_dropped postprocess_twice stale_layer_unstamped" \
              "qwen3-30b-a3b 2 experts_permuted scale_bit_flip scale_dropped postprocess_skipped"; do
    set -- $spec; m=$1; n=$2; shift 2
    $FP8CHECK live --model "$m" --layers "$n" --recipe blockwise-fp32 --steps 2 --faults "$@" \
      --gpu-memory-utilization 0.25 --out "$OUTDIR/live-$m.json" 2>&1 | tee "$OUTDIR/live-$m.log" \
      | grep -v "^(\|INFO\|WARNING" | tail -30
    rc=$((rc | PIPESTATUS[0]))
  done
  exit $rc
fi
if [[ ${1:-all} != moe ]]; then
  $FP8CHECK live --model tiny-dense --recipe blockwise-fp32 --steps 2 --faults all --snapshot "$OUTDIR/snapshot-dense" \
    --out "$OUTDIR/live-dense.json" 2>&1 | tee "$OUTDIR/live-dense.log" | grep -v "^(\|INFO\|WARNING" | tail -40
  rc=$((rc | PIPESTATUS[0]))
  # the captured engine state checks green later, without the engines
  $FP8CHECK verify "$OUTDIR/snapshot-dense" | tail -3; rc=$((rc | PIPESTATUS[0]))
fi
if [[ ${1:-all} != dense ]]; then
  $FP8CHECK live --model tiny-moe --recipe blockwise-fp32 --steps 2 --faults experts_permuted scale_x2_block \
    --out "$OUTDIR/live-moe.json" 2>&1 | tee "$OUTDIR/live-moe.log" | grep -v "^(\|INFO\|WARNING" | tail -25
  rc=$((rc | PIPESTATUS[0]))
fi
exit $rc
