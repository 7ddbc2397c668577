"""S family: the seven conditions every weight sync must preserve (docs/design.md, the catalog).

Every check is a pure function of (config, payload, trainer snapshot, rollout snapshot [+ master]) and the typed
records beside them (harness.record); the rollout is compared in checkpoint coordinates after undoing the layout
the config declares and applying the post-load transform the engine declares. No engine code is imported.
S3's screens (computed over every scale and FP8 weight at once, and begun by the pipeline beside the install) are
`invariants.screens`; S2, S3, S4 take the `ScreenMode` their flags reach the host by (harness.bitview).
"""
from __future__ import annotations

import copy
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # torch and the numerics are imported in the checks that compute: pre-flight imports this without them
    import torch

    from fp8check.harness.bitview import ScreenMode

from fp8check.harness.kinds import ScaleFormat
from fp8check.harness.layouts import engine_module, is_scale_name, rank_name, scale_name, split_rank_name, weight_of_scale
from fp8check.harness.memo import IdentityMemo
from .base import FAIL, CheckContext, fail, invariant, passed, unknown
from .evidence import bit_diff, engine_position, screened, unravel, value_diff
from .screens import ScaleEncodings, TrainerScreens, zero_block_screen

MAX_FINDINGS = 20     # per invariant; the rest are counted in a summary finding


def _cap(inv_id: str, findings: list):
    """At most MAX_FINDINGS findings, then one summary of the rest carrying their worst verdict (unknowns summed
    up stay unknown: a long list of what could not be judged is not a violation)."""
    if len(findings) > MAX_FINDINGS:
        rest = findings[MAX_FINDINGS:]
        if any(f.verdict == FAIL for f in rest):
            more = fail(inv_id, None, f"... and {len(rest)} more violations")
        else:
            more = unknown(inv_id, f"... and {len(rest)} more that cannot be judged")
        findings = findings[:MAX_FINDINGS] + [more]
    return findings


def _sentinels(t: torch.Tensor) -> tuple[int | None, int]:
    """(flat index of the first element still holding the poison bytes, how many do), chunk by chunk."""
    from fp8check.harness.bitview import CHUNK, first_difference
    from fp8check.harness.formats.bytes import any_sentinel, is_sentinel
    flat = t.reshape(-1)
    # a chunk without poison (the common case) needs no elementwise mask
    return first_difference((a, is_sentinel(flat[a:a + CHUNK]).reshape(-1)) for a in range(0, flat.numel(), CHUNK)
                            if any_sentinel(flat[a:a + CHUNK]))


def _evidence(out: list) -> bool:
    """Evidence (first difference, counts) only for the findings the cap keeps."""
    return len(out) < MAX_FINDINGS


def _where(ctx: CheckContext, name: str, ev: dict | None) -> dict:
    if ev and "index" in ev:
        tp = ctx.config.rollout.tp_size
        pos = engine_position([ctx.config.layout.vllm_load_pieces(r) for r in range(tp)], name, ev["index"], tp)
        if pos:
            ev = {**ev, "rollout": pos}
    return ev or {}


def _fp8_names(ctx: CheckContext) -> tuple[str, ...]:
    return ctx.config.fp8_tensor_names


def _layout_params(ctx: CheckContext) -> dict[str, tuple]:
    """Every rank-named parameter (and scale) the layout says the engine holds -> its engine-local shape."""
    cfg = ctx.config
    return {rank_name(n, r, cfg.rollout.tp_size): tuple(shp) for r in range(cfg.rollout.tp_size)
            for n, shp in cfg.layout.vllm_param_shapes(r).items()}


# what the declared transform changes in the trainer's values (S3), by the identity of the tensors it reads
_TRANSFORM_DIFF = IdentityMemo(0)


# -- S1 -----------------------------------------------------------------------------------------------------------
def _misnamed_scales(ctx: CheckContext, counts, want) -> dict:
    """Scales the wire carries under another stack's naming (`harness.layouts.scale_names`): {sent name: the
    declared scale it stands for, ..., "finding": the one finding that names the expected naming}; {} when none.
    One finding for all of them: they are one mistake, and the "not sent" / "unknown" pairs it explains are not
    reported again."""
    from fp8check.harness.layouts.scale_names import CANONICAL, misnamed_scale
    if not counts:
        return {}
    gran, out, want_name = ctx.config.recipe.granularity, {}, None
    for n in counts:
        m = misnamed_scale(n, gran) if n not in want else None
        if m is not None and m[0] + CANONICAL in want:
            out[n] = m[0] + CANONICAL
            want_name = want_name or (n, m[1], m[2])
    if not out:
        return {}
    sent, expected, dtype = want_name
    out["finding"] = fail(
        "S1", sent, f"{len(out)} scale tensor(s) sent under a name the {ctx.config.recipe.name} wire does not use "
        f"(e.g. {sent}): vLLM 0.26 loads this recipe's scales as {expected} ({dtype}); rename them (the engine "
        f"has no parameter by the sent name)", stage="naming", expected=expected, dtype=dtype, count=len(out),
        sent=sorted(out)[:8])
    return out


