"""P family: behavioural backstop. On fixed prompts, the sampler's log-probs vs the learner's, within bounds.

Field thresholds for orientation: mean |dlogprob| < 0.05, token_mult_prob_error median < 1.1, generation KL
< 0.01. A fixed bound does not scale with the model (the engines' own numeric gap grows with depth and width),
so P1 derives its bounds per sync from two references it computes itself, which neither engine under judgement
produced:

* the learner's reference: the reference forward (harness.numerics.forward) of the trainer's own bytes under the
  trainer's activation quantizer -- what the learner computes;
* the sampler's reference: the reference forward of what a perfect sync would have left in the engine -- the
  trainer's bytes through the layout map and the engine's *declared* post-load transform -- under the engine's
  *declared* activation quantizer and KV cache. It holds every difference the two engines declare (activation
  grids, UE8M0 requantization, an FP8 KV cache) and none that the sync or an undeclared engine change introduced;
* the floor: the metrics of the sampler's reference against the learner's; the bounds: the floor times `FACTOR`,
  never tighter than the field thresholds (`calibrated_bounds`). A caller may fix the bounds before the run
  instead (`probe_bounds`).

Live, the measured log-probs are the engines' own (the learner's and the sampler's, `ProbeRun`): P1 holds the
sampler's against the learner's, and each engine's against its own reference, all within the bounds (a learner
whose log-probs are off fails as the learner, where a floor scored against its measurement moved with it). From
snapshots the log-probs are the reference forward of each snapshot (the learner's is its reference). A metric
that is NaN or infinite fails, naming the metric: a comparison NaN passes is a check that cannot fail. What P1
is the documented catch for: a policy the byte checks cannot see (fault `logprobs_at_sampling_temperature`:
every byte right, the sampler's logits scaled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch and the numerics are imported in the checks that compute: pre-flight imports this without them
    import torch

from fp8check.harness.kinds import Quantization
from fp8check.harness.layouts import rank_name, scale_name

from .base import CheckContext, fail, invariant, passed, unknown

PROMPTS = [[1, 17, 42, 99, 7, 300, 5, 812, 64, 3, 1999, 250], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
           [1000, 200, 100, 1500, 33, 47, 2047, 0, 512, 128, 64, 32]]
BOUNDS = {"mean_abs_dlogprob": 0.05, "mult_prob_error_median": 1.1, "kl": 0.01}
FACTOR = 2.5             # bound = floor x FACTOR: room for the real kernels' accumulation order beside the floor


@dataclass(frozen=True)
class ProbeRun:
    """What the engines measured on the probe prompts: the learner's and the sampler's teacher-forced log-probs
    (one tensor per prompt), and the metrics between them."""
    prompts: list
    trainer: list | None
    rollout: list | None
    error: str | None = None            # an engine could not serve the probe (P1 is unknown, never pass)

    @property
    def metrics(self) -> dict | None:
        return None if self.error else probe_metrics(self.trainer, self.rollout)


def prompts_for(vocab_size: int) -> list[list[int]]:
    """The fixed probe prompts, folded into a model's vocabulary."""
    return [[t % vocab_size for t in p] for p in PROMPTS]


