"""Precision in the search (`--runtime onnxruntime-auto`, the default): the graph shipped is a shape *and* a
precision, and the teacher at full shape is a candidate too.

- A trial whose fp32 graph is over the budget is judged by its all-INT8 graph (nas.trial); a finalist whose
  fp32 graph does not fit grows a precision plan on its trained weights to the budget (`plan_student`).
- The teacher's own plans (`teacher_plans`): before the trials, its graph is exported, every weight group's
  effect on the probe's fidelity measured, and for each budget the plan of best fidelity that fits is found,
  timed side by side with the teacher as a finalist is. At the final stage it stands beside the trained
  student on the same held-out sentences, and the closer of the two within the budget is shipped
  (nas.final._teacher).

Plans are scored on the fidelity probe's sentences (against the teacher, and against the graph's own fp32
graph), never on the held-out sentences that judge what is shipped.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .budgets import study_budgets
from .schema import PlanRecord, StudyFacts, TeacherPlanRow, TeacherPlans

if TYPE_CHECKING:
    from kdnas.core.sentence import SentencePipeline

    from .context import SearchContext

TEACHER_FOLDER = ".teacher"  # in --out: the teacher's exported graphs, which its plans are built from


def probe_scorer(ctx: "SearchContext", fp32_graph: Path | None = None) -> Any:
    """A scorer of graphs on the probe: ρ against the teacher (primary), and against `fp32_graph`'s own."""
    from kdnas.evaluation import FidelityScorer, graph_embeddings

    probe = ctx.probe
    references = {"teacher": probe.reference}
    if fp32_graph is not None:
        references["fp32"] = graph_embeddings(fp32_graph, ctx.teacher.tokenizer, probe.sentences, probe.max_len)
    return FidelityScorer(ctx.teacher.tokenizer, probe.sentences, references, "teacher", max_len=probe.max_len,
                          seed=probe.seed)


def judged_ms(ctx: "SearchContext", label: str):
    """A graph's milliseconds as the budget judges a finalist's (side by side with the teacher for a ratio)."""
    from .final._latency import final_latency

    return lambda graph: float(final_latency(ctx, Path(graph), label)[0].median_ms)


def plan_student(ctx: "SearchContext", dest: Path, label: str, until: float | None = None) -> Any:
    """A trained finalist's plan within `ctx`'s budget, grown on the graphs `dest` holds (export.json records it,
    a mixed plan is written as model.mixed.onnx); None where not even its all-INT8 graph fits as shipped. Past
    `until` (a `time.monotonic()` value) it stops growing and the all-INT8 graph stands (`choice.cut_short`)."""
    from kdnas.evaluation import choose_precision

    ctx.progress.phase(f"{label}: precision plan within {ctx.budget_named} (each group's effect on the probe)")
    return choose_precision(dest, probe_scorer(ctx, dest / "model.onnx"), judged_ms(ctx, label), budget_ms=ctx.budget_ms,
                            until=until)


def teacher_export(ctx: "SearchContext", out: Path, pipeline: SentencePipeline) -> Path:
    """The teacher's fp32 and all-INT8 graphs, exported once per teacher, pipeline and versions and kept across
    studies (nas.kept_plans; one worker exports while the others wait). `out` is the search's, where each worker's
    plan graphs are written (`teacher_planner`)."""
    from kdnas.core.files import staged_folder
    from kdnas.export import export_model

    from .kept_plans import graphs_key, kept_root, one_builder

    key = graphs_key(ctx.teacher.fingerprint, pipeline.pooling, pipeline.normalize)
    folder = kept_root() / f"graphs-{key}"
    if (folder / "export.json").is_file():
        return folder
    with one_builder(folder):
        if not (folder / "export.json").is_file():
            ctx.progress.phase("the teacher's graphs, for its precision plans")
            with warnings.catch_warnings(), staged_folder(folder, keep_existing=True) as stage:
                warnings.simplefilter("ignore")  # an all-INT8 graph far from fp32 is what its plans are for
                export_model(ctx.teacher.model, stage, int8=True, tokenizer=ctx.teacher.tokenizer,
                             pooling=pipeline.pooling, normalize=pipeline.normalize)
    return folder


