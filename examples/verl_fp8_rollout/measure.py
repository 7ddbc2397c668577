"""Print what fp8check finds for verl's FP8 rollout sync, model x recipe x variant (the README's table).

    python examples/verl_fp8_rollout/measure.py [models] [recipes] [variants] [-v]

models: comma-separated (default: the four tiny built-ins); recipes: default blockwise-fp32,blockwise-pow2;
variants: rollout, ignoring (ignored_layers=mlp.shared_expert_gate), no_pg (no process group). -v prints every
failing invariant's first finding and its evidence."""
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    verbose = "-v" in argv
    args = [a for a in argv if a != "-v"]
    models = (args[0] if args else "tiny-dense,tiny-rl,tiny-moe,tiny-hybrid").split(",")
    recipes = (args[1] if len(args) > 1 else "blockwise-fp32,blockwise-pow2").split(",")
    variants = (args[2] if len(args) > 2 else "rollout,ignoring,no_pg").split(",")
    logging.getLogger().addHandler(logging.NullHandler())   # verl's "Failed to quantize" errors (no_pg): expected
    import verl_loader
    import verl_sync
    from fp8check.harness.config import recommended_config
    from fp8check.harness.engines.registry import make_engine
    from fp8check.harness.integrations.check import SyncCheckFailed
    from fp8check.harness.integrations.pytest_plugin import SyncChecker
    syncs = {"rollout": verl_sync.verl_fp8_rollout, "no_pg": verl_sync.verl_fp8_rollout_no_process_group,
             "ignoring": verl_sync.verl_fp8_rollout_ignoring("mlp.shared_expert_gate")}
    print(f"verl {verl_loader.installed_version()}, kernel path: {verl_loader.kernel_path()}")
    for model in models:
        for recipe in recipes:
            for v in variants:
                cfg = recommended_config(model, recipe)
                trainer = make_engine("trainer", "cpu-reference", cfg)
                trainer.optimizer_step()
                checker = SyncChecker(cfg, trainer, make_engine("rollout", "cpu-reference", cfg))
                try:
                    findings = checker(syncs[v])
                except SyncCheckFailed as e:
                    findings = e.findings
                fails = [f for f in findings if f.verdict == "fail"]
                ids = sorted({f.invariant_id for f in fails})
                head = f"{fails[0].invariant_id} {fails[0].tensor}: {fails[0].message}" if fails else "pass"
                print(f"{model:12} {recipe:15} {v:9} {','.join(ids) or '-':24} {head[:150]}")
                if verbose:
                    seen = set()
                    for f in fails:
                        if f.invariant_id not in seen:
                            seen.add(f.invariant_id)
                            print(f"    {f.invariant_id} {f.tensor}: {f.message[:200]}\n      {str(f.evidence)[:300]}")


if __name__ == "__main__":
    main(sys.argv[1:])
