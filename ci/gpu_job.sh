#!/bin/bash
# One named GPU CI job: bash ci/gpu_job.sh JOB   (.github/workflows/gpu.yml runs each as its own job; run one by hand
# the same way on a machine with vLLM 0.26, Transformer Engine 2.20, Megatron-Core 0.19 and Ray 2.60).
# Jobs:
#   numerics conformance-dense conformance-moe live road serving user versions online precisions kernels checkkernels scale
#   examples
#                     the `pytest -m gpu` phases (ci/gpu_session.sh PHASE)
#   live-dense        `fp8check live --model tiny-dense`, every live-injectable fault, then `fp8check verify` of its snapshot
#   live-moe          `fp8check live --model tiny-moe`, the expert and scale faults
#   live-scale        `fp8check live` at Qwen3-8B / Qwen3-30B-A3B shapes cut to a few layers (device path, their faults)
#   plugin            the pytest plugin on real vLLM: `pytest examples/user_project --fp8check-live`
#   preflight-probe   `fp8check preflight examples/skyrl_hopper_fp8.yaml --probe` (one live round trip)
#   bench-quantize    the quantizer and digest bench (bench/gpu_bench.py --quantize)
#   bench-sync        the catalog's cost per sync at Qwen3-8B x 12 and Qwen3-30B-A3B x 4 (bench/gpu_bench.py --sync)
#   e2e-live          the RL comparison on the live engines: on-policy, naive and BF16, 3 seeds x 30 steps
# Logs, JSON reports and one compact record of the job (record.json: command, commit, date, machine, the job's
# summary line; the format of results/*.json) go under ${OUT:-./gpu-results}/JOB. Exit status: the job's own.
set -uo pipefail
[[ -f /tmp/gpu-env.sh ]] && source /tmp/gpu-env.sh
JOB=${1:?usage: bash ci/gpu_job.sh JOB (see the header)}
R=${OUT:-$PWD/gpu-results}/$JOB; mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FP8CHECK_GPU=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAY_DEDUP_LOGS=0
FP8CHECK="python3 -m fp8check"
run() {   # run COMMAND...: the job's command, its log, its record
  CMD="$*"
  # one Ray head for the job (the live engines are Ray actors); stopped however the job ends
  python3 -m ray.scripts.scripts start --head --num-gpus=1 --disable-usage-stats > "$R/ray-start.log" 2>&1 \
    && export RAY_ADDRESS=auto
  trap 'python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1' EXIT
  echo "=== $JOB: $CMD"
  ( eval "$CMD" ) > "$R/$JOB.log" 2>&1
  rc=$?
  summary=$(grep -E "(passed|failed|error).* in [0-9.]+s|^(OK|FAILED|PASS|FAIL)\b|^=== phase .* summary" "$R/$JOB.log" | tail -1)
  echo "=== $JOB (rc $rc): ${summary:-no summary line; see $JOB.log}"
  python3 ci/record.py --job "$JOB" --command "$CMD" --rc "$rc" --summary "${summary:-}" --out "$R/record.json"
  exit $rc
}

case $JOB in
  numerics|conformance-dense|conformance-moe|live|road|serving|user|versions|online|precisions|kernels|checkkernels|scale|examples)
    run "OUT=$R bash ci/gpu_session.sh $JOB" ;;
  live-dense) run "OUT=$R bash ci/gpu_live.sh dense" ;;
  live-moe) run "OUT=$R bash ci/gpu_live.sh moe" ;;
  live-scale) run "OUT=$R bash ci/gpu_live.sh scale" ;;
  plugin)      # without an installed fp8check (PYTHONPATH only) the pytest11 entry point is absent: load it by name
    python3 -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.value.startswith('fp8check.') for e in m.entry_points(group='pytest11')) else 1)" \
      && PLUGIN="" || PLUGIN="-p fp8check.harness.integrations.pytest_plugin"
    run "python3 -m pytest examples/user_project $PLUGIN --fp8check-live -p no:cacheprovider -q -rfE --tb=short" ;;
  preflight-probe) run "$FP8CHECK preflight examples/skyrl_hopper_fp8.yaml --gpu sm90 --probe" ;;
  bench-quantize) run "python3 bench/gpu_bench.py --quantize --out $R/quantize.json" ;;
  bench-sync)
    run "python3 bench/gpu_bench.py --sync qwen3-8b --layers 12 --steps 8 --modes bare,per_sync --out $R/sync-qwen3-8b.json \
      && python3 bench/gpu_bench.py --sync qwen3-30b-a3b --layers 4 --steps 3 --modes per_sync --out $R/sync-qwen3-30b-a3b.json" ;;
  e2e-live)
    run "$FP8CHECK e2e --engine live --model tiny-rl --arms onpolicy-fp8,naive-fp8,bf16 --seeds 3 --steps 30 --no-plots --out $R/e2e" ;;
  *) echo "gpu_job.sh: unknown job $JOB (the header lists them)" >&2; exit 2 ;;
esac
