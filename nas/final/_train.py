"""A finalist's training: the final recipe, fitted to a --timeout when one is set, from the inherited
student or from a refused wider finalist's trained weights narrowed; a run the time lets go on grows its
transfer set, and takes the rows whose teacher targets are on disk already."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdnas.distill import Checkpoints, DistillResult, Evaluator, StudentSpec, narrowed_from
from kdnas.distill import distill as run_distill
from kdnas.distill.loop import fit_steps, resolve_precision
from kdnas.distill.trainer import resolve_device

from ..baselines import START_ROW
from ..config import FINAL_MAX_PASSES
from ..recipe import final_transfer_set

if TYPE_CHECKING:
    from ..config import SearchConfig
    from ..context import SearchContext
    from ..schema import Refusal


# A run that continues a refused finalist (`Stage.trained_wider`) is not made when fewer steps than
# this fit: with per-feature token states 20 steps undid part of what the narrowed student keeps
# (ρ 0.838 → 0.709 at lr 6e-4; 0.835 → 0.788 at 3e-4) where 100 steps added to it (0.870; 0.873).
# Today's recipe (plain MSE, 1e-3) loses nothing in 20 steps (0.850 → 0.856) but gains most in 100
# (0.883); below that it ships as narrowed (measured: a one-off benchmark, in git history).
MIN_CONTINUED_STEPS = 100


def below_start(res: DistillResult, quality: Any) -> str | None:
    """Why a trained finalist does not ship: its held-out ρ is below its own untrained start's (an inherit run's
    start is the `START_ROW` baseline, scored on the same sentences), else None. On a host 1.7x slower than the
    benchmark host an MPNet student trained 20 steps ended at ρ 0.895 against its start's 0.916, and shipped."""
    start = None if quality is None else quality.fidelity.get(START_ROW)
    student = None if quality is None else quality.student
    if not res.steps or res.init.get("init") != "inherit" or start is None or student is None:
        return None
    if student.spearman >= start.spearman:
        return None
    return (f"trained {res.steps} steps to held-out ρ {student.spearman:.3f}, below its untrained start's "
            f"{start.spearman:.3f}: the start ships")


def the_start(ctx: "SearchContext", cache: Any, res: DistillResult, why: str) -> DistillResult:
    """`res` with its student's untrained inherited start in place of the trained weights (`below_start`): its
    metrics are the start's, its steps those trained and dropped, and its `init` says why."""
    from kdnas.distill.inherit import inherit_student

    student, _ = inherit_student(ctx.teacher, res.spec, cache.importance(), ctx.config.layer_rule)
    student = student.eval()
    metrics = {"step": 0, **Evaluator(cache, strategy=res.config.eval_layer_map)(student)}
    return replace(res, student=student, metrics=metrics, history=[], init={**res.init, "start_shipped": why})


def distill_in_time(ctx: "SearchContext", cache: Any, spec: StudentSpec, label: str, until: float | None,
                    start: Refusal | None, state: Path) -> Any:
    """The final recipe's run, fitted to end by `until` when a --timeout set one; from the inherited
    student, or from `start`'s trained weights narrowed to `spec` (`distill.narrowed`). A run of a
    fixed step count (no --timeout) saves its state in `state` every `final.save_every` steps, so a
    rerun of a search stopped during it goes on from there."""
    cfg, config, student = ctx.config, ctx.final_config(), None
    config = replace(config, augment=cfg.final.augment_for(cache.data.num_train))
    if config.augment and cfg.final.augment is None:
        ctx.progress.note(f"{label}: the corpus gave {cache.data.num_train} {cfg.final.unit}s, too few for "
                          f"{cfg.final.steps} steps to see each at most {FINAL_MAX_PASSES} times: {config.augment:.0%} "
                          "of the batches are perturbed, the teacher labelling them (--final-augment 0: none)")
    if start is not None:
        student = _narrowed_start(ctx, cache, spec, start, label)
        config = replace(config, freeze_embeddings=True)  # frozen in the run it continues
        if _continued_steps(cfg, start, until) < MIN_CONTINUED_STEPS:
            ctx.progress.note(f"{label}: ships as narrowed from {start.arch}: fewer than "
                              f"{MIN_CONTINUED_STEPS} steps would fit, and so few take fidelity away")
            return DistillResult(student=student, spec=spec, config=config, init=_continued(start),
                                 metrics={"step": 0, **Evaluator(cache, strategy=config.eval_layer_map)(student)},
                                 precision=resolve_precision(config.precision, resolve_device(config.device)))
    ctx.progress.phase(f"{label}: distill {cfg.final.steps} steps ({cfg.final.method})" + (
        "" if until is None else _fitted_to(cfg)))
    res = run_distill(spec, ctx.teacher, cache.data, config, cache=cache, until=until, student=student,
                      up_to=cfg.final_most, grow=_grower(ctx, cache, label),
                      checkpoints=None if until is not None or not cfg.final.save_every
                      else Checkpoints(state, cfg.final.save_every),
                      on_step=ctx.progress.counter(f"{label}: distill ({cfg.final.method})"))
    if start is not None:
        res.init = _continued(start)
    if res.cut_short:
        ctx.progress.note(f"{label}: {res.steps} of {cfg.final.steps} steps fitted in the time --timeout "
                          f"{cfg.run.timeout:g} s left")
    elif res.extended:
        ctx.progress.note(f"{label}: {res.steps} steps, {res.steps - cfg.final.steps} more than --final-steps "
                          f"{cfg.final.steps}: the time --timeout {cfg.run.timeout:g} s left (at most {cfg.final_most})")
    return res