@invariant("S1", "sync", "coverage",
           "every parameter and scale the sampler reads is written by this sync exactly once; nothing unknown is "
           "sent; no destination keeps its dummy, previous or poisoned value", needs=("rollout",),
           source="fp8check's own")
def s1_coverage(ctx: CheckContext):
    """The wire half needs the payload record; a sync fp8check did not carry (check_sync on a user's engine) is
    judged on the engine half alone."""
    from fp8check.harness.sync.payload import expected_wire
    out = []
    want = expected_wire(ctx.config)
    meta, rec = ctx.payload.meta if ctx.payload is not None else None, ctx.rollout.meta
    counts = Counter(r.name for r in meta.records) if meta is not None else None
    misnamed = _misnamed_scales(ctx, counts, want)
    if misnamed:
        out.append(misnamed.pop("finding"))
    for n in want if counts is not None else ():
        if counts[n] == 0 and n not in misnamed.values():
            out.append(fail("S1", n, "declared tensor not sent by this sync", stage="wire"))
        elif counts[n] > 1:
            out.append(fail("S1", n, f"sent {counts[n]} times (must be exactly once)", stage="wire"))
    for n in counts or ():
        if n not in want and n not in misnamed:
            out.append(fail("S1", n, "sent but unknown to the config's layout (no destination)", stage="wire"))
    rcv = meta.receive if meta is not None else None
    for n in (rcv.dropped if rcv else []):
        out.append(fail("S1", n, "sent but not delivered to the engine (truncated or failed its digest)",
                        stage="transport"))
    for e in (rcv.decode_errors if rcv else []):
        out.append(fail("S1", None, f"transport: {e}", stage="transport"))
    # the engine's parameters against the layout: every one written, none the trainer cannot fill
    known = _layout_params(ctx)
    held = set(ctx.rollout.names())
    for k in sorted(set(known) - held - set(rec.unmaterialized)):
        out.append(fail("S1", k, f"engine parameter {k} is absent: the engine state holds no such tensor (never "
                                 f"written by this sync, or missing from the snapshot)", stage="engine"))
    for k in sorted(held - set(known)):
        out.append(fail("S1", k, f"the engine holds {k}, which no trainer tensor maps to (not in the layout map)",
                        stage="engine"))
    # poisoned destinations: every byte 0xFF survives only where no sync wrote
    if rec.poisoned:
        from fp8check.harness.formats.bytes import sentinel_flags
        names = list(ctx.rollout.names())
        # a parameter the capture's digests proved holds the expected bytes, screened in the digests' own pass
        proof = ctx.rollout.proof
        proven = set(proof.matched) if proof is not None else set()
        read = [k for k in names if k not in proven]
        hits = dict(zip(read, sentinel_flags(ctx.rollout[k] for k in read)))    # one screen, then detail
        if proof is not None:
            hits.update((k, True) for k in proof.sentinel)
        for k in (k for k in names if hits.get(k)):
            t = ctx.rollout[k]
            first, count = _sentinels(t)
            if count:
                out.append(fail("S1", k, "poisoned destination survived the sync (no sync wrote these elements)",
                                stage="engine", index=unravel(first, t.shape), count=count, total=t.numel()))
    for k in rec.unmaterialized:
        out.append(fail("S1", k, "engine parameter left on the meta device by the reload (never materialized: the "
                                 "kernels have no weights here)", stage="engine"))
    last = rec.last_update
    if last is not None:
        for mod in last.untouched:
            out.append(fail("S1", mod, "engine module received no weights in this update", stage="engine"))
        for mod in last.partial:
            out.append(fail("S1", mod, "engine module only partly written (finished with uninitialised rows)",
                            stage="engine"))
        for n in last.dropped_loads:
            out.append(fail("S1", n, "load arrived after its module was complete and was dropped "
                                     "(duplicate or out-of-order tensor)", stage="engine"))
    if not out:
        if meta is None:
            return [passed("S1", f"every one of {len(known)} engine parameters held, none unknown (no wire record)")]
        return [passed("S1", f"{len(want)} tensors sent exactly once, all destinations written")]
    return _cap("S1", out)


# -- S2 -----------------------------------------------------------------------------------------------------------
def _requantized(cfg, trainer_tensor) -> str:
    """Why codes differ by design: the engine quantizes what it receives (the config says so), or holds BF16."""
    q = cfg.rollout.quantization
    if q == "checkpoint":
        return ""
    learner = "BF16" if trainer_tensor.element_size() != 1 else f"FP8 on {cfg.trainer_recipe.name}"
    engine = "serves BF16" if q == "none" else f"quantizes the BF16 it receives itself ({q})"
    return f": the engine {engine}, the learner holds {learner}; the sampler is off the learner's policy"


@invariant("S2", "sync", "code identity",
           "the E4M3 codes the sampler's kernels read equal the learner's FP8 forward weights byte for byte "
           "(after undoing the engine's declared layout)", needs=("trainer", "rollout"),
           source="fp8check's own")