def probe_metrics(lp_train: list[torch.Tensor], lp_roll: list[torch.Tensor], advantages: list[torch.Tensor] | None = None,
                  clip_bounds: tuple[float, float] = (0.8, 1.2)) -> dict:
    """Train-rollout mismatch metrics over the same tokens (P1's probe, `fp8check live` and the RL loop's
    per-step metrics all come from here).

    The importance ratio is learner / sampler, exp(lp_train - lp_roll). `token_mult_prob_error` is NeMo-RL's
    token multiplicative probability error, the mean of exp(|dlogprob|) (its median: `mult_prob_error_median`).
    `clip_fraction`: tokens with |ratio - 1| > 0.2. With `advantages` (per token, shaped like the log-probs),
    the PPO clip diagnostics split by advantage sign, for ratio bounds `clip_bounds` = (1 - eps_low,
    1 + eps_high): `clip_fraction_pos`, the share of positive-advantage tokens above the upper bound, and
    `clip_fraction_neg`, the share of negative-advantage tokens below the lower bound -- the tokens whose
    gradient the clipped objective zeroes (nan when there is no token of that sign)."""
    import torch
    t = torch.cat([x.detach().double().cpu() for x in lp_train])
    r = torch.cat([x.detach().double().cpu() for x in lp_roll])
    d = r - t
    ratio = torch.exp(t - r)                       # learner / sampler importance ratio
    err = torch.exp(d.abs())                       # token_mult_prob_error
    out = {"tokens": int(t.numel()), "mean_abs_dlogprob": float(d.abs().mean()), "max_abs_dlogprob": float(d.abs().max()),
           # KL(sampler || learner) on the sampled tokens, k3 estimator: E[(ratio - 1) - log ratio]
           "kl": float(((ratio - 1) - torch.log(ratio)).mean()),
           "ratio_mean": float(ratio.mean()), "ratio_p05": float(ratio.quantile(0.05)),
           "ratio_p50": float(ratio.quantile(0.5)), "ratio_p95": float(ratio.quantile(0.95)),
           "mult_prob_error_median": float(err.median()), "token_mult_prob_error": float(err.mean()),
           "clip_fraction": float(((ratio - 1).abs() > 0.2).double().mean())}
    if advantages is not None:
        a = torch.cat([x.double().cpu() for x in advantages])
        low, high = clip_bounds
        pos, neg = a > 0, a < 0
        out.update({"clip_low": float(low), "clip_high": float(high),
                    "tokens_pos": int(pos.sum()), "tokens_neg": int(neg.sum()),
                    "clip_fraction_pos": float((ratio[pos] > high).double().mean()) if bool(pos.any()) else float("nan"),
                    "clip_fraction_neg": float((ratio[neg] < low).double().mean()) if bool(neg.any()) else float("nan")})
    return out


def calibrated_bounds(reference: dict, factor: float = FACTOR) -> dict:
    """Bounds from a reference's metrics (P1's floor): its numeric difference times `factor`, never tighter than
    the field thresholds. A non-finite reference gives a non-finite bound (which P1 fails on, never passes)."""
    out = {}
    for k, b in BOUNDS.items():
        one = 1.0 if k == "mult_prob_error_median" else 0.0
        v = (reference[k] - one) * factor + one
        out[k] = v if v != v else max(b, v)     # max(b, NaN) is b: a NaN floor must stay NaN
    return out


class _Unavailable(Exception):
    """A value the forward read that cannot be made (its dequantization failed; the cause is chained): P1 says why."""


def _model_values(ctx: CheckContext, values: dict, side: str):
    """HF name -> (shape, make) for every model tensor -> a mapping that makes each value when the forward reads it
    (the forward reads them through a one-layer window: at real shapes a side's fp32 weights are never all held),
    or why they cannot feed the forward (a tensor missing or misshapen)."""
    from fp8check.harness.lazy import LazyMap
    out = {}
    for t in ctx.config.spec.tensors():
        v = values.get(t.name)
        if v is None:
            return f"the {side} lacks {t.name} (see S1/S2)"
        if tuple(v[0]) != tuple(t.shape):
            return f"the {side}'s {t.name} has shape {list(v[0])}, the model needs {list(t.shape)} (see S4)"
        out[t.name] = v
    return LazyMap(list(out), lambda n: out[n][1]())


def _held(v):
    """(shape, make) of a value taken as it is held."""
    return tuple(v.shape), lambda: v


def _dequantized(recipe, codes, scale, reason: str = ""):
    """(shape, make): `make` dequantizes when the forward reads the value; a failure raises `_Unavailable(reason)`
    with the error chained, which the caller turns into P1's reason (as an eager read did)."""
    def make():
        try:
            return recipe.dequantize_weight(codes, scale)
        except (KeyError, ValueError, RuntimeError, IndexError, TypeError) as e:
            raise _Unavailable(reason) from e
    return tuple(codes.shape), make


