"""One finalist from training to its folder: distilled, measured beside its untrained baselines, exported
(ONNX fused or plain, INT8, the sentence-transformers modules), its shipped graphs timed, its card written."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdnas.core.files import atomic_write_text, make_shared

from ..measure import DRIFT_BAND
from ..recipe import recipe_of
from ..schema import Candidate, LatencyRecord, PlanRecord, Quality, Refusal
from ..time_limit import after_training_s, fallback_s
from ..variant import PLAIN, VariantChoice, ship_plain
from . import _train
from ._latency import FP32_GRAPH, INT8_GRAPH, MIXED_GRAPH, shipped_graphs, shipped_latencies
from ._records import Finalist, jsonable, origin_of, spec_of, state_file

if TYPE_CHECKING:
    from kdnas.core.sentence import SentencePipeline

    from ..context import SearchContext
    from ..proxy import ProxyMetrics


@dataclass(frozen=True)
class RunTiming:
    """What the final stage knows of a finalist before its run, from which a `--timeout` fits the run
    (nas.time_limit) and the shipping step decides its graph."""

    step_s: float  # seconds per step of its shipped graph's pre-training export and reading
    finalists_left: int  # this run and those still to share the training time
    before_ms: float  # its shipped graph's reading before training
    marginal: bool = False  # that reading too close to the budget to count on (nas.time_limit.marginal)
    proxy_s: float = 0.0  # a proxy run's seconds (the next candidate's, should this one be refused)
    train_step_s: float = 0.0  # its trial's pace per update
    trailing: int = 0  # finalists after it that take no share of the training time (nas.search.final_order)
    variant: VariantChoice | None = None  # which fp32 graph it ships (nas.variant), where chosen
    gate: str | None = None  # the graph the budget judged before training (INT8_GRAPH: a plan is grown)
    teacher_plan: PlanRecord | None = None  # the teacher's plan within the budget (nas.plans), where one fits


def finish(ctx: "SearchContext", cache: Any, dest: Path, row: Candidate, label: str, teacher_dir: str,
           pipeline: SentencePipeline, timing: RunTiming, start: Refusal | None) -> Finalist:
    """Distill one finalist with the final recipe, measure it against the baselines, ship it. `timing`: what the
    stage knows of its run (`RunTiming`); `start`: the refused wider finalist whose training it continues
    (`Stage.trained_wider`), if any."""
    from ..baselines import baseline_fidelity
    from ..card import write_model_card

    cfg, data = ctx.config, cache.data
    spec = spec_of(ctx, row)
    ctx.progress.phase(f"{label}: untrained baselines' fidelity")
    t0 = time.perf_counter()
    prepared = baseline_fidelity(ctx, spec, cache)
    baselines_s = time.perf_counter() - t0
    after_s, variant = _after_run_s(timing, spec.layers, baselines_s), timing.variant
    t0 = time.perf_counter()
    until = None if ctx.limit is None else ctx.limit.final_until(
        after_s, timing.finalists_left, before_s=baselines_s, trailing=timing.trailing)
    res = _train.distill_in_time(ctx, cache, spec, label, until, start, state_file(dest))
    t1 = time.perf_counter()
    ctx.progress.phase(f"{label}: fidelity")
    res, quality = _scored(ctx, spec, res, cache, prepared, label)
    student = res.student
    t2 = time.perf_counter()
    ctx.progress.phase(f"{label}: export")
    shipped = ship(ctx, student, dest, teacher_dir, pipeline, variant,
                   {**res.summary(), "search_trial": row.number, "teacher": cfg.teacher, "corpus": cfg.corpus,
                    "transfer_set": {"train": res.rows or data.num_train, "eval": data.num_eval,
                                     "seq_len": data.seq_len, "unit": cfg.final.unit}})
    t3 = time.perf_counter()
    choice, judged, (latency, readings, drift, graphs) = _precision(ctx, dest, label, timing.gate,
                                                                    _teacher_closer(timing.teacher_plan, quality),
                                                                    _plan_until(ctx, timing))
    quality, metrics = _shipped_scores(ctx, res, dest, quality, prepared, shipped, choice, judged)
    verdict = _verdict(ctx, timing.before_ms, choice, latency)
    finalist = Finalist(
        trial=row.number, scored=ctx.score(spec, metrics, latency, within=verdict["within"]), dir=str(dest),
        recipe=recipe_of(cfg, ctx.budget_label), budget_ms=ctx.budget.ms, budget_limit_ms=ctx.budget_ms,
        budget=ctx.budget_label,
        run={"steps": res.steps, "steps_planned": cfg.final.steps, "steps_most": cfg.final_most,
             "timeout_s": cfg.run.timeout, "train": cfg.final.rows, "train_rows": res.rows or data.num_train,
             "init": res.init, "precision": res.precision, "augment": res.config.augment if res.steps else 0.0,
             "embed_terms": res.config.embed_terms if res.steps else None},
        latency={"latency_readings_ms": readings, "latency_int8_onnx": graphs[INT8_GRAPH],
                 "latency_fp32_onnx": graphs[FP32_GRAPH], "budget_graph": judged, "verdict": verdict, **drift,
                 **({"latency_mixed_onnx": graphs[MIXED_GRAPH]} if MIXED_GRAPH in graphs else {})},
        quality=quality, shipped={**shipped, "precision_plan": None if choice is None else jsonable(choice.to_dict())},
        proxy_reward=row.reward, origin=origin_of(row),
        seconds={"baselines": round(baselines_s, 3), "distill": round(t1 - t0, 3), "quality": round(t2 - t1, 3),
                 "export": round(t3 - t2, 3), "latency": round(time.perf_counter() - t3, 3),
                 "set_aside_after_distill": round(after_s, 3)})
    entry = finalist.record()
    atomic_write_text(dest / "search.json", json.dumps(jsonable(entry.to_attrs()), indent=2, default=str) + "\n")
    write_model_card(dest, entry, cfg)
    state_file(dest).unlink(missing_ok=True)  # the finalist is written: nothing left to go on from
    return finalist


def _scored(ctx: "SearchContext", spec: Any, res: Any, cache: Any, prepared: Any, label: str) -> tuple[Any, Any]:
    """The run as it ships and its fidelity table: where its student ended below its own untrained start
    (`_train.below_start`), that start in its place, not a worse student."""
    from ..baselines import fidelity_table

    passes = res.steps * res.config.batch_size / (res.rows or cache.data.num_train)
    quality = fidelity_table(ctx, spec, res.student.eval(), cache, prepared, passes=round(passes, 2))
    if (why := _train.below_start(res, quality)) is None:
        return res, quality
    ctx.progress.note(f"{label}: {why}")
    res = _train.the_start(ctx, cache, res, why)
    return res, fidelity_table(ctx, spec, res.student, cache, prepared, passes=0.0)


def _verdict(ctx: "SearchContext", before_ms: float, choice: Any, shipped: LatencyRecord) -> dict[str, Any]:
    """Whether the finalist is within its budget, and why. The budget judged its graph before the long run
    (weights do not change latency), or — for a precision plan grown on the trained weights — the plan's own
    reading that chose it: the reading as shipped is kept beside it and does not undo that, unless it is over
    the budget by more than a host drifts (DRIFT_BAND), which no timing noise explains."""
    ms, by = (choice.latency_ms, "its precision plan's reading") if choice is not None else (before_ms, "before training")
    over = shipped.median_ms > DRIFT_BAND * ctx.budget_ms
    return {"ms": ms, "by": by, "within": ms <= ctx.budget_ms and not over, "shipped_ms": shipped.median_ms}


def _shipped_scores(ctx: "SearchContext", res: Any, dest: Path, quality: Quality | None, prepared: Any,
                    shipped: dict, choice: Any, judged: str) -> tuple[Quality | None, ProxyMetrics]:
    """`quality` with the INT8 graph's (and a plan's) held-out fidelity, export.json as the plan left it into
    `shipped`, and the proxy's metrics of the graph that ships (the plan's probe ρ where it is not fp32)."""
    from ..baselines import int8_fidelity

    if quality is not None and quality.fidelity:  # the INT8 graph (and a plan's) as shipped, on the same sentences
        held = None if prepared is None else prepared.held
        mixed = int8_fidelity(ctx, held, dest / MIXED_GRAPH) if judged == MIXED_GRAPH else None
        quality = replace(quality, int8=int8_fidelity(ctx, held, dest / INT8_GRAPH), mixed=mixed)
    metrics = ctx.measured(res)
    shipped["export"] = jsonable(json.loads((dest / "export.json").read_text()))  # as its precision left it
    if choice is None:
        return quality, metrics
    return quality, replace(metrics, fidelity=choice.fidelity["teacher"]) if judged != FP32_GRAPH else metrics


def _after_run_s(timing: RunTiming, layers: int, baselines_s: float) -> float:
    """What a --timeout leaves for after the final run (nas.time_limit): the export and readings, a plain
    graph's second export, a precision plan's growth where the fp32 graph did not fit, the teacher's plan set
    beside it, and where the reading was marginal the next candidate's, should this one read over the budget
    as shipped."""
    step_s = timing.step_s
    after_s = after_training_s(step_s, baselines_s)
    after_s += step_s if timing.variant is not None and timing.variant.shipped == PLAIN else 0.0
    if timing.gate == INT8_GRAPH:
        after_s += plan_s(layers, step_s)
    if timing.teacher_plan:  # the teacher's plan scored beside it, and shipped in its place if closer
        after_s += TEACHER_STEPS * step_s
    if timing.marginal:
        after_s += fallback_s(after_s, step_s, baselines_s, timing.proxy_s,
                              _train.MIN_CONTINUED_STEPS * timing.train_step_s)
    return after_s


def _plan_until(ctx: "SearchContext", timing: RunTiming) -> float | None:
    """When a student's plan must stop growing under --timeout: the limit less what still follows it, in steps of
    its pre-training export and reading (the shipped graphs' readings, the teacher's plan set beside it)."""
    if ctx.limit is None:
        return None
    return ctx.limit.end - (READS_AFTER_PLAN + (TEACHER_STEPS if timing.teacher_plan else 0)) * timing.step_s


# What follows a student's plan, in steps of its export and reading: the judged graph read beside the teacher and
# the other shipped graphs read after it.
READS_AFTER_PLAN = 2


def _precision(ctx: "SearchContext", dest: Path, label: str, gate: str | None,
               teacher_closer: str | None = None, until: float | None = None) -> tuple[Any, str, tuple]:
    """The shipped folder's graph the budget judges, and its latencies: under --runtime onnxruntime-auto, a
    precision plan grown on the trained weights where the fp32 graph did not fit before training (unless
    `teacher_closer` says why no plan of it can win, or none fits as read now: then its all-INT8 graph; past `until`
    its growth stops and the all-INT8 graph stands); else the runtime's graph.
    Returns the plan chosen (None: none grown), the judged graph's file name and `shipped_latencies`."""
    from ..plans import plan_student

    ctx.progress.phase(f"{label}: latency")
    judged = INT8_GRAPH if gate == INT8_GRAPH else shipped_graphs(ctx.config.latency.runtime)[0]
    late = NO_TIME_LEFT if until is not None and time.monotonic() > until else None
    grow = gate == INT8_GRAPH and teacher_closer is None and late is None
    choice = plan_student(ctx, dest, label, until) if grow else None
    if choice is not None:
        judged = choice.graph
    elif gate == INT8_GRAPH:  # the all-INT8 graph the budget judged before training ships: export.json says why
        _record_choice(dest, INT8_GRAPH, "all-INT8", [], teacher_closer or late or NO_PLAN_NOW)
    elif ctx.config.latency.plans:  # the fp32 graph fitted: export.json names that choice too
        _record_choice(dest, FP32_GRAPH, "fp32", "all",
                       "the fp32 graph fitted the budget before training: the closest graph within it")
    return choice, judged, shipped_latencies(ctx, dest, label, judged)


