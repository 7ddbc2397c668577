#!/bin/bash
# Qwen3.5 as vLLM 0.26 serves it, on the GPU host: bash ci/gpu_qwen35.sh [s] [a] [b] [c]   (default: s a b c)
#   s  tests/test_qwen35.py's source checks against the installed vLLM 0.26 and transformers (seconds, no GPU)
#   a  fp8check live --model tiny-hybrid --faults all                        (host path)
#   b  fp8check live --model qwen3.5-9b --layers 4 --faults real-shape       (device path)
#   c  fp8check live --model qwen3.5-35b-a3b --layers 2 --faults real-shape  (device path)
# The learner is `--trainer cpu-reference` (fp8check's TE-exact mirror; on the device path it computes on the GPU):
# the Megatron/TE adapter builds no gated delta-net layer. Each step has its own time limit and logs under
# ${OUT:-./gpu-results}; a step that fails runs ci/qwen35_probe.py for its model (the config written, the engine's
# exception in full, the parameters vLLM made against the layout map's), and the next step runs anyway.
set -uo pipefail
[[ -f /tmp/gpu-env.sh ]] && source /tmp/gpu-env.sh
OUTDIR=${OUT:-$PWD/gpu-results}; mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FP8CHECK_DEBUG=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 ci/qwen35_probe.py --versions 2>&1 | tail -1
rc=0

run_step() {     # name, time limit (s), probe arguments, then `fp8check live` arguments
  local name=$1 limit=$2 probe=$3; shift 3
  echo "=== $name: fp8check live $* (limit ${limit} s)"
  local t0; t0=$(date +%s)
  timeout --signal=INT --kill-after=30 "$limit" python3 -m fp8check live "$@" --out "$OUTDIR/live-$name.json" \
    > "$OUTDIR/live-$name.log" 2>&1
  local prc=$?
  grep -v -E "^\(|INFO|WARNING|DEBUG" "$OUTDIR/live-$name.log" | tail -60
  echo "=== $name: rc $prc in $(( $(date +%s) - t0 )) s"
  if [[ $prc -ne 0 ]]; then
    rc=1
    echo "=== $name: probe ci/qwen35_probe.py $probe"
    timeout --kill-after=20 "${LIMIT_PROBE:-120}" python3 ci/qwen35_probe.py $probe > "$OUTDIR/probe-$name.log" 2>&1
    grep -v -E "^\(|INFO|WARNING|DEBUG" "$OUTDIR/probe-$name.log" | tail -120
  fi
}

for s in ${*:-s a b c}; do
  case $s in
    s) echo "=== source: vLLM 0.26's config classes, names and mappers (tests/test_qwen35.py)"
       timeout 180 python3 -m pytest tests/test_qwen35.py -q -p no:cacheprovider -o addopts="" -rs \
         -k "vllms or written or registered or prefixes or fusions or float32_a_log or text_only_start" \
         > "$OUTDIR/pytest-qwen35-source.log" 2>&1 || rc=1
       tail -4 "$OUTDIR/pytest-qwen35-source.log" ;;
    a) run_step tiny-hybrid "${LIMIT_A:-420}" "tiny-hybrid --sync" --model tiny-hybrid --trainer cpu-reference \
         --recipe blockwise-fp32 --faults all ;;
    b) run_step qwen3.5-9b-4 "${LIMIT_B:-240}" "qwen3.5-9b@4L" --model qwen3.5-9b --layers 4 --trainer cpu-reference \
         --recipe blockwise-fp32 --device-path on --gpu-memory-utilization 0.25 --faults real-shape ;;
    c) run_step qwen3.5-35b-a3b-2 "${LIMIT_C:-300}" "qwen3.5-35b-a3b@2L" --model qwen3.5-35b-a3b --layers 2 \
         --trainer cpu-reference --recipe blockwise-fp32 --device-path on --gpu-memory-utilization 0.25 \
         --faults real-shape ;;
    *) echo "gpu_qwen35: unknown step $s (steps: s a b c)"; exit 2 ;;
  esac
done
exit $rc