def teacher_planner(ctx: "SearchContext", out: Path, pipeline: SentencePipeline, order: list[dict[str, Any]] | None = None) -> Any:
    """The planner of the teacher's graph (with the group order measured before, where given), writing its plan
    graphs in a folder of this worker's own under `out`."""
    from kdnas.export import Effect, Planner

    from .kept_plans import own_workdir

    folder = teacher_export(ctx, out, pipeline)
    return Planner(folder / "model.onnx", own_workdir(out / TEACHER_FOLDER), probe_scorer(ctx),
                   judged_ms(ctx, "the teacher"), full_range=full_range_of(folder), int8=folder / "model.int8.onnx",
                   order=[Effect(**e) for e in order] if order else None)


def full_range_of(folder: Path) -> bool:
    """Whether an exported folder's INT8 graph uses the weights' full 8 bits (its export.json says)."""
    import json

    return bool(json.loads((folder / "export.json").read_text()).get("int8_full_range"))


def kept_order(ctx: "SearchContext", out: Path, pipeline: SentencePipeline) -> Path:
    """Where the teacher's group order on this search's probe sentences is kept (nas.kept_plans.order_file)."""
    from .kept_plans import graphs_key, order_file

    probe = ctx.probe
    full_range = full_range_of(teacher_export(ctx, out, pipeline))
    return order_file(graphs_key(ctx.teacher.fingerprint, pipeline.pooling, pipeline.normalize), probe.sentences,
                      probe.max_len, full_range)


def teacher_plans(ctx: "SearchContext", facts: StudyFacts, out: Path, pipeline: SentencePipeline) -> TeacherPlans:
    """The teacher's best plan within each budget of the study (`facts`): fitting or not, its probe
    fidelity and latency, and the group order measured (the sensitivity pass runs only where the all-INT8
    graph fits the largest budget). Under a --timeout, a plan whose growth would end past its share of the time
    (`TimeLimit.plans_before_trials`) is deferred: its all-INT8 graph stands until the final stage decides."""
    from .kept_plans import keep_order, one_builder, read_order

    started = time.perf_counter()
    kept = kept_order(ctx, out, pipeline)
    with one_builder(kept):  # workers starting together: one sensitivity pass, the others reuse it
        planner = teacher_planner(ctx, out, pipeline, read_order(kept))
        rows = _plan_rows(ctx, facts, planner)
        keep_order(kept, [e.to_dict() for e in planner.order or []])
    return TeacherPlans(tuple(rows), int8_ms=planner.known_latency(planner.along(0)), full_range=planner.full_range,
                        order=tuple(e.to_dict() for e in planner.order or []),
                        fp32_fidelity=planner.known_fidelity(planner.along(len(planner.groups))),
                        sensitivity_s=None if planner.sensitivity_s is None else round(planner.sensitivity_s, 1),
                        seconds=round(time.perf_counter() - started, 1))


def _plan_rows(ctx: "SearchContext", facts: StudyFacts, planner: Any) -> list[TeacherPlanRow]:
    """Each budget's row of the teacher's plans."""
    read = time.perf_counter()
    planner.latency_ms(planner.along(0))  # the first budget's reading (kept), timed for the forecast
    read_s, plan_s, rows = time.perf_counter() - read, None, []
    for budget in study_budgets(facts):
        ctx.progress.phase(f"the teacher's precision plans: {budget.named}")
        if not planner.fastest_fits(budget.limit_ms):
            rows.append(TeacherPlanRow(budget.label, budget.ms, False, None, _readings(planner)))
            continue
        deferred = None
        if ctx.limit is not None:
            plan_s = _plan_s(planner) if plan_s is None else plan_s  # measured once: later plans are cached
            forecast = replan_s(len(planner.groups), read_s, plan_s, planner.order is not None)
            if not ctx.limit.plans_before_trials(forecast):
                deferred = {"forecast_s": round(forecast, 1), "spent_s": round(time.monotonic() - ctx.limit.started, 1)}
                _say_deferred(ctx, budget.named, forecast)
        point = planner.point(0, fidelity=True, latency=True) if deferred else planner.within_budget(budget.limit_ms)
        rows.append(TeacherPlanRow(budget.label, budget.ms, True, point.to_dict(), _readings(planner), deferred=deferred))
    return rows