# Why a finalist judged as INT8 before training ships its all-INT8 graph where its plan found none within the
# budget as read after training (a reading the host's drift moves; `_verdict` judges the graph before the long run).
NO_PLAN_NOW = ("no plan of the trained weights read within the budget after training; the all-INT8 graph, judged "
               "within it before training (weights do not change latency), ships")


# Why no plan is grown where the limit, less what follows, is past when the run ends: not even the all-INT8 graph's
# reading that starts a plan (on a host 2.2x slower than ours it and the plan's scores took a minute past the limit).
NO_TIME_LEFT = ("no plan grown: the time --timeout left was spent; the all-INT8 graph, judged within the budget before "
                "training (weights do not change latency), ships")


# Standard errors by which the teacher's plan must lead a student's fp32 graph before no plan of the student is
# grown: a plan keeps fp32 at most, and a lead this wide is not one that sampling noise on the sentences makes.
CLOSER_BY_SE = 2.0


def _teacher_closer(plan: PlanRecord | None, quality: Quality | None) -> str | None:
    """Why no precision plan of a student is worth growing at this budget, or None: the teacher's own plan within
    it (its probe ρ) is closer to the teacher than the student's fp32 graph (held-out ρ) by more than
    CLOSER_BY_SE standard errors, and a plan of the student's graph keeps at most its fp32 fidelity. (On MPNet,
    growing an 11-layer student's plan took 16 minutes of a one-hour search, for a student the teacher's plan
    beat by 0.09.)"""
    student = None if quality is None else quality.student
    if plan is None or plan.fidelity is None or student is None or student.spearman_se is None:
        return None
    rho, se, teacher = float(student.spearman), float(student.spearman_se), plan.fidelity
    if rho + CLOSER_BY_SE * se >= teacher:
        return None
    return (f"no plan grown: the teacher's plan within the budget ({plan.label}, ρ {teacher:.3f} on the probe) "
            f"is closer than this student's fp32 graph (ρ {rho:.3f} ± {se:.3f} held out), which bounds every plan "
            f"of it; its all-INT8 graph, which fitted before training, stands beside the teacher's")


