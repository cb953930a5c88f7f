"""The final stage's loop: each candidate of one budget in turn, its shipped graph timed before any
training (the budget's gate), trained and shipped when it fits; a finalist over the budget is set aside
and its narrower FFN neighbour tried next, up to MAX_OVER_BUDGET refusals."""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from kdnas.core.errors import InputError
from kdnas.distill import parse_arch

from ..neighbours import MAX_NEIGHBOURS, NARROWER, WIDER, candidates, ffn_neighbour, on_trial_scale, rank_in
from ..records import trial_pace, trial_rows
from ..time_limit import final_run_s, marginal
from ..recipe import final_transfer_set, recipe_of
from ..schema import AS_SHIPPED, Candidate, FinalRecord, LatencyRecord, Refusal, StudyFacts, record_fact
from ..variant import VariantChoice
from ._latency import INT8_GRAPH, drift_of, shipped_graph_latency
from ._records import final_dir, jsonable, neighbour_records, of_other_budgets, over_record, refused_records, spec_of
from ._shipping import RunTiming, finish
from ..plans import teacher_plan_for, teacher_plans_again
from ._teacher import teacher_or_student
from ._train import with_stored_rows

if TYPE_CHECKING:
    from kdnas.core.sentence import SentencePipeline

    from ..context import SearchContext


# A finalist over the budget is not shipped; the next one is trained instead, up to this many extra.
MAX_OVER_BUDGET = 2


def run_final(study: optuna.Study, ctx: "SearchContext", out: Path, pool: list[Candidate], later: int = 0,
              trailing: int = 0) -> list[FinalRecord]:
    """Distill, ship and profile the best `final.top_k` candidates whose shipped model.onnx is within
    `ctx`'s budget: the trials of `pool`, best reward first, and their FFN neighbours (nas.neighbours).
    A finalist over the budget is moved to `over-budget/` and the next candidate is tried. `later`:
    the finalists of the search's other budgets still to train after these (a --timeout shares the time);
    `trailing`: those after them that take no share of it, whose work around their runs it leaves time for."""
    from kdnas.core.assets import teacher_path

    cfg = ctx.config
    teacher_dir = teacher_path(cfg.teacher)
    pipeline = ctx.teacher_pipeline  # read and checked before the long final distillation
    cache = with_stored_rows(ctx, _final_cache(ctx))
    # a proxy run's and a whole trial's seconds, for a --timeout's estimates: the trials' medians, less the
    # one-time teacher work (the first trial's also holds the teacher targets of the transfer set)
    proxy_s, trial_s = (statistics.median([getattr(r, key) - (r.seconds_teacher or 0.0) for r in pool if getattr(r, key)]
                                          or [0.0]) for key in ("seconds_distill", "seconds_total"))
    _teacher_at_the_end(study, ctx, pipeline, out, final_run_s(0, 0.0, trial_s))
    stage = Stage(study, ctx, pool)
    results: list[FinalRecord] = []
    while stage.queue and len(results) < cfg.final.top_k and stage.refused_trials() <= MAX_OVER_BUDGET:
        rank = len(results) + 1
        label = f"final {rank}/{cfg.final.top_k} {stage.queue[0].arch}" + (
            "" if ctx.budget_label is None else f" ({ctx.budget_label})")
        row = ready(stage, stage.queue.pop(0), pipeline, label)
        if row is None:
            continue
        arch = row.arch
        timing = RunTiming(step_s=stage.step_s[arch], finalists_left=cfg.final.top_k - len(results) + later,
                           before_ms=stage.now[arch], marginal=stage.marginal.get(arch, False), proxy_s=proxy_s,
                           train_step_s=trial_pace(study, row.number) or 0.0, trailing=trailing,
                           variant=stage.variant.get(arch), gate=stage.gate.get(arch),
                           teacher_plan=teacher_plan_for(StudyFacts.from_study(study), ctx.budget_label)
                           if cfg.latency.plans else None)
        finalist = finish(ctx, cache, final_dir(out, rank, arch, ctx.budget_label), row, label, teacher_dir,
                          pipeline, timing, stage.trained_wider(row))
        if finalist.within_budget:
            results.append(replace(finalist.record(), rank=rank))
            continue
        entry = finalist.record()
        stage.refuse(over_record(row, ctx, set_aside(out, entry, ctx.budget_label), finalist.latency_ms,
                                 entry.latency_readings_ms, **drift_of(entry), steps=entry.steps,
                                 distill_s=finalist.seconds["distill"]))
        stage.propose(row, NARROWER)
    if cfg.latency.plans:  # the teacher's own plan within the budget, beside the student
        results = teacher_or_student(study, ctx, out, results, pipeline, teacher_dir)
    record_fact(study, "final", of_other_budgets(StudyFacts.from_study(study).final or [], ctx.budget_label)
                        + [jsonable(r.to_attrs()) for r in results])
    if not results:
        tried = ", ".join(f"{s.arch} {s.latency_ms:.2f} ms" for s in stage.over)
        raise InputError(f"no finalist fits {ctx.budget_named} as shipped ({tried}); "
                         f"raise --budget-ms or search again")
    return results


