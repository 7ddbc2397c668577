#!/bin/bash
# The whole GPU campaign in a few device calls (each call at most 10 minutes; the machine is kept only briefly
# between calls, so each call is planned in advance): bash ci/gpu_plan.sh CALL   (CALL: 1 .. 47)
#   1  numerics (TE / Triton / Megatron conformance), then vLLM conformance on the dense model
#   2  vLLM conformance on the MoE model, then the live suite
#   3  `fp8check live` on the tiny models, then the serving phase loop
#   4  GPU bench, check_sync on a user's engine, real shapes
#   5  the end-to-end RL comparison on the real engines, then the sync bench
#   6  re-verify what 2026-12-01's run found broken and was fixed after it: `fp8check live` dense (every live
#      fault), check_sync on a user's engine, real shapes (Qwen3-8B / Qwen3-30B-A3B cut to a few layers)
#   7  numerics (TE / Triton / Megatron conformance), `fp8check live` on tiny-rl, the online-FP8 probe (when
#      .gpu-probe/online_fp8_dump.py is carried: it dumps what vLLM's online quantization installs, for the CPU mirror)
#   8  vLLM conformance on the MoE model, then `fp8check live` dense with every live fault (P1's own fault among them)
#   9  the live suite (tests/gpu/test_live.py), then `fp8check preflight --probe`
#  10  re-verify what the second 2026-12-01 session fixed after its runs: `fp8check live` dense with every live
#      fault (the --faults all crash), then the user-engine test (three observed syncs, the read-only extension)
#  11  the third 2026-12-01 session's live path: `fp8check live` dense with every live fault (settings read from
#      the engine, C10 on every sync), the user-engine tests (the README snippet verbatim, C10 on an engine
#      started without engine_env)
#  12  the pytest plugin on real vLLM (examples/user_project --fp8check-live: bucketed updates through vLLM's
#      start / update / finish, Megatron-named syncs), then the live suite
#  13  the 2026-12-02 session: online FP8 engines (vLLM quantization="fp8" / "fp8_per_block": installed bytes vs
#      the CPU mirror, check_sync clean), TE delayed scaling vs its CPU mirror, then the user-engine tests
#  14  the live path after the 2026-12-02 changes: `fp8check live` dense with every live fault, then the plugin
#  15  the 2026-12-02 (second) session: the live engines in the seeds' configurations (Megatron with TE delayed
#      scaling and in BF16, fp8check's vLLM engine quantizing online or serving BF16), the plugin with one engine
#      per configuration for the session, the Triton quantizer's hardware fp8 conversion (bytes vs TE, then the
#      quantizer bench)
#  16  `fp8check e2e --engine live`, 30 steps a run, one part per arm (a part that fails leaves the others):
#      on-policy seeds 0-1, the seeds' naive arm seeds 0-1, BF16 seed 0
#  17  the same for seed 2 of on-policy and naive (`fp8check e2e --merge` joins the parts on any machine), then the
#      user-engine tests
#  18  `fp8check live` dense with every live fault, then the user-engine tests
#  19  the 2026-12-02 (third) session: `fp8check e2e --engine live` on-policy seeds 0-2, the seeds' naive arm 0-1
#  20  what the 2026-12-02 (third) session left unrun: the plugin on real vLLM, BF16 seeds 1-2 (the live
#      on-policy / BF16 claim needs two seeds or more)
#  21  `fp8check live` dense with every live fault, the sync bench on Qwen3-8B shapes cut to 12 layers (with and
#      without S7's re-sync; where capture's and the checks' time goes), the quantizer bench
#  22  what no session has run yet: phase `triton` (the one-read tile, Recipe.quantize_weight on CUDA), the two
#      cases of phase `precisions` that its time never reached (fp8check's vLLM engine per block and in BF16)
#  23  phase `user` (check_sync on a user's engine, the README snippet verbatim)
#  24  `fp8check live` on tiny-moe
#  25  the 2026-12-02 (fifth) session's live path (checks screened in one round trip, P1 batched with the Triton
#      activation quantizer, one fp32 weight at a time): `fp8check live` dense with every live fault, the sync
#      bench at Qwen3-8B x 12 layers, phase `user`
#  26  the sync bench at the depths no session reached: Qwen3-8B at all 36 layers, Qwen3-30B-A3B cut to 8 layers
#  27  the sync bench at Qwen3-8B x 24 layers (36 did not fit beside the trainer), then phase `numerics`
#  28  `fp8check live` dense with every live fault and the sync bench at Qwen3-8B x 12, after the checkpoint view
#      of row-parallel tensors stopped being a copy
#  29  the 2026-12-03 session (digest v2, digest-first without the fused copy, proven tensors compared as the
#      trainer's, the per-sync tier): the kernels phase (digest, expected state, zero-block screen, quantizer vs TE),
#      `fp8check live` dense with every live fault, the sync bench at Qwen3-8B x 12 (three modes), the quantizer bench
#  31  after call 29's figures (expected digests 18.9 ms, checks 34 ms a sync, mostly host work): the kernels phase
#      (its log beside the archive), the quantizer / digest / zero-block bench, the sync bench at Qwen3-8B x 12 (per
#      sync and full) and at Qwen3-30B-A3B x 4 (per sync)
#  30  `fp8check live` at Qwen3-8B x 12 on the device path with the real-shape faults, the sync bench at
#      Qwen3-30B-A3B x 8 layers, phase `user`
#  32  the 2026-12-03 (seventh) session: the expected digests begun before the install (a thread on its own stream),
#      S1's poison started before the wire, one layout map per process: the sync bench at Qwen3-8B x 12 (per sync and
#      full, one more sync profiled), then `fp8check live` dense with every live fault
#  33  what no session ran yet: `fp8check live` at Qwen3-8B x 12 on the device path with the real-shape faults, then
#      the per-sync bench at Qwen3-30B-A3B x 4 (profiled)
#  34  where a per-sync sync's time goes at Qwen3-8B x 12: the sync alone and the per-sync tier, one sync profiled
#  35  after call 34's profile (the engine record 9.4 ms, engine digests 9.1, S3's zero-block screen 6.4): the check
#      kernels on the GPU (digest blocks per program, kept plans, the zero-block screen's first-row read), the digest
#      bench, the sync bench at Qwen3-8B x 12 (full, the sync alone, per sync; profiled), `fp8check live` dense
#  36  `fp8check live` at Qwen3-8B x 12 on the device path with the real-shape faults, the per-sync bench at
#      Qwen3-30B-A3B x 4 beside the sync alone (profiled)
#  37  the 2026-12-03 (eighth) session: the zero-block screen 8 blocks a program, the engine record in one worker RPC,
#      the bench's modes taking turns: the check kernels, the digest / zero-block bench, the sync bench at Qwen3-8B x 12
#      (full, the sync alone, per sync; profiled), `fp8check live` at Qwen3-8B x 12 with the real-shape faults, phase
#      `user` (the read-only extension's record RPC on a user's engine)
#  38  the per-sync bench at Qwen3-30B-A3B x 4 beside the sync alone (profiled), `fp8check live` dense (host path)
#  39  the per-sync bench at Qwen3-8B x 24 beside the sync alone, `fp8check live` at Qwen3-30B-A3B x 2 with its faults
#  40  the 2026-12-03 (ninth) session: the record and the engine's digests in one call, S3's trainer screens begun
#      beside the install, the startup heap frozen after the warm-up: the per-sync bench at Qwen3-8B x 12 (profiled),
#      `fp8check live` at Qwen3-8B x 12 with the real-shape faults, the per-sync bench at Qwen3-30B-A3B x 4
#  41  the per-sync bench at Qwen3-8B x 24, `fp8check live` at Qwen3-30B-A3B x 2 with its faults, `fp8check live`
#      dense (host path, every live fault)
#  42  the 2026-12-03 (tenth) session: the record's call queued behind the install, the worker's reads on one walk of
#      the module list: the per-sync bench at Qwen3-8B x 12 (8 steps), `fp8check live` at Qwen3-8B x 12 with the
#      real-shape faults, the per-sync bench at Qwen3-8B x 24 and at Qwen3-30B-A3B x 4
#  43  `fp8check live` at Qwen3-30B-A3B x 2 with its faults, `fp8check live` dense (host path, every live fault),
#      the per-sync bench at Qwen3-8B x 12 again (8 steps: the spread from run to run)
#  44  what the tenth session changed after its runs: the serving phase loop (P1's floor with the FP8 KV cache; each
#      probed phase's P1 margin in results-serving.jsonl), the per-sync bench at Qwen3-8B x 12 (`ahead_held`: the
#      capture's `begin`), `fp8check live` at Qwen3-8B x 12 with the real-shape faults (the serving phase's cap was
#      300 s when the eleventh session ran it: the phase took 295 s on a fresh machine and was cut short; 236 s alone)
#  45  the live faults at the largest shapes the per-sync bench measures, which no session has run: `fp8check live` at
#      Qwen3-8B x 24 with the real-shape faults, the per-sync bench at x 24, `fp8check live` at Qwen3-30B-A3B x 4
#  46  beside call 45 at one commit: the quantizer bench (the Triton kernel against TE's in the same run), phases
#      `numerics` (29 tests: a 100 s cap cut it at 22 on 2026-12-03), `checkkernels` and `user`
#  47  the serving phase loop (P1 with the FP8 KV cache after sleep / wake), `fp8check live` at Qwen3-30B-A3B x 2
# The device copies the working tree with each call, 64 MiB in all with the carried paths: a staging part is 60 MiB,
# so the tracked files must stay under 4 MiB during staging (move ci/gpu-results and ci/e2e-results out and back).
# On one GPU the phases of a call run one after another: on 2026-12-01 phases started side by side made vLLM's
# start-up memory profile fail ("No available memory for the cache blocks", "Error in memory profiling") whenever
# another process allocated or freed GPU memory while an engine was starting.
# Everything lands in $OUT as one archive per call plus a summary.
set -uo pipefail
source /tmp/gpu-env.sh 2>/dev/null
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FP8CHECK_GPU=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAY_DEDUP_LOGS=0
CALL=${1:?call number}
R=${OUT:-$PWD/gpu-results}/call$CALL; mkdir -p "$R"; export OUT_ROOT=$R
T0=$(date +%s)
BUDGET=${PLAN_BUDGET:-590}     # seconds this call may use in all; every time limit below is capped by what is left
cap() { local left=$(( BUDGET - ($(date +%s) - T0) - 25 )); (( left < $1 )) && echo $(( left > 10 ? left : 10 )) || echo "$1"; }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$R/summary.txt"; }
python3 -m ray.scripts.scripts start --head --num-gpus=1 --num-cpus=16 --disable-usage-stats > "$R/ray-start.log" 2>&1 && export RAY_ADDRESS=auto
log "ray head up (rc $?); $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
phase() {   # phase NAME TIMEOUT: ci/gpu_session.sh NAME into its own directory
  local name=$1; local t; t=$(cap "$2"); mkdir -p "$R/$name"
  OUT=$R/$name GPU_TIMEOUT=$t bash ci/gpu_session.sh "$name" > "$R/$name/session.txt" 2>&1
  log "$(grep -E '^=== phase .* summary' "$R/$name/session.txt" | tail -1)"
}
live_cli() {   # `fp8check live` on the tiny models (ci/gpu_live.sh)
  mkdir -p "$R/live-cli"
  OUT=$R/live-cli timeout "$(cap 420)" bash ci/gpu_live.sh "$1" > "$R/live-cli/live-$1.txt" 2>&1
  log "fp8check live ($1): rc $? $(tail -1 "$R/live-cli/live-$1.txt")"
}
scale_cli() {   # `fp8check live` at real shapes on the device path (ci/gpu_live.sh scale)
  mkdir -p "$R/scale"
  OUT=$R/scale timeout "$(cap 480)" bash ci/gpu_live.sh scale > "$R/scale/live-scale.txt" 2>&1
  log "fp8check live (real shapes): rc $? $(grep -E '^(OK|FAILED)' "$R/scale/live-scale.txt" | tr '\n' ' ')"
}
e2e_live() {
  mkdir -p "$R/e2e"
  timeout "$(cap 560)" python3 -m fp8check e2e --engine live --model tiny-rl --steps "${E2E_STEPS:-12}" \
    --arms "${E2E_ARMS:-bf16,roundtrip-fp8,onpolicy-fp8}" --seeds "${E2E_SEEDS:-1}" --seed-start "${E2E_SEED_START:-0}" \
    --no-plots --out "$R/e2e/run" > "$R/e2e/e2e.txt" 2>&1
  log "fp8check e2e --engine live: rc $? $(tail -2 "$R/e2e/e2e.txt" | tr '\n' ' ')"
}
live_rl() {     # the vocabulary-128 model: the probe prompts are folded into its vocabulary
  mkdir -p "$R/live-rl"
  timeout "$(cap 200)" python3 -m fp8check live --model tiny-rl --recipe blockwise-fp32 --steps 2 \
    --faults logprobs_at_sampling_temperature --out "$R/live-rl/live-tiny-rl.json" > "$R/live-rl/live-tiny-rl.txt" 2>&1
  log "fp8check live tiny-rl: rc $? $(grep -E '^(OK|FAILED)' "$R/live-rl/live-tiny-rl.txt" | tr '\n' ' ')"
}
plugin_live() {  # a user's project against real vLLM (the plugin's --fp8check-live)
  mkdir -p "$R/plugin"
  # without an installed fp8check (PYTHONPATH only) the pytest11 entry point is absent: load the plugin by name
  local plug=(); python3 -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.value.startswith('fp8check.') for e in m.entry_points(group='pytest11')) else 1)" || plug=(-p fp8check.harness.integrations.pytest_plugin)
  timeout "$(cap 200)" python3 -m pytest examples/user_project "${plug[@]}" --fp8check-live -p no:cacheprovider -q -rfE \
    --tb=short > "$R/plugin/pytest-user-project-live.log" 2>&1
  log "pytest examples/user_project --fp8check-live: rc $? $(tail -1 "$R/plugin/pytest-user-project-live.log")"
}
probe_online() {
  [[ -f .gpu-probe/online_fp8_dump.py ]] || { log "online probe: not carried"; return; }
  mkdir -p "$R/probe"
  # the dump (tensors, ~10 MB) goes beside the call's archive: files come back one by one, 16 MiB each at most
  OUT=$(dirname "$R") timeout "$(cap 200)" python3 .gpu-probe/online_fp8_dump.py > "$R/probe/online.jsonl" \
    2> "$R/probe/online.err"
  log "online probe: rc $? $(grep -c . "$R/probe/online.jsonl") lines"
}
preflight_probe() {
  mkdir -p "$R/preflight"
  timeout "$(cap 150)" python3 -m fp8check preflight examples/skyrl_hopper_fp8.yaml --gpu sm90 --probe \
    > "$R/preflight/probe.txt" 2>&1
  log "preflight --probe: rc $? $(tail -1 "$R/preflight/probe.txt")"
}
e2e_part() {    # e2e_part ARM SEED_START SEEDS TIMEOUT: one part of a split live comparison (${E2E_STEPS:-30} steps)
  local d="$R/e2e/$1-s$2"; mkdir -p "$(dirname "$d")"
  timeout "$(cap "$4")" python3 -m fp8check e2e --engine live --model tiny-rl --steps "${E2E_STEPS:-30}" --arms "$1" \
    --seeds "$3" --seed-start "$2" --no-plots --out "$d" > "$d.txt" 2>&1
  log "e2e part $1 seeds $2+$3: rc $? $(grep -E 'steps in|^OK|^FAILED|rror' "$d.txt" | tr '\n' ' ' | cut -c1-400)"
  # the records as one file beside the call's archive: a device call returns at most 8 files (2026-12-02: the
  # parts' steps.jsonl were left out by that count and lost)
  (cd "$R/e2e" && tar czf "$(dirname "$R")/e2e-parts-call$CALL.tgz" */runs.jsonl */steps.jsonl 2>/dev/null)
}
bench_quantize() {
  mkdir -p "$R/bench"; timeout "$(cap 150)" python3 bench/gpu_bench.py --quantize --out "$R/bench/quantize.json" \
    > "$R/bench/quantize.txt" 2>&1
  log "bench quantize: rc $? $(grep -E '^(clone|te |persist|tile|slices|default|C1|fastest|digest|zero-blk)' "$R/bench/quantize.txt" | tr '\n' ' ' | cut -c1-1500)"
  cp "$R/bench/quantize.json" "$R/bench/quantize.txt" "$(dirname "$R")/" 2>/dev/null
}
bench_digest() {   # the digest (and its blocks-per-program sweep) and the zero-block screen alone
  mkdir -p "$R/bench"; timeout "$(cap 120)" python3 bench/gpu_bench.py --digest --out "$R/bench/digest.json" \
    > "$R/bench/digest.txt" 2>&1
  log "bench digest: rc $? $(grep -E '^(digest|zero-blk)' "$R/bench/digest.txt" | tr '\n' ' ' | cut -c1-900)"
}
live_real() {   # live_real MODEL LAYERS FAULT...: `fp8check live` at a real shape on the device path
  local m=$1 n=$2; shift 2; mkdir -p "$R/live-real"
  timeout "$(cap 400)" python3 -m fp8check live --model "$m" --layers "$n" --recipe blockwise-fp32 --steps 2 \
    --faults "$@" --gpu-memory-utilization 0.25 --out "$R/live-real/live-$m-$n.json" > "$R/live-real/live-$m-$n.txt" 2>&1
  log "fp8check live $m x $n: rc $? $(grep -E '^(OK|FAILED)' "$R/live-real/live-$m-$n.txt" | tr '\n' ' ')"
  cp "$R/live-real/live-$m-$n.json" "$(dirname "$R")/" 2>/dev/null
}
bench_sync() {   # bench_sync MODEL: the device sync path, the catalog's share of it (bench/gpu_bench.py --sync)
  mkdir -p "$R/bench"; timeout "$(cap 420)" python3 bench/gpu_bench.py --sync "$1" --layers "${SYNC_LAYERS:-12}" --steps "${SYNC_STEPS:-3}" \
    --modes "${SYNC_MODES:-full,full_without_resync,per_sync}" --profile "${SYNC_PROFILE:-0}" --out "$R/bench/sync-$1.json" \
    > "$R/bench/sync-$1.txt" 2>&1
  log "bench sync $1: rc $? $(grep -E '^(sync|  )' "$R/bench/sync-$1.txt" | cut -c1-700 | tr '\n' ' ')"
  cp "$R/bench/sync-$1.json" "$R/bench/sync-$1.txt" "$(dirname "$R")/" 2>/dev/null   # beside the archive (2026-12-02: an archive over the size limit came back without them)
}
case $CALL in
  1) phase numerics 300; phase conformance-dense 420 ;;
  2) phase conformance-moe 420; phase live 500 ;;
  3) live_cli dense; live_cli moe; phase serving 420 ;;
  4)
    mkdir -p "$R/bench"; timeout "$(cap 150)" python3 bench/gpu_bench.py --quantize --out "$R/bench/quantize.json" \
      > "$R/bench/quantize.txt" 2>&1; log "bench quantize: rc $? $(grep -E '^(triton|TE|clone|digest)' "$R/bench/quantize.txt" | tr '\n' ' ' | cut -c1-600)"
    phase user 300; scale_cli ;;
  5)
    e2e_live
    mkdir -p "$R/bench"; timeout "$(cap 400)" python3 bench/gpu_bench.py --sync tiny-dense --sync qwen3-8b \
      --layers "${SYNC_LAYERS:-12}" --out "$R/bench/sync.json" > "$R/bench/sync.txt" 2>&1
    log "bench sync: rc $? $(grep -E '^sync' "$R/bench/sync.txt" | cut -c1-400 | tr '\n' ' ')" ;;
  6) live_cli dense; phase user 200; scale_cli ;;
  7) phase numerics 340; live_rl; probe_online ;;
  8) phase conformance-moe 300; live_cli dense ;;
  9) phase live 330; preflight_probe ;;
  10) live_cli dense; phase user 200 ;;
  11) live_cli dense; phase user 240 ;;
  12) plugin_live; phase live 300 ;;
  13) phase online 300; phase user 240 ;;
  14) live_cli dense; plugin_live ;;
  15) phase precisions 260; plugin_live; phase triton 120; bench_quantize ;;
  16) e2e_part onpolicy-fp8 0 2 230; e2e_part naive-fp8 0 2 230; e2e_part bf16 0 1 130 ;;
  17) e2e_part onpolicy-fp8 2 1 225; e2e_part naive-fp8 2 1 150; phase user 200 ;;
  18) live_cli dense; phase user 200 ;;
  19) e2e_part onpolicy-fp8 0 3 330; e2e_part naive-fp8 0 2 230 ;;
  20) plugin_live; e2e_part bf16 1 2 230 ;;
  21) live_cli dense; bench_sync qwen3-8b; bench_quantize ;;
  22) phase triton 150; phase precisions-rest 240 ;;
  23) phase user 300 ;;
  24) live_cli moe ;;
  25) live_cli dense; bench_sync qwen3-8b; phase user 240 ;;
  26) SYNC_LAYERS=36 bench_sync qwen3-8b; SYNC_LAYERS=8 bench_sync qwen3-30b-a3b ;;
  27) SYNC_LAYERS=24 bench_sync qwen3-8b; phase numerics 300 ;;
  28) live_cli dense; bench_sync qwen3-8b ;;
  29) phase kernels 150; live_cli dense; bench_sync qwen3-8b; bench_quantize ;;
  30) live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      SYNC_LAYERS=8 bench_sync qwen3-30b-a3b; phase user 200 ;;
  31) phase kernels 150; cp "$R/kernels/pytest-kernels.log" "$(dirname "$R")/" 2>/dev/null
      bench_quantize; SYNC_MODES=per_sync,full bench_sync qwen3-8b
      SYNC_LAYERS=4 SYNC_MODES=per_sync bench_sync qwen3-30b-a3b ;;
  32) SYNC_MODES=full,bare,per_sync SYNC_STEPS=5 SYNC_PROFILE=45 bench_sync qwen3-8b; live_cli dense ;;
  33) live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      SYNC_LAYERS=4 SYNC_MODES=bare,per_sync SYNC_STEPS=4 SYNC_PROFILE=45 bench_sync qwen3-30b-a3b ;;
  34) SYNC_MODES=bare,per_sync SYNC_STEPS=4 SYNC_PROFILE=60 bench_sync qwen3-8b ;;
  35) phase checkkernels 110; bench_digest; SYNC_MODES=full,bare,per_sync SYNC_PROFILE=60 bench_sync qwen3-8b
      live_cli dense ;;
  36) live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      SYNC_LAYERS=4 SYNC_MODES=bare,per_sync SYNC_PROFILE=60 bench_sync qwen3-30b-a3b ;;
  37) phase checkkernels 110; bench_digest; SYNC_MODES=full,bare,per_sync SYNC_STEPS=5 SYNC_PROFILE=60 bench_sync qwen3-8b
      live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      phase user 150 ;;
  38) SYNC_LAYERS=4 SYNC_MODES=bare,per_sync SYNC_STEPS=4 SYNC_PROFILE=60 bench_sync qwen3-30b-a3b
      live_cli dense ;;
  39) SYNC_LAYERS=24 SYNC_MODES=bare,per_sync SYNC_STEPS=4 bench_sync qwen3-8b
      live_real qwen3-30b-a3b 2 experts_permuted scale_bit_flip scale_dropped postprocess_skipped ;;
  40) SYNC_MODES=bare,per_sync SYNC_STEPS=5 SYNC_PROFILE=60 bench_sync qwen3-8b
      live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      SYNC_LAYERS=4 SYNC_MODES=bare,per_sync SYNC_STEPS=4 bench_sync qwen3-30b-a3b ;;
  41) SYNC_LAYERS=24 SYNC_MODES=bare,per_sync SYNC_STEPS=4 bench_sync qwen3-8b
      live_real qwen3-30b-a3b 2 experts_permuted scale_bit_flip scale_dropped postprocess_skipped
      live_cli dense ;;
  42) SYNC_MODES=bare,per_sync SYNC_STEPS=8 bench_sync qwen3-8b
      live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      SYNC_LAYERS=24 SYNC_MODES=bare,per_sync SYNC_STEPS=4 bench_sync qwen3-8b
      SYNC_LAYERS=4 SYNC_MODES=bare,per_sync SYNC_STEPS=4 bench_sync qwen3-30b-a3b ;;
  43) live_real qwen3-30b-a3b 2 experts_permuted scale_bit_flip scale_dropped postprocess_skipped
      live_cli dense
      SYNC_MODES=bare,per_sync SYNC_STEPS=8 bench_sync qwen3-8b ;;
  44) phase serving 420
      SYNC_MODES=bare,per_sync SYNC_STEPS=8 bench_sync qwen3-8b
      live_real qwen3-8b 12 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped ;;
  45) live_real qwen3-8b 24 scale_x2_block fp32_scales_rounded_pow2 megatron_qkv_not_deinterleaved rows_shifted_one_block \
        scale_dropped postprocess_twice stale_layer_unstamped
      SYNC_LAYERS=24 SYNC_MODES=bare,per_sync SYNC_STEPS=4 bench_sync qwen3-8b
      live_real qwen3-30b-a3b 4 experts_permuted scale_bit_flip scale_dropped postprocess_skipped ;;
  46) bench_quantize; phase numerics 200; phase checkkernels 100; phase user 200 ;;
  47) phase serving 420
      live_real qwen3-30b-a3b 2 experts_permuted scale_bit_flip scale_dropped postprocess_skipped ;;
  *) echo "gpu_plan.sh: CALL must be 1 to 47, got $CALL" >&2; exit 2 ;;
esac
python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
log "call $CALL done"
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$R/summary.txt"
cd "$(dirname "$R")" && tar czf "call$CALL.tgz" "call$CALL" && cp "call$CALL/summary.txt" "summary$CALL.txt" && rm -rf "call$CALL"
