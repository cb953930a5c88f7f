"""A finalist's latency as the budget judges it: its shipped graph, built before training with random
weights (weights do not change latency) and again as shipped; a ratio budget timed side by side with the
teacher, an absolute one read again when over."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kdnas.distill import StudentSpec
from kdnas.evaluation.precision import FP32_GRAPH, INT8_GRAPH, MIXED_GRAPH

from ..measure import LatencyJudge, beside_teacher, budget_latency, latency_record
from ..schema import LatencyRecord
from ..time_limit import MARGIN, settled
from ..variant import PLAIN, VariantChoice, choose_variant

if TYPE_CHECKING:
    from kdnas.core.sentence import SentencePipeline

    from ..context import SearchContext



def shipped_graphs(runtime: str) -> tuple[str, str]:
    """(the graph of a shipped folder the budget judges by default, the other one): the INT8 graph on
    `--runtime onnxruntime-int8`, what CPU users deploy; the fused fp32 one otherwise (under
    onnxruntime-auto the judged graph is the one the finalist's precision plan chose: `Gate.graph`)."""
    return (INT8_GRAPH, FP32_GRAPH) if runtime == "onnxruntime-int8" else (FP32_GRAPH, INT8_GRAPH)


class Gate(NamedTuple):
    """A finalist's shape read before training, as the budget judges it: the median counted, the readings of
    an absolute budget's second look, the side-by-side facts, how many steps it took (each export, reading,
    pair), the fp32 graph chosen (`nas.variant`, on onnxruntime fp32 and auto) and which graph was judged:
    model.onnx, or under onnxruntime-auto with the fp32 graph over the budget its all-INT8 graph, the fastest
    precision plan (the final stage then grows a plan on the trained weights)."""

    ms: float
    readings: list[float]
    facts: dict[str, Any]
    steps: int
    variant: VariantChoice | None
    graph: str


def shipped_graph_latency(ctx: "SearchContext", spec: StudentSpec, pipeline: SentencePipeline, label: str) -> Gate:
    """The latency of the graph `best/` will ship, built with random weights, as the budget judges it
    (`final_latency`) — read twice and averaged when within the margin of the budget
    (`nas.time_limit.settled`); on onnxruntime fp32 (and auto) the fp32 graph is the faster of fused and
    plain (`nas.variant`); under onnxruntime-auto an fp32 graph over the budget is followed by its all-INT8
    graph's reading."""
    from kdnas.export import export_model

    ctx.progress.phase(f"{label}: latency of the shipped graph, before training")
    lat = ctx.config.latency
    judged, _ = shipped_graphs(lat.runtime)
    with tempfile.TemporaryDirectory(prefix="kdnas-final-") as tmp:
        def exported(name: str, **options: Any) -> Path:
            export_model(spec, Path(tmp) / name, tokenizer=ctx.teacher.tokenizer, pooling=pipeline.pooling,
                         normalize=pipeline.normalize, **options)
            return Path(tmp) / name / judged

        graph, choice = exported(spec.arch, int8=judged == INT8_GRAPH or lat.plans), None
        if lat.runtime == "onnxruntime" or lat.plans:
            ctx.progress.phase(f"{label}: fused or plain fp32 graph, timed side by side")
            choice = choose_variant(graph, exported("plain", optimize=False), ctx.judge.pair)
            graph = graph if choice.shipped != PLAIN else Path(tmp) / "plain" / judged
        gate = _judged(ctx, graph, label, 1 + (2 if choice else 0))
        if lat.plans and gate.ms > ctx.budget_ms:
            ctx.progress.phase(f"{label}: fp32 {gate.ms:.2f} ms is over; its all-INT8 graph, the fastest plan")
            gate = _judged(ctx, Path(tmp) / spec.arch / INT8_GRAPH, label, gate.steps)
    # a finalist judged as INT8 ships a plan grown from the fused graph: model.onnx stays fused
    return gate._replace(variant=choice if gate.graph != INT8_GRAPH else None)


def _judged(ctx: "SearchContext", graph: Path, label: str, steps: int) -> Gate:
    """One graph as the budget judges it, read again within the margin of the budget (`settled`)."""
    result, readings, drift = final_latency(ctx, graph, label)
    before, settling = float(result.median_ms), []
    if not readings:
        before, settling = settled(before, ctx.budget_ms, lambda: float(final_latency(ctx, graph, label)[0].median_ms))
    steps += max(1, len(readings)) + bool(drift)
    if settling:
        ctx.progress.phase(f"{label}: read again, within {MARGIN:.0%} of the budget: {settling[0]:.2f} and "
                           f"{settling[1]:.2f} ms, {before:.2f} ms counted")
        drift, steps = drift | {"settled_from_ms": settling}, steps + 1 + bool(drift)
    return Gate(before, readings, drift, steps, None, graph.name)


def final_latency(ctx: "SearchContext", graph: Path, label: str) -> tuple[Any, list[float], dict[str, Any]]:
    """A finalist's graph as the budget judges it. A ratio budget: timed side by side with the teacher
    (`beside_teacher`; read alone, one graph moved from 12.39 to 9.09 ms within a minute, and a
    finalist that fitted before its training was refused after it). An absolute budget (--budget-ms):
    `budget_latency`, read again when over. Returns the result, the graph's readings when there were
    two, and the side-by-side facts (empty for an absolute budget)."""
    if ctx.config.budget_ms is None:
        result, facts = beside_teacher(graph, ctx.judge, ctx.teacher_latency_ms, ctx.budget_ms)
        ctx.progress.phase(f"{label}: {facts['ratio_to_teacher']:.3f}x the teacher side by side "
                           f"({result.median_ms:.2f} ms against the budget's {ctx.budget_ms:.2f} ms)")
        return result, [], facts
    result, readings = budget_latency(graph, ctx.judge, ctx.budget_ms)
    _say_readings(ctx, label, readings)
    return result, readings, {}


SIDE_BY_SIDE = ("ratio_to_teacher", "ratio_quartiles", "teacher_latency_now_ms", "read_ms", "latency_scaled_by")


def drift_of(entry: Any) -> dict[str, Any]:
    """The side-by-side facts a record (`nas.schema.SideBySide`) holds, by name."""
    return {key: value for key in SIDE_BY_SIDE if (value := getattr(entry, key)) is not None}


def _say_readings(ctx: "SearchContext", label: str, readings: list[float]) -> None:
    if readings:
        ctx.progress.phase(f"{label}: {readings[0]:.2f} ms is over the budget of {ctx.budget_ms:.2f} ms; "
                           f"measured again: {readings[1]:.2f} ms")


def shipped_latencies(ctx: "SearchContext", dest: Path, label: str, judged: str | None = None
                      ) -> tuple[LatencyRecord, list[float], dict, dict[str, dict]]:
    """The graphs as shipped (fused fp32, INT8, a precision plan's), not a rebuild from config.json: `judged`
    (by default the runtime's, `shipped_graphs`) as the budget judges it, the others read right after; (the
    judged graph's latency record, its readings, the side-by-side facts, every graph's record by file name)."""
    judged = judged or shipped_graphs(ctx.config.latency.runtime)[0]
    shipped, readings, drift = final_latency(ctx, dest / judged, label)
    latency = latency_record(shipped)
    others = [name for name in (FP32_GRAPH, INT8_GRAPH, MIXED_GRAPH) if name != judged and (dest / name).is_file()]
    return latency, readings, drift, {judged: latency.to_attrs(), **{name: _other_latency(ctx.judge, dest / name, drift)
                                                         for name in others}}


def _other_latency(judge: LatencyJudge, graph: Path, drift: dict[str, float]) -> dict[str, Any]:
    """The latency record of a shipped graph the budget does not judge, read right after the judged one
    beside the teacher and so scaled by the teacher's drift in that pair (with the reading itself where it
    was scaled)."""
    other = judge.alone(graph)
    factor = drift.get("latency_scaled_by", 1.0)
    return replace(latency_record(other.scaled(factor)), read_ms=float(other.median_ms) if factor != 1.0 else None
                   ).to_attrs()