def _record_choice(dest: Path, graph: str, label: str, fp32_groups: Any, why: str) -> None:
    manifest = json.loads((dest / "export.json").read_text())
    manifest["precision"] = {"graph": graph, "label": label, "plan": {"fp32_groups": fp32_groups}, "why": why}
    atomic_write_text(dest / "export.json", json.dumps(manifest, indent=2) + "\n")


# The teacher's plan set beside a finalist, in steps of the finalist's export and reading: its graph built and
# scored on the held-out sentences, and where it wins its folder written and its graphs read (an estimate).
TEACHER_STEPS = 4


def plan_s(layers: int, step_s: float) -> float:
    """What growing a student's plan takes, in steps of its pre-training export and reading (`step_s`): a
    score of each group's graph, about half a step (4 groups a layer and the tables), and a bisection of
    a few readings beside the teacher."""
    return (0.5 * (4 * layers + 1) + 6) * step_s


def ship(ctx: "SearchContext", student: Any, dest: Path, teacher_dir: str, pipeline: SentencePipeline,
         variant: VariantChoice | None, summary: dict) -> dict:
    """Write `dest`: ONNX (+ INT8), the HF weights, the sentence-transformers modules, distill.json;
    returns the export report and the sentence-transformers pipeline written. `variant`: the fp32
    graph chosen before training (the plain one replaces the fused model.onnx; INT8 stays fused)."""
    from kdnas.export import export_model, write_sentence_transformers

    # export_model writes the folder (ONNX, INT8, tokenizer, config, export.json) atomically and
    # refuses to replace anything but an earlier export; the weights and the sentence-transformers
    # modules then complete it, with the graph's sentence_embedding pooled/normalized like them.
    options = {"tokenizer": ctx.teacher.tokenizer, "pooling": pipeline.pooling, "normalize": pipeline.normalize}
    manifest = export_model(student, dest, int8=True, **options).to_dict()
    if variant is not None:
        manifest["fp32_variant"] = variant.to_dict()
        if variant.shipped == PLAIN:
            manifest |= ship_plain(student, dest, lambda model, folder: export_model(model, folder, optimize=False,
                                                                                     **options))
            manifest["sizes"][FP32_GRAPH] = (dest / FP32_GRAPH).stat().st_size
        atomic_write_text(dest / "export.json", json.dumps(manifest, indent=2) + "\n")
    student.save_pretrained(dest)
    make_shared(dest / "model.safetensors")  # the safetensors writer makes it private; best/ is for users
    sentence = write_sentence_transformers(dest, teacher_dir, hidden_size=student.config.hidden_size)
    atomic_write_text(dest / "distill.json", json.dumps(summary, indent=2, default=str) + "\n")
    return {"export": jsonable(manifest), "sentence_transformers": jsonable(sentence)}