def _say_deferred(ctx: "SearchContext", named: str, forecast_s: float) -> None:
    from .time_limit import PLANS_SHARE

    ctx.progress.note(f"the teacher's all-INT8 graph fits {named}; growing its plan now (about {forecast_s:.0f} s) "
                      f"would end past {PLANS_SHARE:.0%} of --timeout {ctx.config.run.timeout:.0f} s, which the "
                      f"trials and the final run need: it is grown at the final stage where the time left allows")


def _readings(planner: Any) -> list[float] | None:
    """The all-INT8 graph's readings where it was read again near the budget (`export.Planner.int8_readings`)."""
    return [round(ms, 4) for ms in planner.int8_readings] or None


def plan_again(row: TeacherPlanRow | None, now_ms: float | None, limit_ms: float) -> bool:
    """Whether the teacher's plan within a budget is searched again at the final stage: not searched again
    already, its all-INT8 graph reads within the budget now (`now_ms`, the teacher as INT8 read as a finalist is),
    and either its growth was deferred before the trials (`TeacherPlanRow.deferred`) or that graph read over the
    budget then, near enough to it to be read again (`int8_readings`)."""
    return (row is not None and row.again is None and now_ms is not None and now_ms <= limit_ms
            and (row.deferred is not None or (not row.fits and bool(row.int8_readings))))


def teacher_plans_again(ctx: "SearchContext", facts: StudyFacts, out: Path, pipeline: SentencePipeline,
                        final_least_s: float = 0.0) -> TeacherPlans | None:
    """Readings at both ends of the run: the study's `teacher_plans` with the row of `ctx`'s budget decided again
    where `plan_again` says so (the evidence in its `again`), before the final run takes the time left; None
    where nothing is searched again. Why: the demo's teacher, all-INT8, read 0.548 and 0.570 of the teacher
    side by side before the trials against a 0.51 budget, 0.459 at the end of the same run; a student shipped
    (rho 0.953, where the teacher's plan shipped in the other runs: 0.993). Under a --timeout, a plan is grown
    only where its forecast (`replan_s`) leaves the final stage `final_least_s`, the least work around its run;
    where it is not, the row stays as decided before the trials (a deferred one keeps its all-INT8 graph)."""
    plans = facts.teacher_plans
    row = None if plans is None else plans.row(ctx.budget_label)
    now = None if facts.teacher_int8 is None else facts.teacher_int8.latency.median_ms
    if plans is None or not plan_again(row, now, ctx.budget_ms):
        return None
    if row.deferred is not None:
        return _grow_deferred(ctx, plans, row, now, out, pipeline, final_least_s)
    ctx.progress.phase(f"the teacher's precision plan within {ctx.budget_named} again: its all-INT8 graph read "
                       f"{now:.2f} ms now, over the budget before the trials")
    started = time.perf_counter()
    planner = teacher_planner(ctx, out, pipeline, order=list(plans.order) or None)
    fits = planner.fastest_fits(ctx.budget_ms)
    read_s = (time.perf_counter() - started) / max(1, len(planner.int8_readings))
    forecast = replan_s(len(planner.groups), read_s, _plan_s(planner), planner.order is not None) if fits else 0.0
    grown = fits and (ctx.limit is None or ctx.limit.keeps_final_run(final_least_s, forecast))
    point = planner.within_budget(ctx.budget_ms) if grown else None
    again = {"final_ms": round(now, 4), "int8_ms": planner.known_latency(planner.along(0)),
             "int8_readings": _readings(planner) or [], "seconds": round(time.perf_counter() - started, 1),
             **({"forecast_s": round(forecast, 1), "grown": grown} if fits else {})}
    if fits and not grown:
        ctx.progress.note(f"the teacher's all-INT8 graph fits {ctx.budget_named} now, but growing its plan "
                          f"(about {forecast:.0f} s) would leave the final run too little of --timeout "
                          f"{ctx.config.run.timeout:.0f} s: it stays as decided before the trials")
    decided = replace(row, again=again) if point is None else replace(row, fits=True, plan=point.to_dict(), again=again)
    return _decided(plans, row, decided, planner)


