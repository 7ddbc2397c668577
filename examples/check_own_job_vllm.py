"""Check a sync your own RL job performed, on a plain vLLM engine (GPU machine with vLLM 0.26):

    python examples/check_own_job_vllm.py [--out results.json]

The engine is built the way a user builds it, with one extra engine argument (fp8check's worker extension); the
weights are installed by the user's own loop (here through vLLM's reload_weights, as RL stacks do), three times
correctly (each check must be clean: S7 judges each observed sync's own post-load counts) and once with the
substring-exclusion bug (`"mlp.gate" in name` also catches `mlp.gate_proj`); after each,
`check_sync` runs the catalog digest-first. The engine's state digests before and after every check prove the
checks changed nothing, and the check's cost is timed against the sync's."""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_project"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-dense")
    ap.add_argument("--out")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from fp8check import WORKER_EXTENSION, check_sync, engine_env, recommended_config, watch
    from fp8check.harness.engines.registry import make_engine          # the stand-in learner
    from fp8check.harness.engines.vllm import write_model_dir          # the stand-in checkpoint
    from my_sync import sync_correct, sync_substring_bug
    cfg = recommended_config(a.model, "blockwise-fp32")
    for k, v in engine_env(cfg).items():
        os.environ.setdefault(k, v)
    from vllm import LLM
    model_dir = write_model_dir(cfg, tempfile.mkdtemp(prefix="user-job-"))
    llm = LLM(model=model_dir, load_format="dummy", enforce_eager=True, gpu_memory_utilization=0.15,
              max_model_len=256, skip_tokenizer_init=True, dtype="bfloat16", attention_backend="TRITON_ATTN",
              worker_extension_cls=WORKER_EXTENSION)                       # the one extra argument
    watch(llm)
    trainer = make_engine("trainer", "cpu-reference", cfg)
    report = {"model": a.model, "runs": []}
    runs = [("correct", sync_correct)] * 3 + [("substring exclusion bug", sync_substring_bug)]
    for name, fn in runs:
        trainer.optimizer_step()
        weights, masters = trainer.export_hf(), {n: t.bfloat16() for n, t in trainer.master_hf().items()}
        items = []
        fn(weights, masters, items.extend)                                # the user's own sync code
        t0 = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [(n, t.cuda()) for n, t in items],
                                                     "is_checkpoint_format": True})
        sync_s = time.perf_counter() - t0
        d0 = llm.collective_rpc("fp8check_digests")[0]
        t1 = time.perf_counter()
        findings = check_sync(llm, weights, cfg, on_fail="return", version=trainer.step)
        check_s = time.perf_counter() - t1
        d1 = llm.collective_rpc("fp8check_digests")[0]
        fired = sorted({f.invariant_id for f in findings if f.verdict == "fail"})
        unknown = sorted({f.invariant_id for f in findings if f.verdict == "unknown"})
        run = {"sync": name, "fired": fired, "unknown": unknown, "engine_state_unchanged": d0 == d1,
               "sync_seconds": round(sync_s, 3), "check_seconds": round(check_s, 3),
               "first_failures": [f"{f.invariant_id} {f.tensor}: {f.message}" for f in findings
                                  if f.verdict == "fail"][:4]}
        print(json.dumps(run))
        report["runs"].append(run)
    if a.out:
        json.dump(report, open(a.out, "w"), indent=1)
    *correct, buggy = report["runs"]
    ok = all(not r["fired"] and not r["unknown"] for r in correct) and {"S2"} & set(buggy["fired"]) and \
        all(r["engine_state_unchanged"] for r in report["runs"])
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