def _final_cache(ctx: "SearchContext") -> Any:
    """The final run's teacher targets: the fidelity proxy's when it trained on the final run's own set."""
    from kdnas.distill import TeacherCache, targets_dir

    cfg = ctx.config
    if cfg.proxy.kind == "fidelity" and ctx.cache is not None and cfg.final.rows == cfg.final.train:
        return ctx.cache  # the fidelity proxy trained on this transfer set: its teacher targets are computed
    ctx.progress.phase(f"final: transfer set of {cfg.final.rows} {cfg.final.unit}s, teacher targets")
    data = final_transfer_set(cfg, ctx.teacher, ctx.texts)
    return TeacherCache(ctx.teacher, data, directory=targets_dir(cfg.run.cache_dir),
                        on_rows=ctx.progress.counter("final: teacher targets", "rows"),
                        last_layer=getattr(ctx.cache, "last_layer", None))


def _teacher_at_the_end(study: optuna.Study, ctx: "SearchContext", pipeline: SentencePipeline, out: Path,
                        final_least_s: float) -> None:
    """The teacher read again before the final run. As INT8, beside the students on the pages and in the summary,
    once per study: where precision plans exported the teacher's graphs (OUT/.teacher), that all-INT8 graph, timed
    as the shipped graphs are (read alone, the demo's read 5.41 ms where the same graph read 4.43 side by side with
    the teacher). Where that reading fits a budget its all-INT8 graph read over before the trials, its plan within
    it is decided again (nas.plans.teacher_plans_again): readings at both ends of the run decide, where a --timeout
    leaves the final run `final_least_s` (the work around it) after that."""
    from ..baselines import teacher_int8
    from ..plans import teacher_export
    from ._latency import final_latency

    if StudyFacts.from_study(study).teacher_int8 is None:
        ctx.progress.phase("final: the teacher as INT8 (what a user has for free), latency and fidelity")
        exported = teacher_export(ctx, out, pipeline) / INT8_GRAPH if ctx.config.latency.plans else None
        record_fact(study, "teacher_int8", teacher_int8(
            ctx, pipeline, exported=exported, read=lambda graph: final_latency(ctx, graph, "the teacher as INT8")[0]))
    if ctx.config.latency.plans:
        again = teacher_plans_again(ctx, StudyFacts.from_study(study), out, pipeline, final_least_s)
        if again is not None:
            record_fact(study, "teacher_plans", again)


class Stage:
    """The final stage's bookkeeping: the candidates left, the shapes refused over the budget and the
    neighbours scored (both kept in the study, so a rerun replays them), this run's readings."""

    def __init__(self, study: optuna.Study, ctx: "SearchContext", pool: list[Candidate]) -> None:
        self.study, self.ctx = study, ctx
        self.over = refused_records(study, ctx.config, ctx.budget_label)
        self.neighbours = neighbour_records(study, ctx.config, ctx.budget_label)
        self.queue = candidates(pool, self.over, self.neighbours)
        self.tried = {r.arch for r in trial_rows(study)} | {r.arch for r in pool}
        # Each shape's shipped-graph reading in this run; a shape over the budget never returns to
        # the queue, so a shape read here fits.
        self.now: dict[str, float] = {}
        # and the seconds per step of it (the export, each reading of the graph or the teacher) for
        # a --timeout's estimate of what follows the final run (nas.time_limit)
        self.step_s: dict[str, float] = {}
        # and whether that reading was too close to the budget to count on (nas.time_limit.marginal)
        self.marginal: dict[str, bool] = {}
        # and which fp32 graph it ships (nas.variant), where the choice was made
        self.variant: dict[str, VariantChoice | None] = {}
        # and which graph the budget judged before training (model.int8.onnx: a precision plan is grown)
        self.gate: dict[str, str] = {}
        self.proposed = 0

    def refused_trials(self) -> int:
        """Finalists refused, not counting neighbours (a neighbour's refusal costs seconds)."""
        return sum(s.neighbour_of is None for s in self.over)

    def refuse(self, record: Refusal) -> None:
        self.over.append(record)
        self.save()

    def scored(self, row: Candidate) -> None:
        self.neighbours.append(row)
        self.save()

    def propose(self, row: Candidate, direction: int) -> bool:
        """Queue `row`'s FFN neighbour in `direction` to be tried next; False when there is none."""
        taken = self.tried | {s.arch for s in self.over} | {r.arch for r in self.neighbours + self.queue}
        neighbour = ffn_neighbour(self.ctx.space, row, direction, taken) if self.proposed < MAX_NEIGHBOURS else None
        if neighbour is None:
            return False
        self.proposed += 1
        rank_in(self.queue, neighbour)
        return True

    def trained_wider(self, row: Candidate) -> Refusal | None:
        """The finalist refused as shipped whose training `row` continues: the same layers, heads and
        width at the nearest wider FFN, its folder still in over-budget/ (None when there is none).
        Its trained weights, narrowed, are a far better start than the teacher's: 3x12x384x1536 after
        680 steps, cut to 1280 FFN neurons, reaches ρ 0.873 after 100 more steps, the teacher-inherited
        3x12x384x1280 0.803 (docs/design/final-recipe.md, "A refused finalist's training, handed on")."""
        mine = spec_of(self.ctx, row)
        trained = [(parse_arch(s.arch, **self.ctx.sizes), s) for s in self.over
                   if s.stage == AS_SHIPPED and s.steps and s.dir and Path(s.dir).is_dir()]
        wider = [(spec.ffn, s) for spec, s in trained if replace(spec, ffn=mine.ffn) == mine and spec.ffn > mine.ffn]
        return min(wider, key=lambda pair: pair[0])[1] if wider else None

    def save(self) -> None:
        label, facts = self.ctx.budget_label, StudyFacts.from_study(self.study)
        record_fact(self.study, "final_over_budget", of_other_budgets(facts.final_over_budget or (), label) + self.over)
        record_fact(self.study, "final_neighbours", of_other_budgets(facts.final_neighbours or (), label) + self.neighbours)