def _grow_deferred(ctx: "SearchContext", plans: TeacherPlans, row: TeacherPlanRow, now: float, out: Path,
                   pipeline: SentencePipeline, final_least_s: float) -> TeacherPlans:
    """`plans` with a plan deferred before the trials grown now, where the forecast made then (`row.deferred`) leaves
    the final run `final_least_s`; else the row keeps its all-INT8 graph. No reading is taken to decide: that graph
    read within the budget before the trials and at the final stage (`now`), and one noisy host spent two minutes
    re-reading it side by side at the final stage of a demo."""
    forecast = float(row.deferred["forecast_s"])
    grown = ctx.limit is None or ctx.limit.keeps_final_run(final_least_s, forecast)
    started, planner, point = time.perf_counter(), None, None
    if grown:
        ctx.progress.phase(f"the teacher's precision plan within {ctx.budget_named}, deferred before the trials")
        planner = teacher_planner(ctx, out, pipeline, order=list(plans.order) or None)
        point = planner.within_budget(ctx.budget_ms)  # None where its all-INT8 graph reads over now: it stands
    else:
        ctx.progress.note(f"growing the teacher's plan within {ctx.budget_named} (about {forecast:.0f} s) would leave "
                          f"the final run too little of --timeout {ctx.config.run.timeout:.0f} s: it stays as decided "
                          "before the trials, its all-INT8 graph")
    again = {"final_ms": round(now, 4), "forecast_s": round(forecast, 1), "grown": grown,
             "seconds": round(time.perf_counter() - started, 1)}
    decided = replace(row, again=again) if point is None else replace(row, plan=point.to_dict(), again=again)
    return _decided(plans, row, decided, planner)


def _decided(plans: TeacherPlans, row: TeacherPlanRow, decided: TeacherPlanRow, planner: Any) -> TeacherPlans:
    """`plans` with `row` replaced by `decided`, and the group order and sensitivity pass `planner` measured (none
    where no planner was built)."""
    plans = replace(plans, budgets=tuple(decided if r is row else r for r in plans.budgets))
    if planner is None:
        return plans
    return replace(plans, order=tuple(e.to_dict() for e in planner.order or []),
                   sensitivity_s=plans.sensitivity_s if planner.sensitivity_s is None
                   else round(planner.sensitivity_s, 1))


def _plan_s(planner: Any) -> float:
    """Seconds of one plan graph built and scored on the probe (its first group fp32: a graph the sensitivity
    pass builds anyway), for `replan_s`."""
    started = time.perf_counter()
    planner.fidelity(planner.plan((planner.groups[0].name,)))
    return time.perf_counter() - started


def replan_s(groups: int, read_s: float, plan_s: float, order_known: bool) -> float:
    """Forecast seconds of growing a plan once its all-INT8 graph fits: the sensitivity pass where the groups'
    order is not known (a plan graph built and scored per group, `plan_s` each), then the bisection along the
    order (log2 of the groups, the all-fp32 graph and up to CONFIRM_STEPS readings again), each a graph built
    and read (`plan_s` + `read_s`), then the bisection back to the fastest plan of the same fidelity (log2 of the
    groups built and scored, and one read: `export.FIDELITY_TIE`). An upper bound: a plan reused is neither built
    nor scored again."""
    from kdnas.export import CONFIRM_STEPS

    halvings = math.ceil(math.log2(max(2, groups)))
    steps = halvings + 1 + CONFIRM_STEPS
    return (0.0 if order_known else groups * plan_s) + steps * (plan_s + read_s) + halvings * plan_s + read_s


def teacher_plan_for(facts: StudyFacts, label: str | None) -> PlanRecord | None:
    """The teacher's plan within one budget, where the study measured one that fits."""
    return None if facts.teacher_plans is None else facts.teacher_plans.fitting(label)