def s2_codes(ctx: CheckContext, screen: ScreenMode | None = None):
    """`screen`: how the comparisons' flags reach the host (harness.bitview.ScreenMode; None: production's
    BY_DEVICE); the findings are the same under either."""
    from fp8check.harness.bitview import ScreenMode, differs
    screen = screen or ScreenMode.BY_DEVICE
    out, n_checked, steps = [], 0, []
    rhf = ctx.rollout_hf
    for n in _fp8_names(ctx):
        t = ctx.trainer.get(n)
        if t is None:
            steps.append(unknown("S2", "trainer snapshot lacks this FP8 weight", tensor=n))
            continue
        if ctx.payload is not None and ctx.config.fp8_on_wire and n in ctx.payload and n not in ctx.wire_verified:
            def wire_diff(out, n=n, t=t, w=ctx.payload[n]):
                ev = bit_diff(t, w, _evidence(out))
                return fail("S2", n, "codes on the wire differ from the trainer's", stage="wire", **ev) if ev else None
            steps.append((differs(t, ctx.payload[n], screen), wire_diff))
        r = rhf.get(n)
        if r is None:
            steps.append(fail("S2", n, "the engine holds no codes for this weight: " +
                              ctx.rollout_hf_errors.get(n, "not in the rollout"), stage="engine"))
            continue
        ek = ctx.expected_kernel(n) if scale_name(n) in ctx.trainer else (t, None, False)
        if ek is None:
            steps.append(unknown("S2", f"trainer codes {list(t.shape)} cannot take the engine's declared post-load "
                                       f"transform (not a block-quantized weight)", tensor=n))
            continue
        n_checked += 1
        exp, _, transformed = ek

        def engine_diff(out, n=n, t=t, exp=exp, r=r, transformed=transformed):
            ev = bit_diff(exp, r, _evidence(out))
            if not ev:
                return None
            what = "the trainer's codes after the engine's declared UE8M0 requantization" if transformed \
                else "the trainer's"
            return fail("S2", n, f"codes the sampler reads differ from {what}{_requantized(ctx.config, t)}",
                        stage="engine", **_where(ctx, n, ev))
        steps.append((differs(exp, r, screen), engine_diff))
    screened(steps, out)
    if not out:
        if not n_checked:
            return [unknown("S2", "nothing to check: no FP8 weight in both the trainer and the rollout snapshot")]
        return [passed("S2", f"{n_checked} FP8 weights byte-identical")]
    return _cap("S2", out)


# -- S3 -----------------------------------------------------------------------------------------------------------
def _scale_values(t: torch.Tensor) -> torch.Tensor:
    from fp8check.harness.formats import E8M0
    if t.dtype == E8M0:
        from fp8check.harness.formats import e8m0_to_float
        return e8m0_to_float(t)
    return t.float()