def _trainer_values(ctx: CheckContext):
    """The trainer's values as `CheckContext.trainer_value` gives them (FP8 dequantized with the trainer's recipe,
    a missing scale: cast), made when read."""
    cfg = ctx.config
    tv = {}
    for t in cfg.spec.tensors():
        v = ctx.trainer.get(t.name)
        if v is None:
            continue
        s = ctx.trainer.get(scale_name(t.name))
        if t.name in cfg.fp8_tensors:
            tv[t.name] = _dequantized(cfg.trainer_recipe, v, s, f"the trainer snapshot lacks {t.name} (see S1/S2)") \
                if s is not None else (tuple(v.shape), v.float)
        else:
            tv[t.name] = _held(v)
    return _model_values(ctx, tv, "trainer snapshot")


def _rollout_act_quant(ctx: CheckContext) -> str:
    return ctx.rollout.meta.act_quant if ctx.rollout is not None and ctx.rollout.meta is not None else "vllm"


def _trainer_act_quant(ctx: CheckContext) -> str:
    return ctx.trainer.meta.act_quant if ctx.trainer.meta is not None else "te"


def _forward(ctx: CheckContext, values: dict, kind: str, prompts, fp8=None, kv=None):
    """The reference forward of `values`; `fp8`: the names whose GEMMs run FP8 (default: the engine's); `kv`: the
    KV cache's quantizer (`_engine_kv`; None: high precision, as the learner's attention)."""
    from fp8check.harness.numerics.forward import Weights, act_quant, prompts_logprobs
    cfg = ctx.config
    fp8 = cfg.engine_fp8_tensors if fp8 is None else fp8
    return prompts_logprobs(cfg.spec, Weights(values, fp8, act_quant(kind, cfg.recipe), kv_quant=kv), prompts,
                            layer_major=True)


def _engine_kv(ctx: CheckContext):
    """The engine's KV cache as declared (`harness.numerics.kv_cache`): its forward reads K and V back from an FP8
    one (the cache's rounding alone moves a perfect engine's log-probs: a floor without it would fail a perfect
    engine whose cache is FP8). None for a high-precision cache; a reason string where a calibrated scale is
    missing."""
    from fp8check.harness.numerics.kv_cache import declared_kv_cache
    return declared_kv_cache(ctx.config, ctx.trainer)


def floor_logprobs(ctx: CheckContext, prompts):
    """The reference forward of a perfect sync's engine: the trainer's bytes through the layout map and the
    engine's declared post-load transform, dequantized, under the engine's declared activation quantizer (or a
    reason string)."""
    from fp8check.harness.numerics.expected import expected_engine_state
    cfg = ctx.config
    if not ctx.trainer.names():
        return "the trainer snapshot holds no tensors"
    post_load = ctx.rollout.meta.post_load if ctx.rollout is not None and ctx.rollout.meta is not None else None
    hf = {n: ctx.trainer[n] for n in ctx.trainer.names()}
    try:
        if cfg.rollout.quantization != Quantization.CHECKPOINT and ctx.payload is not None:
            # an engine given BF16: a perfect one holds the wire as sent (none) or its own rule over it (online)
            from fp8check.harness.numerics.online import online_engine_state_hf
            sent = {n: ctx.payload[n] for n in ctx.payload.names()}
            ideal = online_engine_state_hf(cfg, sent) if cfg.engine_online else sent
        else:
            ideal = _proven_ideal(ctx) if holds_expected(ctx) else None
            if ideal is None:
                ideal = cfg.layout.vllm_to_hf(expected_engine_state(cfg, hf, post_load))
        vals = {n: _dequantized(cfg.engine_recipe, ideal[n], ideal[scale_name(n)])
                if n in cfg.engine_fp8_tensors else _held(ideal[n])
                for n in (t.name for t in cfg.spec.tensors()) if n in ideal}
    except (KeyError, ValueError, RuntimeError, IndexError, TypeError) as e:
        return f"the trainer's bytes do not map onto the engine's layout ({e.__class__.__name__}: {e}; see S1/S4)"
    vals = _model_values(ctx, vals, "perfect-sync engine")
    if isinstance(vals, str):
        return vals
    kv = _engine_kv(ctx)
    if isinstance(kv, str):
        return kv
    try:
        return _forward(ctx, vals, _rollout_act_quant(ctx), prompts, kv=kv)
    except _Unavailable as e:
        c = e.__cause__
        return f"the trainer's bytes do not map onto the engine's layout ({c.__class__.__name__}: {c}; see S1/S4)"


