#!/bin/bash
# The GPU test session: bash ci/gpu_session.sh PHASE [TEST_ID ...]  (PHASE: dense | moe | all; test ids, when
# given, replace tests/gpu and the phase's selection), on a machine with the GPU
# stack (vLLM 0.26, Transformer Engine 2.20, Megatron-Core 0.19, Ray 2.60). Writes pytest's log and every
# measured figure (JSON lines) under ${OUT:-./gpu-results}.
set -uo pipefail
[[ -f /tmp/gpu-env.sh ]] && source /tmp/gpu-env.sh
OUTDIR=${OUT:-$PWD/gpu-results}; mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FP8CHECK_RESULTS=$OUTDIR/results-${1:-}.jsonl
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case ${1:-} in
  dense) K="not moe and not experts_permuted";;
  moe)   K="moe or experts_permuted";;
  all)   K="";;
  *) echo "usage: $0 dense|moe|all [TEST_ID ...]"; exit 2;;
esac
PHASE=$1; shift
TESTS=("$@"); [[ ${#TESTS[@]} -gt 0 ]] && K="" || TESTS=(tests/gpu)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${GPU_TIMEOUT:-560}" python3 -m pytest "${TESTS[@]}" -m gpu ${K:+-k "$K"} -p no:cacheprovider -rA --tb=short \
  -o addopts="" 2>&1 | tee "$OUTDIR/pytest-$PHASE.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|error|Error" | tail -80