def diagnose_scale(expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    import torch
    from fp8check.harness.formats import is_pow2
    if expected.shape != actual.shape:
        return None
    e, a = _scale_values(expected), _scale_values(actual)
    if bool(is_pow2(a).all()) and not bool(is_pow2(e).all()):
        return "scales were requantized to powers of two (UE8M0) on the way: FP32 scales need VLLM_USE_DEEP_GEMM_E8M0=0"
    if torch.allclose(a * e, torch.ones_like(e), rtol=1e-6):
        return "scale and scale_inv swapped (one convention: weight_scale_inv multiplies to dequantize)"
    if e.dim() == 2 and e.shape[0] == e.shape[1] and torch.equal(a, e.t()):
        return "block grid transposed"
    ne = a != e
    if bool(ne.any()):
        ratio = (a[ne] / e[ne]).unique()
        if ratio.numel() == 1 and bool(is_pow2(ratio).all()):
            return f"{int(ne.sum())} block scale(s) multiplied by {float(ratio[0]):g}"
    return None


@invariant("S3", "sync", "scale identity and encoding",
           "scale bits equal; weight_scale_inv multiplies to dequantize; the representable set is kept "
           "(power-of-two mode has integral log2, E8M0 bias and zero-block byte right, no FP32 -> UE8M0 "
           "requantization on the way)", needs=("trainer", "rollout"),
           source="fp8check's own")
def s3_scales(ctx: CheckContext, screen: ScreenMode | None = None):
    """`screen`: how the screens' and comparisons' flags reach the host (harness.bitview.ScreenMode; None:
    production's BY_DEVICE); the findings are the same under either."""
    import torch
    from fp8check.harness.bitview import ScreenMode, differs
    screen = screen or ScreenMode.BY_DEVICE
    from fp8check.harness.formats import E8M0, is_pow2
    from fp8check.harness.formats.zero_blocks import wrong_zero_blocks
    out, n_checked, steps = [], 0, []
    recipe = ctx.config.recipe
    rhf = ctx.rollout_hf
    ahead = ctx.screens if isinstance(ctx.screens, TrainerScreens) and ctx.screens.config is ctx.config else None
    encodings = ScaleEncodings(ctx, recipe, ahead, screen)
    zero_blocks = zero_block_screen(ctx, recipe, ahead, screen)
    for n in _fp8_names(ctx):
        sn = scale_name(n)
        t = ctx.trainer.get(sn)
        if t is None:
            steps.append(unknown("S3", "trainer snapshot lacks this scale", tensor=sn))
            continue
        # encoding of the trainer's (and the wire's) scales under the declared recipe
        for stage, s in (("trainer", t), ("wire", ctx.payload.get(sn) if ctx.payload is not None else None)):
            if s is None or (stage == "wire" and not ctx.config.fp8_on_wire):
                continue
            if recipe.scale_format == ScaleFormat.E8M0:
                if s.dtype != E8M0:
                    steps.append(fail("S3", sn, f"{stage}: E8M0 scales declared, got {s.dtype}", stage=stage))
                else:
                    steps.append((encodings.e8m0_nan(s), lambda out, sn=sn, stage=stage: fail(
                        "S3", sn, f"{stage}: E8M0 NaN byte 0xFF in scales", stage=stage)))
                continue

            def non_positive(out, sn=sn, stage=stage, s=s):
                v = s.float()
                bad = ~(torch.isfinite(v) & (v > 0))
                return fail("S3", sn, f"{stage}: non-positive or non-finite scale_inv", stage=stage,
                            index=[int(i) for i in bad.nonzero()[0]], value=float(v[bad][0]))
            steps.append((encodings.non_positive(s), non_positive))
            if recipe.scale_format == ScaleFormat.POW2:
                def not_pow2(out, sn=sn, stage=stage, s=s):
                    v = s.float()
                    i = (~is_pow2(v)).nonzero()[0]
                    return fail("S3", sn, f"{stage}: power-of-two scales declared, log2 not integral", stage=stage,
                                index=[int(x) for x in i], value=float(v[tuple(i)]))
                # judged only where every scale is finite and positive (the finding above says what is wrong)
                steps.append((encodings.not_pow2(s), not_pow2))
        # TE's rule for the learner's bytes; an engine quantizing online follows vLLM's (amax floored at 1e-4)
        if n in zero_blocks:
            def zero_block(out, sn=sn, t=t, codes=ctx.trainer[n]):
                i = wrong_zero_blocks(codes, t, recipe.block_shape).nonzero()[0]
                return fail("S3", sn, "all-zero block must have scale_inv 1 (TE rule: amax 0 -> scale 1)",
                            stage="trainer", index=[int(x) for x in i], value=float(t.float()[tuple(i)]))
            steps.append((zero_blocks[n], zero_block))
        # the engine's declared post-load transform must keep the representable set: values unchanged
        ek = ctx.expected_kernel(n) if n in ctx.trainer else (None, t, False)
        if ek is None:
            steps.append(unknown("S3", "trainer codes cannot take the engine's declared post-load transform (see S4)",
                                 tensor=sn))
            continue
        e_codes, e_scale, transformed = ek
        if transformed:
            codes = ctx.trainer[n]

            def transform_diff(codes=codes, t=t, e_codes=e_codes, e_scale=e_scale):
                return value_diff(recipe.dequantize_weight(codes, t), recipe.dequantize_weight(e_codes, e_scale))
            # a pure function of the trainer's tensors (shared from sync to sync) and their transform: judged once
            ev = _TRANSFORM_DIFF.get_for(("s3-transform", recipe), (codes, t, e_codes, e_scale), transform_diff)
            ev = copy.deepcopy(ev)
            if ev:
                steps.append(fail("S3", sn, f"the engine's UE8M0 requantization changes {ev['differing']} weight "
                                  f"values: {recipe.scale_format} scales do not survive VLLM_USE_DEEP_GEMM_E8M0=1",
                                  stage="engine", **ev))
        # bit identity, trainer (through the declared transform) -> engine
        r = rhf.get(sn)
        if r is None:
            steps.append(fail("S3", sn, "the engine holds no scale for this weight: " +
                              ctx.rollout_hf_errors.get(sn, "not in the rollout"), stage="engine"))
            continue
        n_checked += 1

        def engine_diff(out, sn=sn, e_scale=e_scale, r=r):
            ev = bit_diff(e_scale, r, _evidence(out))
            if ev:
                why = diagnose_scale(e_scale, r) if _evidence(out) else None
                return fail("S3", sn, why or "scale bits the sampler reads differ from the trainer's",
                            stage="engine", **_where(ctx, sn, ev))
        steps.append((differs(e_scale, r, screen), engine_diff))
        if ctx.payload is not None and ctx.config.fp8_on_wire and sn in ctx.payload and sn not in ctx.wire_verified:
            def wire_diff(out, sn=sn, t=t, w=ctx.payload[sn]):
                ev = bit_diff(t, w, _evidence(out))
                if ev:
                    why = diagnose_scale(t, w) if _evidence(out) else None
                    return fail("S3", sn, why or "scale on the wire differs from the trainer's", stage="wire", **ev)
            steps.append((differs(t, ctx.payload[sn], screen), wire_diff))
    screened(steps, out)
    if not out:
        if not n_checked:
            return [unknown("S3", "nothing to check: no FP8 scale in both the trainer and the rollout snapshot")]
        return [passed("S3", f"{n_checked} scale tensors bit-identical and well-encoded ({recipe.scale_format})")]
    return _cap("S3", out)


# -- S4 -----------------------------------------------------------------------------------------------------------
def diagnose_layout(ctx: CheckContext, name: str, expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    import torch
    if expected.dim() == 2 and expected.shape[0] == expected.shape[1] and torch.equal(actual, expected.t()):
        return "transposed"
    for t in ctx.config.spec.tensors():           # only same-shape tensors can have been swapped in
        if t.name != name and tuple(t.shape) == tuple(expected.shape):
            oe = ctx.trainer_value(t.name)
            if oe is not None and torch.equal(oe, actual):
                return f"holds the values of {t.name} (swapped or mis-mapped)"
    if expected.dim() == 2 and expected.shape[0] % 128 == 0:
        blocks_e = expected.reshape(-1, 128, expected.shape[1])
        blocks_a = actual.reshape(-1, 128, actual.shape[1])
        perm = []
        for b in blocks_a:
            hit = [i for i, e in enumerate(blocks_e) if torch.equal(b, e)]
            perm.append(hit[0] if hit else None)
        if None not in perm and perm != list(range(len(perm))):
            return f"128-row blocks permuted: rollout block i holds trainer block {perm}"
    return None


@invariant("S4", "sync", "layout, shape and fusion",
           "unpadded block grid [ceil(N/128), ceil(K/128)] on the wire; fused q|k|v, gate|up, TP shards and "
           "expert ids where the kernel expects them: dequantized rollout weight == dequantized trainer weight "
           "in checkpoint coordinates", needs=("trainer", "rollout"),
           source="fp8check's own")
def s4_layout(ctx: CheckContext, screen: ScreenMode | None = None):
    """`screen`: how the value screens' flags reach the host (harness.bitview.ScreenMode; None: production's
    BY_DEVICE); the findings are the same under either."""
    from fp8check.harness.formats import E8M0
    out, n_checked = [], 0
    cfg, recipe = ctx.config, ctx.config.recipe
    # wire shapes: weights as in the checkpoint, scales on the unpadded grid
    if ctx.payload is not None:
        hf_shapes = cfg.layout.hf_shapes
        for r in ctx.payload.meta.records:
            n, shp = r.name, tuple(r.shape)
            if is_scale_name(n):
                w = weight_of_scale(n)
                if w in hf_shapes and shp != recipe.scale_grid(hf_shapes[w]):
                    out.append(fail("S4", n, f"scale grid {list(shp)} on the wire, expected the unpadded "
                                             f"{list(recipe.scale_grid(hf_shapes[w]))}", stage="wire"))
            elif n in hf_shapes and shp != tuple(hf_shapes[n]):
                out.append(fail("S4", n, f"shape {list(shp)} on the wire, checkpoint shape is {list(hf_shapes[n])}",
                                stage="wire"))
            got = tuple(ctx.payload.describe(n)[0]) if n in ctx.payload else shp
            if got != shp:                # the bytes themselves, as S5 holds their dtype to the record's
                out.append(fail("S4", n, f"manifest says shape {list(shp)}, bytes arrived as {list(got)}",
                                stage="transport", record_shape=list(shp), received_shape=list(got)))
    # engine shapes per rank
    for k in ctx.rollout.names():
        rank, n = split_rank_name(k)
        want = cfg.layout.vllm_param_shapes(rank).get(n) if rank < cfg.rollout.tp_size else None
        shape = ctx.rollout.describe(k)[0]
        if want is not None and tuple(shape) != tuple(want):
            out.append(fail("S4", k, f"engine parameter shape {list(shape)}, layout expects "
                                     f"{list(want)}", stage="engine"))
    # values in checkpoint coordinates: identical bits are identical values (screened at once, no dequantization);
    # the others are dequantized and compared
    from fp8check.harness.bitview import ScreenMode, any_of, differs
    screen = screen or ScreenMode.BY_DEVICE
    rhf, steps = ctx.rollout_hf, []
    for spec in cfg.spec.tensors():
        n = spec.name
        if n not in ctx.trainer:
            continue
        r = rhf.get(n)
        if r is None:
            steps.append(fail("S4", n, "not in the rollout in checkpoint coordinates: " +
                              ctx.rollout_hf_errors.get(n, "missing"), stage="engine"))
            continue
        sn = scale_name(n)
        reference = ctx.trainer[n]
        if n in cfg.split_tensors:
            # the trainer's FP8 against the engine's high precision is the declared split (S6's): the engine's layout
            # of this member is judged against what the sync sent
            reference = ctx.payload.get(n) if ctx.payload is not None else None
            if reference is None:
                continue
        if n not in cfg.fp8_tensors:
            scale_differs = False
        elif sn in ctx.trainer and sn in rhf:
            scale_differs = differs(ctx.trainer[sn], rhf[sn], screen)
        else:
            scale_differs = True
        n_checked += 1

        def values(out, n=n, r=r, reference=reference):
            try:
                er = cfg.engine_recipe              # the engine's grid (per tensor on an online per-tensor engine)
                e = ctx.trainer_value(n) if n in cfg.fp8_tensors else reference
                if n in cfg.engine_fp8_tensors:
                    a = er.dequantize_weight(r, rhf[scale_name(n)].to(er.scale_dtype)
                                             if er.scale_dtype == E8M0 else rhf[scale_name(n)].float())
                else:
                    a = r                           # compared as fp32 chunk by chunk (value_diff)
            except (KeyError, ValueError, RuntimeError, IndexError) as ex:
                return fail("S4", n, f"cannot dequantize in checkpoint coordinates: {ex}", stage="engine")
            if e is None:
                return unknown("S4", "the trainer's tensor cannot be dequantized (wrong shape or dtype)", tensor=n)
            ev = value_diff(e, a, _evidence(out))
            if ev:
                why = diagnose_layout(ctx, n, e.float(), a.float()) if _evidence(out) else None
                return fail("S4", n, "dequantized rollout weight differs from the trainer's" +
                            (f": {why}" if why else ""), stage="engine", **_where(ctx, n, ev))
        steps.append((any_of(differs(reference, r, screen), scale_differs), values))
    screened(steps, out)
    if not out:
        if not n_checked:
            return [unknown("S4", "nothing to check: no tensor in both the trainer and the rollout snapshot")]
        return [passed("S4", f"{n_checked} tensors equal in checkpoint coordinates")]
    return _cap("S4", out)


# -- S5 -----------------------------------------------------------------------------------------------------------
def _engine_holds(ctx: CheckContext, name: str) -> str | None:
    """What the engine's module for checkpoint tensor `name` runs in, from the engine's own record ("FP8" or
    "BF16"); None where the record does not say. A wire finding names it: "sent bfloat16; the engine holds FP8"
    is the root of the S2/S4 failures that follow on the engine side."""
    meta = ctx.rollout.meta if ctx.rollout is not None else None
    if meta is None or meta.fp8_modules is None:
        return None
    mods = {engine_module(p.dst) for p in ctx.config.layout.vllm[0] if p.src == name}
    return ("FP8" if mods & set(meta.fp8_modules) else "BF16") if mods else None


def _dtype(s: str) -> str:
    return s.removeprefix("torch.")


@invariant("S5", "sync", "dtypes",
           "float8_e4m3fn where FP8 is declared (not e5m2, not fnuz), fp32 / e8m0 scales as declared, BF16 "
           "exactly where high precision is declared (float32 in the engine where its model class holds the "
           "parameter so, e.g. the gated delta-net's A_log); no silent BF16 fallback; every tensor arrives with the "
           "dtype it was sent with", needs=("rollout",),
           source="fp8check's own")
def s5_dtypes(ctx: CheckContext):
    from fp8check.harness.sync.payload import expected_wire
    out = []
    cfg = ctx.config
    want = {n: _dtype(str(dt)) for n, (_, dt) in expected_wire(cfg).items()}
    if ctx.payload is not None:
        for r in ctx.payload.meta.records:
            n = r.name
            if n in want and _dtype(r.dtype) != want[n]:
                held = _engine_holds(ctx, n)
                out.append(fail("S5", n, f"sent {_dtype(r.dtype)}, declared {want[n]}"
                                         + (f"; the engine holds {held}" if held else ""), stage="wire",
                                expected=want[n], actual=r.dtype))
            if n in ctx.payload and _dtype(str(ctx.payload[n].dtype)) != _dtype(r.dtype):
                out.append(fail("S5", n, f"manifest says {r.dtype}, bytes arrived as {ctx.payload[n].dtype}",
                                stage="transport"))
    if ctx.trainer is not None:
        for n, dt in want.items():
            if n in cfg.split_tensors and cfg.trainer_fp8:
                dt = _dtype(str(cfg.trainer_recipe.fp8_dtype))      # the trainer's side of a declared split (S6)
            if cfg.fp8_on_wire and n in ctx.trainer and _dtype(str(ctx.trainer[n].dtype)) != dt:
                out.append(fail("S5", n, f"trainer holds {ctx.trainer[n].dtype}, declared {dt}", stage="trainer"))
    fp8_params = cfg.layout.fp8_vllm
    known = _layout_params(ctx)
    for k in ctx.rollout.names():
        if k not in known:
            continue                    # S1 reports tensors the layout does not know
        _, n = split_rank_name(k)
        if is_scale_name(n):
            exp = _dtype(str(cfg.engine_recipe.scale_dtype)) if weight_of_scale(n) in fp8_params else None
        else:
            exp = _dtype(str(cfg.engine_recipe.fp8_dtype)) if n in fp8_params else cfg.layout.engine_dtype(n)
        got = _dtype(str(ctx.rollout.describe(k)[1]))
        if exp is None:
            out.append(fail("S5", k, "engine holds a scale for a tensor declared high precision", stage="engine",
                            actual=got))
        elif got != exp:
            out.append(fail("S5", k, f"engine holds {got}, declared {exp}", stage="engine", expected=exp, actual=got))
    return _cap("S5", out) if out else [passed("S5", "all dtypes as declared")]


# -- S6 -----------------------------------------------------------------------------------------------------------
def expected_fp8_modules(cfg) -> set[str]:
    return {engine_module(p.dst) for p in cfg.layout.vllm[0] if p.src in cfg.engine_fp8_tensors}


@invariant("S6", "sync", "exclusion agreement",
           "the high-precision set is identical in the trainer, on the wire and in the engine's ignored_layers "
           "(exact names; fused shards share one scheme), all derived from the one config", needs=("rollout",),
           source="fp8check's own")
def s6_exclusion(ctx: CheckContext):
    from fp8check.harness.sync.payload import ROLE_FP8, ROLE_HP
    out = []
    cfg = ctx.config
    from fp8check.harness.record import ENGINE_RULE
    if cfg.trainer_fp8:
        # the exclusion differs per side by declaration: the trainer quantizes the fused GEMM whole
        from .exclusion import split_message
        for gemm, members in cfg.trainer_splits.items():
            out.append(fail("S6", gemm, split_message(cfg, gemm, list(members)), stage="config",
                            members=list(members)))
    if ctx.trainer is not None and getattr(ctx.trainer.meta, "engine", None) != ENGINE_RULE:
        # (a reference made by an online engine's own rule holds the engine's FP8 set: nothing of the learner's)
        t_fp8 = {n for n in ctx.trainer.names() if not is_scale_name(n)
                 and ctx.trainer[n].element_size() == 1 and ctx.trainer[n].is_floating_point()}
        for n in sorted(t_fp8 - cfg.trainer_fp8_tensors):
            out.append(fail("S6", n, "trainer quantizes a tensor the config keeps in high precision", stage="trainer"))
        for n in sorted(cfg.trainer_fp8_tensors - t_fp8):
            if n in ctx.trainer:
                out.append(fail("S6", n, "trainer keeps in high precision a tensor the config declares FP8",
                                stage="trainer"))
    if ctx.payload is not None and cfg.fp8_on_wire:
        wire_hp = {r.name for r in ctx.payload.meta.records if r.role == ROLE_HP}
        wire_fp8 = {r.name for r in ctx.payload.meta.records if r.role == ROLE_FP8}
        for n in sorted(wire_hp & cfg.fp8_tensors):
            held = _engine_holds(ctx, n)
            out.append(fail("S6", n, "sent as high precision, config declares FP8"
                                     + (f"; the engine holds {held}" if held else ""), stage="wire"))
        sent = {r.name for r in ctx.payload.meta.records}
        for n in sorted(wire_fp8 & cfg.high_precision):
            what = "FP8 + scale_inv" if scale_name(n) in sent else "FP8"
            held = _engine_holds(ctx, n)
            out.append(fail("S6", n, f"sent as {what}, config declares high precision"
                                     + (f"; the engine keeps {held}" if held else ""), stage="wire"))
    meta = ctx.rollout.meta
    if meta.ignored_layers is None or meta.fp8_modules is None:
        out.append(unknown("S6", "the engine record has no ignored_layers / fp8_modules"))
    else:
        got, want = set(meta.ignored_layers), set(cfg.ignored_layers)
        for m in sorted(want - got):
            # (a module the engine's model class builds without a quant method stays BF16 all the same)
            held = {engine_module(p.dst) for p in cfg.layout.vllm[0] if p.src.rsplit(".", 1)[0] == m}
            why = "engine quantizes it" if held & set(meta.fp8_modules) else "the engine builds it unquantized all the same"
            out.append(fail("S6", m, f"missing from the engine's ignored_layers ({why})", stage="engine"))
        for m in sorted(got - want):
            out.append(fail("S6", m, "in the engine's ignored_layers but FP8 in the config", stage="engine"))
        e_fp8, c_fp8 = set(meta.fp8_modules), expected_fp8_modules(cfg)
        for m in sorted(e_fp8 - c_fp8):
            out.append(fail("S6", m, "engine module is FP8, config keeps it in high precision", stage="engine"))
        for m in sorted(c_fp8 - e_fp8):
            out.append(fail("S6", m, "engine module is high precision, config declares FP8", stage="engine"))
    return _cap("S6", out) if out else [passed("S6", f"{len(cfg.high_precision)} high-precision tensors agree")]


# -- S7 -----------------------------------------------------------------------------------------------------------
def _reload_contract(meta, last) -> list:
    """What an engine's declared reload (EngineRecord.reload) adds to S7: where post-load processing reruns over
    modules the update did not deliver (vLLM's VLLM_RELOAD_MODE=direct), every module must be delivered whole; where
    a failed update has no rollback, the engine holds no servable weights until a full update, and a generation
    since is served from them."""
    rc = meta.reload
    if rc is None:
        return []
    out = []
    why = f"{rc.mode} reload ({rc.source})" if rc.source else f"{rc.mode} reload"
    if rc.reprocesses_undelivered and last is not None:
        for mod in sorted(set(last.untouched) | set(last.partial)):
            what = "not delivered" if mod in last.untouched else "delivered in part"
            out.append(fail("S7", mod, f"{what} by this update, and the {why} reran its post-load processing over "
                                       "the bytes it holds (every checkpoint tensor of each module must be delivered)"))
    if not rc.rollback and meta.errors:
        out.append(fail("S7", None, f"the update failed under the {why}, which has no rollback: the engine holds "
                                    "half-written weights until a full update succeeds"))
        if meta.generations:
            out.append(fail("S7", None, f"{len(meta.generations)} generation(s) served after a failed update with "
                                        "no rollback"))
    return out


@invariant("S7", "sync", "lifecycle and atomicity",
           "post-load processing runs exactly once per complete update; parameters stay in place (same storage); "
           "syncing the same weights twice leaves every parameter the sync writes unchanged (idempotent); every "
           "engine and rank serves one version; no "
           "generation runs on a half-installed policy", needs=("rollout",),
           source="fp8check's own")
def s7_lifecycle(ctx: CheckContext):
    out = []
    meta = ctx.rollout.meta
    version = meta.version
    if version is None and ctx.trainer is not None and ctx.trainer.meta is not None:
        version = ctx.trainer.meta.version
    for e in meta.errors:
        out.append(fail("S7", None, f"update did not complete: {e}"))
    last = meta.last_update
    if last is None:
        out.append(unknown("S7", "no update record in the engine record (post-load counts unknown)"))
    else:
        pp = last.post_process
        for mod in sorted(set(last.completed) | set(last.partial)):
            c = pp.get(mod, pp.get(split_rank_name(mod)[1], 0))
            if c != 1:
                what = "skipped" if c == 0 else f"ran {c} times"
                out.append(fail("S7", mod, f"post-load processing {what} (must run exactly once per update)",
                                count=c))
    out += _reload_contract(meta, last)
    if meta.storage_moved is not None:
        for n in meta.storage_moved:
            out.append(fail("S7", n, "parameter storage replaced: captured CUDA graphs still read the old tensor"))
    else:
        out.append(unknown("S7", "no storage-pointer record"))
    vers = meta.versions
    observed = meta.observed             # a user's own sync: versions and idempotence are not claimed
    if vers is None or version is None:
        if not observed:
            out.append(unknown("S7", "no per-tensor version metadata"))
    else:
        for n, vs in sorted(vers.items()):
            if list(vs) != [version]:
                out.append(fail("S7", n, f"serves version(s) {vs}, the sync installed version {version}",
                                versions=vs))
    rs = meta.resync
    # a schedule's cheap sync: idempotence is measured on the periodic ones, never passed on this one
    deferred = [unknown("S7", "deferred: idempotence is measured on the schedule's periodic syncs, not on this one",
                        deferred=True)] if rs is not None and rs.deferred else []
    if rs is None:
        if not observed:
            out.append(unknown("S7", "idempotence not measured (no re-sync record)"))
    elif rs.deferred:
        pass
    elif rs.error is not None:
        out.append(fail("S7", None, f"re-sync of the same payload failed: {rs.error}"))
    elif rs.changed:
        out.append(fail("S7", rs.changed[0], f"re-syncing the same payload changed {len(rs.changed)} tensors "
                                             "(not idempotent)", changed=rs.changed[:8]))
    for g in meta.generations:
        if g.during_update or len(g.versions) > 1:
            out.append(fail("S7", None, "generation ran on a half-installed policy",
                            event={"during_update": g.during_update, "versions": g.versions}))
    rcv = ctx.payload.meta.receive if ctx.payload is not None and ctx.payload.meta is not None else None
    if rcv is not None and not rcv.in_order:
        out.append(fail("S7", None, f"buckets applied out of order: {rcv.sequence}", stage="transport"))
    if rcv is not None and rcv.expected_buckets is not None and len(set(rcv.sequence)) != rcv.expected_buckets:
        out.append(fail("S7", None, f"update incomplete: {len(set(rcv.sequence))} of "
                                    f"{rcv.expected_buckets} buckets", stage="transport"))
    if not out:
        if observed:
            return [passed("S7", "observed sync: post-load once per processed layer, storage in place, no generation "
                                 "mid-update (versions and idempotence belong to a sync fp8check carries)")]
        if deferred:
            return [passed("S7", "one complete, in-place update; one version everywhere")] + deferred
        return [passed("S7", "one complete, in-place, idempotent update; one version everywhere")]
    return _cap("S7", out) + deferred