def ready(stage: Stage, row: Candidate, pipeline: SentencePipeline, label: str) -> Candidate | None:
    """`row` as it is to be trained now (a neighbour with its score), or None where it is not. Its shipped graph
    (pooling and normalization included) is timed first: weights do not change latency, so a finalist that
    cannot fit costs seconds, not minutes, and its narrower FFN neighbour is tried next. A neighbour that fits
    is scored by the proxy and waits its turn when it ranks below the next candidate; a finalist about to be
    trained first lets its wider FFN neighbour go ahead of it."""
    ctx = stage.ctx
    if row.arch not in stage.now:
        t0 = time.perf_counter()
        gate = shipped_graph_latency(ctx, spec_of(ctx, row), pipeline, label)
        before, readings, drift = gate.ms, gate.readings, gate.facts
        stage.variant[row.arch], stage.gate[row.arch] = gate.variant, gate.graph
        stage.now[row.arch], stage.step_s[row.arch] = before, (time.perf_counter() - t0) / gate.steps
        stage.marginal[row.arch] = marginal(before, ctx.budget_ms, bool(readings))
        if before > ctx.budget_ms:
            stage.refuse(over_record(row, ctx, None, before, readings, **drift, graph=gate.graph))
            stage.propose(row, NARROWER)
            return None
        if row.reward is None:
            row = _score_neighbour(ctx, row, before, stage.now.get(row.neighbour_of), label)
            stage.scored(row)
            following = stage.queue[0].reward if stage.queue else None
            if following is not None and following > row.reward:
                rank_in(stage.queue, row)
                return None
    if stage.propose(row, WIDER):
        rank_in(stage.queue, row)  # behind its wider neighbour, which is measured and scored first
        return None
    return row


def _score_neighbour(ctx: "SearchContext", row: Candidate, read_ms: float, parent_now_ms: float | None,
                     label: str) -> Candidate:
    """A neighbour scored as a trial is: the search's proxy, and its shipped graph's reading put on
    the scale its parent was scored with (`nas.neighbours.on_trial_scale`)."""
    ctx.progress.phase(f"{label}: the proxy, as for a trial (FFN neighbour of {row.neighbour_of})")
    spec = spec_of(ctx, row)
    latency_ms, factor = on_trial_scale(read_ms, row.parent_latency_ms, parent_now_ms)
    _, metrics = ctx.proxy(spec)
    scored = ctx.score(spec, metrics, LatencyRecord(median_ms=latency_ms))
    return replace(row, reward=scored.reward, proxy=jsonable(scored.record()),
                   recipe=recipe_of(ctx.config, ctx.budget_label), latency_read_ms=read_ms, parent_read_ms=parent_now_ms,
                   latency_scaled_by=round(factor, 4))


def set_aside(out: Path, entry: FinalRecord, label: str | None = None) -> Path:
    """Move an over-budget finalist out of `best/` (kept for inspection); returns where it went."""
    dest = out / "over-budget" / ("" if label is None else label) / f"{entry.trial}-{entry.arch}"
    if dest.exists():
        shutil.rmtree(dest)  # an earlier run's copy of the same finalist
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(entry.dir, dest)
    return dest