def holds_expected(ctx: CheckContext) -> bool:
    """The rollout snapshot is a perfect sync's engine: the capture's digests proved every parameter the layout
    says the engine holds (`Snapshot.proof`), so the rollout's reference forward is the floor's, the same
    function of the same bytes, and is computed once."""
    r, cfg = ctx.rollout, ctx.config
    proof = r.proof if r is not None else None
    if proof is None or cfg.rollout.quantization != Quantization.CHECKPOINT:
        return False
    tp = cfg.rollout.tp_size
    want = {rank_name(n, k, tp) for k in range(tp) for n in cfg.layout.vllm_param_shapes(k)}
    return set(r.names()) == want and set(proof.matched) >= want


def _proven_ideal(ctx: CheckContext) -> dict | None:
    """A perfect sync's engine in checkpoint coordinates as the trainer's own tensors (`CheckContext.expected_hf`:
    no fused parameter built), or None where one of them cannot be made that way."""
    names = [n for t in ctx.config.spec.tensors() for n in (t.name, scale_name(t.name))
             if n == t.name or t.name in ctx.config.engine_fp8_tensors]
    out = {n: ctx.expected_hf(n) for n in names}
    return None if any(v is None for v in out.values()) else out


def _rollout_values(ctx: CheckContext):
    """The rollout snapshot's values in checkpoint coordinates (FP8 dequantized with the engine's recipe), made
    when read, or why they cannot feed the forward."""
    cfg, rhf, rv = ctx.config, ctx.rollout_hf, {}
    for t in cfg.spec.tensors():
        n = t.name
        if n not in rhf:
            continue
        if n in cfg.engine_fp8_tensors:
            if scale_name(n) not in rhf:
                continue
            rv[n] = _dequantized(cfg.engine_recipe, rhf[n], rhf[scale_name(n)],
                                 f"the rollout snapshot lacks {n} (see S1/S2)")
        else:
            rv[n] = _held(rhf[n])
    return _model_values(ctx, rv, "rollout snapshot")


def trainer_logprobs(ctx: CheckContext, prompts, values=None):
    """The learner's reference: the reference forward of the trainer snapshot's bytes under the trainer's
    activation quantizer (FP8 GEMMs where the trainer runs FP8), or a reason string. `values`: the trainer's
    values already made (`_trainer_values`)."""
    tv = _trainer_values(ctx) if values is None else values
    if isinstance(tv, str):
        return tv
    try:
        return _forward(ctx, tv, _trainer_act_quant(ctx), prompts, ctx.config.trainer_fp8_tensors)
    except _Unavailable as e:
        return str(e)


def snapshot_logprobs(ctx: CheckContext, prompts, rollout=None):
    """(trainer, rollout) log-probs on `prompts` from the snapshots' own reference forwards, or a reason string.
    FP8 weights enter the forward dequantized; high-precision ones as held (BF16, cast to fp32 where the forward
    uses them: at real shapes an fp32 copy of both vocabulary matrices would be 5 GB per side). `rollout`: the
    rollout side's log-probs already computed (`holds_expected`: the floor's)."""
    tv = _trainer_values(ctx)
    if isinstance(tv, str):
        return tv
    rv = _rollout_values(ctx) if rollout is None else None
    if isinstance(rv, str):
        return rv
    kv = _engine_kv(ctx) if rollout is None else None
    if isinstance(kv, str):
        return kv
    lt = trainer_logprobs(ctx, prompts, tv)
    if isinstance(lt, str):
        return lt
    try:
        return lt, rollout if rollout is not None else _forward(ctx, rv, _rollout_act_quant(ctx), prompts, kv=kv)
    except _Unavailable as e:
        return str(e)


def _not_finite(d: dict) -> list[str]:
    import math
    return [k for k in BOUNDS if not isinstance(d.get(k), (int, float)) or not math.isfinite(d[k])]


