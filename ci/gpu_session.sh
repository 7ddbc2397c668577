#!/bin/bash
# The GPU test session, phase by phase: bash ci/gpu_session.sh PHASE [PHASE ...]   (or: all)
# Phases: numerics conformance-dense conformance-moe live road serving user versions online precisions triton kernels checkkernels
# scale examples. Each phase is one pytest process
# with its own time limit (well inside 9 minutes), engines shared within it and released at its end, and prints
# its own summary line. Logs and every measured figure (JSON lines) go under ${OUT:-./gpu-results}.
set -uo pipefail
GPU_ENV=${GPU_ENV:-/tmp/gpu-env.sh}     # another staged vLLM: GPU_ENV=/tmp/gpu-env-vllm-VERSION.sh (ci/stage_vllm.sh)
[[ -f $GPU_ENV ]] && source "$GPU_ENV"
OUTDIR=${OUT:-$PWD/gpu-results}; mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
declare -A FILES=(
  [numerics]="tests/gpu/test_te_conformance.py tests/gpu/test_triton_conformance.py tests/gpu/test_trainer_conformance.py tests/gpu/test_vllm_online_conformance.py"
  [conformance-dense]="tests/gpu/test_vllm_conformance.py -k dense_or_digest"
  [conformance-moe]="tests/gpu/test_vllm_conformance.py -k moe"
  [live]="tests/gpu/test_live.py"
  [road]="tests/gpu/test_one_road_live.py"
  [serving]="tests/gpu/test_serving.py"
  [user]="tests/gpu/test_user_engine.py"
  [versions]="tests/gpu/test_vllm_versions.py"
  [online]="tests/gpu/test_te_delayed_conformance.py tests/gpu/test_vllm_online_conformance.py tests/gpu/test_online_engine.py tests/gpu/test_nemo_rl_engine.py"
  [precisions]="tests/gpu/test_live_precisions.py"
  [precisions-rest]="tests/gpu/test_live_precisions.py -k online-per-block_or_tiny-dense-none"
  [triton]="tests/gpu/test_triton_conformance.py"
  [kernels]="tests/gpu/test_check_kernels.py tests/gpu/test_triton_conformance.py"
  [checkkernels]="tests/gpu/test_check_kernels.py"
  [scale]="tests/gpu/test_real_scale.py"
  [examples]="tests/gpu/test_example_verdicts.py"
)
ORDER="numerics conformance-dense conformance-moe live road serving user versions online precisions triton kernels checkkernels scale examples"
PHASES="$*"; [[ -z "$PHASES" || "$PHASES" == all ]] && PHASES=$ORDER
rc=0
for ph in $PHASES; do
  spec=${FILES[$ph]:-}
  if [[ -z "$spec" ]]; then echo "gpu_session: unknown phase $ph (phases: $ORDER)"; exit 2; fi
  sel=(${spec%% -k *}); k=""; [[ "$spec" == *" -k "* ]] && k=${spec##* -k }; k=${k//_or_/ or }
  export FP8CHECK_RESULTS=$OUTDIR/results-$ph.jsonl
  echo "=== phase $ph: ${sel[*]} ${k:+-k \"$k\"}"
  timeout --signal=INT "${GPU_TIMEOUT:-540}" python3 -m pytest "${sel[@]}" ${k:+-k "$k"} -m gpu -p no:cacheprovider \
    -o addopts="" -q -rfE --tb=short --timeout="${TEST_TIMEOUT:-300}" > "$OUTDIR/pytest-$ph.log" 2>&1
  prc=$?
  grep -E "^(FAILED|ERROR)" "$OUTDIR/pytest-$ph.log" | head -20
  summary=$(grep -E "(passed|failed|error|skipped|deselected).* in [0-9.]+s" "$OUTDIR/pytest-$ph.log" | tail -1)
  echo "=== phase $ph summary (rc $prc): ${summary:-no summary: the phase was stopped at its time limit}"
  [[ $prc -ne 0 ]] && rc=1
done
exit $rc