def _grower(ctx: "SearchContext", cache: Any, label: str) -> Callable[[int], Any]:
    """More transfer sentences for a final run that the time lets go past `final.steps`: none seen more
    than FINAL_MAX_PASSES times over the steps it will now make (`FinalRecipe.rows_for`), with a tenth
    to spare so that a run which speeds up a little does not grow again at once. On the demo's student
    (bf16, 2,400 steps) 15,360 sentences reach ρ 0.919 where the 7,680 seen ten times reach 0.908 and
    1,200 steps on them 0.904 (one-off benchmark, in git history): more steps pay with more text."""
    cfg, latest = ctx.config, cache

    def grow(total: int) -> Any:
        nonlocal latest
        have, free = latest.data.num_train, _free_rows(cfg, latest, total)
        if max(cfg.final.rows_for(total), free) <= have:
            return None
        rows = max(min(cfg.final.rows_for(math.ceil(1.1 * total)), cfg.final.rows_for(cfg.final_most)), free)
        ctx.progress.phase(f"{label}: {total} steps fit the time left: the transfer set grows to {rows} "
                           f"{cfg.final.unit}s (teacher targets of the new ones)")
        data = final_transfer_set(cfg, ctx.teacher, ctx.texts, rows)
        if data.num_train <= have:
            return None  # the corpus holds no more
        latest = latest.grown(data)
        ctx.progress.phase(f"{label}: distill {total} steps ({cfg.final.method}) on {data.num_train} {cfg.final.unit}s")
        return latest

    return grow


def _free_rows(cfg: SearchConfig, cache: Any, steps: int) -> int:
    """Training rows of the set on disk that hold the teacher's targets of the final run's loss (its last
    layer) and start with `cache`'s rows, up to one pass of `steps` batches: text that costs no teacher
    pass is worth more than a row seen again (3,000 steps on 32,768 sentences reached ρ 0.923 against
    0.895 on 4,096, docs/design/final-recipe.md). A longer run of the same corpus left them there."""
    from kdnas.distill import Needs

    stored = cache.stored_rows(Needs(hidden=frozenset({cache.teacher.dims.layers})))
    return min(stored, steps * cfg.final.batch_size) if stored > cache.data.num_train else 0


def with_stored_rows(ctx: "SearchContext", cache: Any) -> Any:
    """`cache`, grown to the rows of its corpus whose targets are on disk already (`_free_rows`)."""
    rows = _free_rows(ctx.config, cache, ctx.config.final.steps)
    if rows <= cache.data.num_train:
        return cache
    ctx.progress.phase(f"final: the teacher's targets of {rows} {ctx.config.final.unit}s are on disk: the run takes them")
    return cache.grown(final_transfer_set(ctx.config, ctx.teacher, ctx.texts, rows))


def _fitted_to(cfg: SearchConfig) -> str:
    more = f"more, up to {cfg.final_most}, if time is left; " if cfg.final_most > cfg.final.steps else ""
    return f", {more}fewer if they would not end by --timeout"


def _narrowed_start(ctx: "SearchContext", cache: Any, spec: StudentSpec, start: Refusal, label: str) -> Any:
    """`start`'s trained student, read back from over-budget/ and narrowed to `spec`."""
    ctx.progress.phase(f"{label}: continues {start.arch} ({start.steps} steps, over the budget as shipped), "
                       f"narrowed by activation importance")
    return narrowed_from(start.dir, ctx.teacher.tokenizer, spec, *cache.data.split("train"))


def _continued_steps(cfg: SearchConfig, start: Refusal, until: float | None) -> int:
    """The steps a continued run can make: `final.steps`, or those that fit before `until` at the
    pace of the refused run (whose FFN was wider, so a little slower: the estimate errs short)."""
    if until is None or not start.distill_s:
        return cfg.final.steps
    return fit_steps(0, start.distill_s / max(start.steps or 0, 1), until - time.monotonic(), cfg.final.steps)


def _continued(start: Refusal) -> dict[str, Any]:
    return {"init": "continued", "from": start.arch, "after_steps": start.steps,
            "narrowed_by": "activation importance (distill.narrowed)"}