@invariant("P1", "probes", "policy probe",
           "on fixed prompts the sampler's log-probs match the learner's, and each engine's match its own reference "
           "forward (the trainer's bytes; a perfect sync's engine): mean |dlogprob|, token_mult_prob_error median "
           "and KL finite and within bounds derived per sync from those two references (their gap x"
           f"{FACTOR}), never tighter than 0.05 / 1.1 / 0.01",
           needs=("trainer", "rollout"), source="fp8check's own",
           why="a policy the byte checks cannot see -- the sampler's logits scaled by a temperature, an engine "
               "numeric the config does not declare -- shows only in what the engine computes; P1 is the backstop "
               "behind the S and C families, never the only line of defence",
           periodic=True)       # two reference forwards of the whole model (and the engines' own probe, live)
def p1_probe(ctx: CheckContext):
    run: ProbeRun | None = ctx.probes
    prompts = run.prompts if run is not None else prompts_for(ctx.config.spec.vocab_size)
    if run is not None and run.error:
        return [unknown("P1", f"the engines could not serve the probe prompts: {run.error}")]
    ideal = None
    if run is not None:
        lt, lr, source = run.trainer, run.rollout, "measured by the engines"
    else:
        if holds_expected(ctx):      # the rollout's forward is the floor's: one forward instead of two
            ideal = floor_logprobs(ctx, prompts)
        got = snapshot_logprobs(ctx, prompts, None if ideal is None or isinstance(ideal, str) else ideal)
        if isinstance(got, str):
            return [unknown("P1", f"cannot run the probe forward: {got}")]
        (lt, lr), source = got, "reference forward of the snapshots"
    m = probe_metrics(lt, lr)
    bounds, floor, sides = ctx.probe_bounds, None, {}
    if bounds is None:
        ideal = ideal if ideal is not None else floor_logprobs(ctx, prompts)
        if isinstance(ideal, str):
            return [unknown("P1", f"no independent reference to bound the probe: {ideal}", metrics=m)]
        ref = lt
        if run is not None:       # the learner's log-probs are measured: its reference is computed, never them
            ref = trainer_logprobs(ctx, prompts)
            if isinstance(ref, str):
                return [unknown("P1", f"no independent reference for the learner's log-probs: {ref}", metrics=m)]
            sides = {"learner": ("the learner's log-probs against the reference forward of its own bytes",
                                 probe_metrics(ref, lt)),
                     "sampler": ("the sampler's log-probs against the reference forward of a perfect sync's engine",
                                 probe_metrics(ideal, lr))}
        floor = probe_metrics(ref, ideal)
        bounds = calibrated_bounds(floor)
    ev = {"metrics": m, "bounds": bounds, "floor": floor, "source": source,
          **{k: v for k, (_, v) in sides.items()}}
    judged = [("the sampler's log-probs against the learner's", m)] + list(sides.values())

    def not_finite(what, x):
        bad = _not_finite(x)
        return [fail("P1", None, f"{', '.join(bad)} = {', '.join(repr(x.get(k)) for k in bad)}: {what} are not "
                     "finite (NaN or infinite weights, scales or logits)", **ev)] if bad else []
    # the measurement, then the references (a non-finite one is the bound's), then each engine against its own
    out = not_finite(*judged[0])
    bad = _not_finite(bounds)
    if not out and bad:
        out = [fail("P1", None, f"the reference bound for {', '.join(bad)} is not finite: the trainer's own bytes "
                    "give non-finite log-probs", **ev)]
    for what, x in judged[1:]:
        out = out or not_finite(what, x)
    if out:
        return out
    # `not (x <= b)`: a NaN that slipped past is a failure, never a pass
    out = [fail("P1", None, (f"{k} = {x[k]:.4g} exceeds {bounds[k]:.4g}" +
                             (f" (floor {floor[k]:.4g})" if floor else "")) +
                ("" if i == 0 else f": {what}"), **ev)
           for i, (what, x) in enumerate(judged) for k in BOUNDS if not x[k] <= bounds[k]]
    return out or [passed("P1", f"mean |dlogprob| {m['mean_abs_dlogprob']:.2e} (bound {bounds['mean_abs_dlogprob']:.2e}), "
                                f"KL {m['kl']:.2e}, ratio [{m['ratio_p05']:.4f}, {m['ratio_p95']:.4f}]"
                                + ("; each engine within it of its own reference" if sides else ""), **ev)]
