"""What vLLM makes of fp8check's engine for one model, in this process (no Ray): `python3 ci/qwen35_probe.py MODEL
[--sync]`. Prints the versions, the config.json fp8check writes, and then either the engine's exception in full (it
did not start) or its parameters against the layout map's -- names missing or unexpected, shapes and dtypes that
differ -- and a greedy decode; `--sync` also syncs the reference learner's weights through the pipeline and prints
what the catalog found (tiny models: the learner runs on the host). `ci/gpu_qwen35.sh` runs it when a live step
fails, so that a single GPU run says why.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def versions() -> str:
    out = []
    for mod in ("vllm", "torch", "transformers"):
        try:
            out.append(f"{mod} {__import__(mod).__version__}")
        except Exception as e:  # noqa: BLE001 - a probe reports, never stops
            out.append(f"{mod} unavailable ({e.__class__.__name__})")
    return " | ".join(out)


def expected_params(cfg) -> dict:
    """Engine parameter -> (shape, dtype) the layout map and the config declare (rank 0)."""
    lay = cfg.layout
    out = {}
    for n, shape in lay.vllm_param_shapes(0).items():
        if n.endswith("_scale_inv"):
            dt = str(cfg.engine_recipe.scale_dtype).removeprefix("torch.")
        elif n in lay.fp8_vllm:
            dt = str(cfg.engine_recipe.fp8_dtype).removeprefix("torch.")
        else:
            dt = lay.engine_dtype(n)
        out[n] = (tuple(shape), dt)
    return out


def probe(model: str, sync: bool) -> int:
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.vllm import VLLMEngine, engine_env, text_only_kwargs, write_model_dir
    cfg = recommended_config(model, "blockwise-fp32")
    work = tempfile.mkdtemp(prefix="fp8check-probe-")
    path = write_model_dir(cfg, os.path.join(work, "model"), cfg.ignored_layers)
    with open(os.path.join(path, "config.json")) as f:
        print(f"--- {model}: config.json written to {path}\n{f.read()}")
    print(f"--- extra vllm.LLM arguments: {text_only_kwargs(cfg)}; environment: {engine_env(cfg)}")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        eng = VLLMEngine(cfg, workdir=work, gpu_memory_utilization=0.2)
    except BaseException:  # noqa: BLE001 - the point of the probe
        print(f"--- {model}: the engine did not start:")
        traceback.print_exc(file=sys.stdout)
        return 1
    rc = 0
    try:
        info = eng.rpc("fp8check_info")[0]
        want = expected_params(cfg)
        got = {n: (tuple(i["shape"]), i["dtype"]) for n, i in info.items()}
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        differ = sorted(n for n in set(want) & set(got) if want[n] != got[n])
        meta = sorted(n for n, i in info.items() if i["meta"])
        print(f"--- {model}: {len(got)} engine parameters, {len(want)} in the layout map; missing {len(missing)}, "
              f"unexpected {len(extra)}, shape/dtype differ {len(differ)}, on the meta device {len(meta)}")
        for what, names in (("missing", missing), ("unexpected", extra), ("meta", meta)):
            for n in names[:20]:
                print(f"  {what}: {n} {got.get(n, want.get(n))}")
        for n in differ[:20]:
            print(f"  differs: {n} engine {got[n]} layout {want[n]}")
        rc = 1 if (missing or extra or differ or meta) else 0
        if sync:
            from fp8check.harness.engines.cpu.trainer import ReferenceTrainer
            from fp8check.harness.sync.pipeline import DigestFirst, run_sync
            tr = ReferenceTrainer(cfg)
            tr.optimizer_step()
            res = run_sync(cfg, tr, eng, capture=DigestFirst(), probes=True)
            bad = [f for f in res.findings or [] if f.verdict != "pass"]
            print(f"--- {model}: sync of step 1: fetched {res.fetched}/{res.params}, errors {res.errors[:2]}, "
                  f"probes {json.dumps(res.probes, default=str)[:300]}")
            for f in bad[:12]:
                print(f"  {f.verdict} {f.invariant_id} {f.tensor}: {f.message[:200]}")
            rc = rc or (1 if bad or res.errors else 0)
        print(f"--- {model}: greedy decode {eng.greedy([[1, 17, 42, 99]], 4)}")
    except BaseException:  # noqa: BLE001
        traceback.print_exc(file=sys.stdout)
        rc = 1
    finally:
        eng.close()
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--versions", action="store_true", help="print the versions only")
    ap.add_argument("--sync", action="store_true", help="also sync the reference learner's weights and run the catalog")
    args = ap.parse_args()
    print(f"versions: {versions()}")
    if args.versions or not args.models:
        return 0
    return max(probe(m, args.sync) for m in args.models)


if __name__ == "__main__":
    sys.exit(main())
