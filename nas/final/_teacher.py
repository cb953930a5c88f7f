"""The teacher as a candidate (`--runtime onnxruntime-auto`): no training, its plans only. Where its best plan
within a budget (nas.plans.teacher_plans, measured before the trials) is closer to the teacher on the held-out
sentences than the trained student's shipped graph, the teacher's own graph is what `best/` holds — with the
plan as `model.mixed.onnx`, its weights and sentence-transformers modules — and the student moves to
`finalists/`. Either way the study keeps the comparison (`final_teacher`), and the summary says which won."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from kdnas.core.files import atomic_write_text, staged_folder

from ..schema import FinalRecord, FinalTeacher, Rival, StudyFacts, record_fact
from ._latency import FP32_GRAPH, INT8_GRAPH, MIXED_GRAPH, shipped_latencies
from ._records import jsonable

if TYPE_CHECKING:
    from ..config import SearchConfig
    from kdnas.core.sentence import SentencePipeline

    from ..context import SearchContext



def teacher_or_student(study: optuna.Study, ctx: "SearchContext", out: Path, results: list[FinalRecord],
                       pipeline: SentencePipeline, teacher_dir: str) -> list[FinalRecord]:
    """`results` (the budget's shipped students, best first), or with the teacher's graph in the first one's
    place where the teacher's plan within the budget is closer to the teacher than that student's shipped graph."""
    from ..baselines import _held_out, int8_fidelity
    from ..plans import teacher_plan_for

    facts = StudyFacts.from_study(study)
    row = teacher_plan_for(facts, ctx.budget_label)  # the plan: its groups, label, latency, probe ρ
    held = _held_out(ctx)
    if row is None or not results or held is None or held.skipped:
        return results
    label = "the teacher" + ("" if ctx.budget_label is None else f" ({ctx.budget_label})")
    ctx.progress.phase(f"{label}: its plan within {ctx.budget_named} on the held-out sentences")
    planner = _planner(ctx, out, pipeline, list(facts.teacher_plans.order))
    plan = planner.plan(row.fp32_groups)
    graph = planner.graph(plan)
    fidelity = int8_fidelity(ctx, held, graph)
    student = results[0]
    student_rho = student.shipped_rho
    record = FinalTeacher(budget=ctx.budget_label, budget_ms=ctx.budget.ms, budget_limit_ms=ctx.budget_ms,
                          plan=row, fidelity=fidelity,
                          student=Rival(arch=student.arch, rho=student_rho, graph=student.budget_graph),
                          shipped=student_rho is not None and fidelity.spearman > student_rho)
    if record.shipped:
        results, record = _ship_teacher(study, ctx, out, results, record, planner, plan, graph, pipeline, teacher_dir)
    others = [r for r in StudyFacts.from_study(study).final_teacher or () if r.budget != ctx.budget_label]
    record_fact(study, "final_teacher", [*others, record])
    return results


def _planner(ctx: "SearchContext", out: Path, pipeline: SentencePipeline, order: list[dict[str, Any]]) -> Any:
    from ..plans import teacher_planner

    return teacher_planner(ctx, out, pipeline, order=order)


def _ship_teacher(study: optuna.Study, ctx: "SearchContext", out: Path, results: list[FinalRecord],
                  record: FinalTeacher, planner: Any, plan: Any, graph: Path, pipeline: SentencePipeline,
                  teacher_dir: str) -> tuple[list[FinalRecord], FinalTeacher]:
    """Move the student aside, write the teacher's folder in its place, time its graphs as shipped; the results
    with the student moved, and the record with where each went and the teacher's readings."""
    from kdnas.core.sentence import write_sentence_transformers

    student = results[0]
    dest = Path(student.dir)
    aside = out / "finalists" / (ctx.budget_label or "") / f"student-{student.arch}"
    if aside.exists():
        shutil.rmtree(aside)
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(dest), aside)
    name = planner_graph_name(planner, plan)
    with staged_folder(dest) as stage:
        source = planner.fp32.parent
        for item in source.iterdir():
            if item.is_file():
                shutil.copy2(item, stage / item.name)
        if name == MIXED_GRAPH:
            shutil.copyfile(graph, stage / MIXED_GRAPH)
        ctx.teacher.model.save_pretrained(stage)
        write_sentence_transformers(stage, teacher_dir, hidden_size=ctx.teacher.model.config.hidden_size)
        manifest = json.loads((stage / "export.json").read_text())
        manifest["precision"] = {"plan": plan.to_dict(), "label": record.plan.label, "graph": name,
                                 "effects": list(StudyFacts.from_study(study).teacher_plans.order),
                                 "probe": record.plan.to_attrs()}
        manifest["sizes"] = {p.name: p.stat().st_size for p in sorted(stage.glob("*.onnx"))}
        atomic_write_text(stage / "export.json", json.dumps(manifest, indent=2) + "\n")
    latency, readings, drift, graphs = shipped_latencies(ctx, dest, "the teacher", name)
    # within the budget by the plan's own reading that chose it (nas.final._shipping._verdict); as shipped beside it
    record = replace(record, student=replace(record.student, dir=str(aside)), dir=str(dest), graph=name,
                     latency_ms=latency.median_ms, latency_readings_ms=readings, **drift, latencies=graphs,
                     within_budget=record.plan.latency_ms <= ctx.budget_ms,
                     params=sum(p.numel() for p in ctx.teacher.model.parameters()))
    atomic_write_text(dest / "search.json", json.dumps(jsonable(record.to_attrs()), indent=2) + "\n")
    atomic_write_text(dest / "README.md", teacher_card(record, ctx.config))
    moved = replace(student, dir=str(aside), shipped_as=str(dest), displaced_by="teacher")
    return [moved, *results[1:]], record


def planner_graph_name(planner: Any, plan: Any) -> str:
    """The file of a teacher folder that holds `plan`: the fp32 graph, the all-INT8 one, or a mixed plan."""
    if not plan.fp32:
        return INT8_GRAPH
    return FP32_GRAPH if len(plan.fp32) >= len(planner.groups) else MIXED_GRAPH


def teacher_card(record: FinalTeacher, config: SearchConfig) -> str:
    """The README of a `best/` that holds the teacher with a precision plan: why, and what it measured."""
    from ..card import search_command

    fidelity, student = record.fidelity, record.student
    return f"""# {config.teacher} with a precision plan

No student beat the teacher itself at this budget: its graph with {record.plan.label} runs within
{record.budget_ms:.2f} ms ({record.latency_ms:.2f} ms as shipped, timed as a student's is) and keeps embedding
fidelity ρ {fidelity.spearman:.3f} to the teacher on {fidelity.sentences or 'the'} held-out sentences, where the
best trained student ({student.arch}, now in `{student.dir}`) reached {student.rho:.3f} with its shipped
graph. Deploy `{record.graph}`; `model.onnx` is the teacher's fp32 graph,
`model.int8.onnx` its all-INT8 one, and `SentenceTransformer` loads this folder as the teacher it is.
`export.json` (`precision`) holds the plan, every weight group's measured effect and its latency.

```bash
{search_command(config)}
```
"""
