"""Plotly figures of a study: Pareto plot, optimization history, parameter importances, latency model.

Only SVG traces (`go.Scatter`, `go.Bar`), never WebGL, so the pages render in any browser,
headless ones included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState, create_trial

from kdnas.core.errors import first_line

from .budgets import study_budgets
from .config import StoredSettings
from .records import TrialRow, latency_model_facts, loss_of, model_checked, pareto_front
from .schema import STUDENT, UNTRAINED_LOSS, FinalRecord, Quality, StudyFacts, TrialStatus, recorded

_STYLE = {  # status -> (legend name, marker)
    TrialStatus.FEASIBLE: ("feasible (trained)", dict(symbol="circle", size=9, color="#1f77b4")),
    TrialStatus.PRUNED: ("pruned (loss when stopped)", dict(symbol="diamond", size=9, color="#ff7f0e")),
    TrialStatus.INFEASIBLE: (f"over budget (not trained, drawn at loss {UNTRAINED_LOSS:g})",
                   dict(symbol="x", size=10, color="#d62728")),
    TrialStatus.RESAMPLED: ("predicted over budget (not measured, proposed again)",
                  dict(symbol="x-open", size=8, color="#f4a3a3")),
    TrialStatus.FAILED: (f"failed (drawn at loss {UNTRAINED_LOSS:g} unless evaluated)",
               dict(symbol="triangle-up", size=9, color="#7f7f7f")),
}


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _hover(r: TrialRow) -> str:
    params = r.params
    return "<br>".join([
        f"<b>trial {r.number}</b>: {r.arch} ({r.status})",
        f"params {params / 1e6:.2f} M" if params else "params –",
        f"latency median {_fmt(r.latency_median_ms, '.2f')} ms, p90 {_fmt(r.latency_p90_ms, '.2f')}, "
        f"min {_fmt(r.latency_min_ms, '.2f')}, cv {_fmt(r.latency_cv, '.3f')}"
        + (" (noisy)" if r.latency_noisy else ""),
        f"loss {_fmt(r.loss, '.4f')} ± {_fmt(r.loss_se, '.4f')} (SE); fidelity ρ {_fmt(r.fidelity, '.4f')}",
        f"L_HS norm {_fmt(r.l_hs_norm, '.4f')} ± {_fmt(r.l_hs_se, '.4f')} (SE), raw {_fmt(r.l_hs_raw, '.4f')}",
        f"reward {_fmt(r.reward, '.4f')}",
        *([r.reason[:120]] if r.reason else []),
    ])


def pareto_figure(rows: list[TrialRow], facts: StudyFacts) -> go.Figure:
    fig = go.Figure()
    for status, (name, marker) in _STYLE.items():
        group = [r for r in rows if r.status == status and r.latency_median_ms is not None]
        if not group:
            continue
        y = [r.loss if r.loss is not None else UNTRAINED_LOSS for r in group]
        fig.add_trace(go.Scatter(
            x=[r.latency_median_ms for r in group], y=y, mode="markers", name=f"{name} ({len(group)})",
            marker=marker, text=[_hover(r) for r in group], hoverinfo="text",
            error_x=dict(type="data", symmetric=False, array=[r.latency_p90_ms - r.latency_median_ms
                         if r.latency_p90_ms is not None else 0 for r in group],
                         arrayminus=[r.latency_median_ms - r.latency_min_ms
                                     if r.latency_min_ms is not None else 0 for r in group],
                         thickness=1, width=0, color=marker["color"]),
            error_y=dict(type="data", array=[2 * (r.loss_se or 0) for r in group],
                         thickness=1, width=3, color=marker["color"]),
        ))
    front = pareto_front(rows)
    if front:
        fig.add_trace(go.Scatter(
            x=[r.latency_median_ms for r in front], y=[r.loss for r in front],
            mode="lines+markers", line=dict(shape="hv", color="#2ca02c", width=2), name=f"Pareto front ({len(front)})",
            marker=dict(symbol="circle-open", size=15, color="#2ca02c", line=dict(width=2)),
            hoverinfo="skip",
        ))
    teacher = facts.teacher_latency and facts.teacher_latency.median_ms
    if teacher:
        fig.add_vline(x=teacher, line=dict(color="#9467bd", dash="dot"))
        fig.add_trace(go.Scatter(
            x=[teacher], y=[0.0], mode="markers+text", name="teacher (loss 0 by definition)",
            marker=dict(symbol="star", size=14, color="#9467bd"), text=["teacher"], textposition="top left",
            hovertext=[f"teacher {StoredSettings.of(facts.settings).teacher}: {teacher:.2f} ms"],
            hoverinfo="text",
        ))
    _add_budgets(fig, facts)
    _add_references(fig, facts)
    _add_finals(fig, facts)
    fig.update_layout(
        title="Latency vs the proxy's loss (lower-left is better)",
        xaxis_title=f"CPU latency, median ms ({_latency_setting(facts)}); bars: min..p90",
        yaxis_title=f"{_loss_label(facts)}; bars: ±2 SE",
        hovermode="closest", legend=dict(orientation="h", y=-0.25), height=620, template="plotly_white",
    )
    return fig



def _add_budgets(fig: go.Figure, facts: StudyFacts) -> None:
    """A dashed line at each budget: the study's one, or each of several (nas.budgets), labelled."""
    if not facts.budgets and not facts.budget_ms:
        return
    for b in study_budgets(facts):
        fig.add_vline(x=b.ms, line=dict(color="#d62728", dash="dash", width=2), annotation_position="top",
                      annotation_text=(f"{b.label} " if b.label else "") + f"budget {b.ms:.2f} ms")


def students_figure(facts: StudyFacts) -> go.Figure:
    """The models a user picks from, after the final stage: each shipped student as model.onnx (fp32),
    model.int8.onnx and its precision plan (model.mixed.onnx, where grown), its two untrained baselines, and the
    teacher — fp32, INT8 and its best plan within each budget — by latency and embedding fidelity ρ to the
    teacher on held-out sentences (the final stage's, not the proxy's)."""
    fig = go.Figure()
    teacher = facts.teacher_latency and facts.teacher_latency.median_ms
    if teacher:
        fig.add_trace(go.Scatter(x=[teacher], y=[1.0], mode="markers+text", name="teacher, fp32 (ρ 1 by definition)",
                                 marker=dict(symbol="star", size=14, color="#9467bd"), text=["teacher"],
                                 textposition="bottom left", hoverinfo="name"))
    int8 = facts.teacher_int8
    if int8 is not None:
        ms, rho = int8.latency.median_ms, int8.fidelity.spearman
        fig.add_trace(go.Scatter(x=[ms], y=[rho], mode="markers+text", name="teacher, INT8 (free: no training)",
                                 marker=dict(symbol="star-open", size=14, color="#9467bd", line=dict(width=2)),
                                 text=["teacher INT8"], textposition="bottom left",
                                 hovertext=[f"the teacher as INT8: {ms:.2f} ms, ρ {rho:.3f}"], hoverinfo="text"))
    styles = {"fp32": dict(symbol="star-diamond", size=14, color="#e377c2"),
              "int8": dict(symbol="diamond", size=11, color="#8c564b"),
              "mixed": dict(symbol="diamond-wide", size=13, color="#17becf"),
              "teacher plan": dict(symbol="star-triangle-up", size=14, color="#9467bd"),
              "baseline": dict(symbol="circle-open", size=11, color="#7f7f7f", line=dict(width=2))}
    points: dict[str, list[tuple[float, float, str]]] = {kind: [] for kind in styles}
    for f in facts.final or ():
        for kind, x, y, text in _student_points(f):
            points[kind].append((x, y, text))
    for t in facts.final_teacher or ():  # its plan within each budget (nas.plans)
        where = f"shipped in {t.dir}" if t.shipped else "not shipped: the student is closer"
        ms, label = t.plan.latency_ms, t.plan.label
        points["teacher plan"].append((ms, t.fidelity.spearman, f"the teacher, {label}: {ms:.2f} ms, "
                                       f"ρ {t.fidelity.spearman:.3f} ({where})"))
    names = {"fp32": "shipped student, model.onnx", "int8": "shipped student, model.int8.onnx",
             "mixed": "shipped student, its precision plan (model.mixed.onnx)",
             "teacher plan": "the teacher with its best plan within a budget (no training)",
             "baseline": "its untrained baselines (at the student's fp32 latency)"}
    for kind, group in points.items():
        if group:
            fig.add_trace(go.Scatter(x=[p[0] for p in group], y=[p[1] for p in group], mode="markers",
                                     name=f"{names[kind]} ({len(group)})", marker=styles[kind],
                                     hovertext=[p[2] for p in group], hoverinfo="text"))
    _add_budgets(fig, facts)
    if not any(points.values()):
        fig.add_annotation(text="no student shipped yet (the final stage writes them)", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title="Shipped students beside the teacher and their untrained baselines (upper-left is better)",
                      xaxis_title=f"CPU latency, median ms ({_latency_setting(facts)})",
                      yaxis_title="embedding fidelity ρ to the teacher, held-out sentences", hovermode="closest",
                      legend=dict(orientation="h", y=-0.25), height=560, template="plotly_white")
    return fig


def _student_points(final: FinalRecord) -> list[tuple[str, float, float, str]]:
    """(kind, latency ms, ρ, hover text) of one shipped student: fp32, INT8 and its baselines, where measured."""
    quality = final.quality or Quality()
    fp32 = final.latency_ms if final.latency_fp32_onnx is None else final.latency_fp32_onnx.median_ms
    int8, mixed = (None if r is None else r.median_ms for r in (final.latency_int8_onnx, final.latency_mixed_onnx))
    where = f"{final.arch}" + (f" ({final.budget} budget)" if final.budget else "") + f", {final.dir}"
    points = []
    if quality.student is not None and fp32 is not None:
        points.append(("fp32", fp32, quality.student.spearman, f"{where}<br>model.onnx {fp32:.2f} ms, "
                       f"ρ {quality.student.spearman:.3f}"))
    if quality.int8 is not None and int8 is not None:
        points.append(("int8", int8, quality.int8.spearman, f"{where}<br>model.int8.onnx {int8:.2f} ms, "
                       f"ρ {quality.int8.spearman:.3f}"))
    if quality.mixed is not None and mixed is not None:
        plan = (final.precision_plan or {}).get("label", "a precision plan")
        points.append(("mixed", mixed, quality.mixed.spearman, f"{where}<br>model.mixed.onnx ({plan}) "
                       f"{mixed:.2f} ms, ρ {quality.mixed.spearman:.3f}"))
    for name, row in quality.fidelity.items():
        if name != STUDENT and fp32 is not None:
            points.append(("baseline", fp32, row.spearman, f"{name} of {where}: ρ {row.spearman:.3f}"))
    return points


def _add_references(fig: go.Figure, facts: StudyFacts) -> None:
    """The paper's Table 1 shapes, proxy-distilled like every trial (`--reference`)."""
    refs = [r for r in facts.reference or [] if r.get("latency_ms") is not None and loss_of(r) is not None]
    if refs:
        fig.add_trace(go.Scatter(
            x=[r["latency_ms"] for r in refs], y=[loss_of(r) for r in refs], mode="markers+text",
            name="paper shapes, Table 1 scaled (proxy-distilled)", text=[r["name"] for r in refs],
            textposition="bottom right", marker=dict(symbol="square-open", size=12, color="#17becf", line=dict(width=2)),
            hovertext=[f"{r['name']}: {r['arch']}<br>latency {r['latency_ms']:.2f} ms<br>"
                       f"loss {loss_of(r):.4f}<br>reward {_fmt(r.get('reward'), '.4f')}" for r in refs],
            hoverinfo="text",
        ))


def _add_finals(fig: go.Figure, facts: StudyFacts) -> None:
    """The finalists after the final stage: the shipped models' latency and loss."""
    finals = facts.final or ()
    if finals:
        fig.add_trace(go.Scatter(
            x=[f.latency_ms for f in finals], y=[f.reward_loss for f in finals], mode="markers",
            name="finalist after --final-steps", marker=dict(symbol="star-diamond", size=14, color="#e377c2"),
            hovertext=[f"final {f.arch} (trial {f.trial}, {f.steps} steps)<br>latency {f.latency_ms:.2f} ms"
                       f"<br>loss {f.reward_loss:.4f}<br>reward {f.reward:.4f}" for f in finals],
            hoverinfo="text",
        ))


def _loss_label(facts: StudyFacts) -> str:
    if StoredSettings.of(facts.settings).proxy.kind == "fidelity":
        return "1 − embedding fidelity ρ on held-out sentences (0 = the teacher's similarities)"
    return "normalized held-out L_HS (1 = predicting the mean)"


def latency_setting(settings: Mapping[str, Any] | None) -> str:
    """How a study reads latency, in words."""
    s = StoredSettings.of(settings).latency
    return f"batch {s.batch}, seq {s.seq}, {s.threads} threads, {s.runtime}"


def _latency_setting(facts: StudyFacts) -> str:
    return latency_setting(facts.settings)


def history_figure(rows: list[TrialRow]) -> go.Figure:
    fig = go.Figure()
    done = sorted((r for r in rows if r.reward is not None), key=lambda r: r.number)
    fig.add_trace(go.Scatter(x=[r.number for r in done], y=[r.reward for r in done], mode="markers",
                             name="reward (trained trials)", marker=dict(size=9, color="#1f77b4"),
                             text=[_hover(r) for r in done], hoverinfo="text"))
    best, xs, ys = -math.inf, [], []
    for r in done:
        best = max(best, r.reward)
        xs.append(r.number)
        ys.append(best)
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(shape="hv", color="#2ca02c"),
                                 name="best so far"))
    other = [r for r in rows if r.reward is None and r.state != "WAITING"]
    if other:
        fig.add_trace(go.Scatter(
            x=[r.number for r in other], y=[0.0] * len(other), mode="markers", name="not scored (at 0)",
            marker=dict(symbol="x", size=8, color="#d62728"), text=[_hover(r) for r in other], hoverinfo="text"))
    fig.update_layout(title="Optimization history (KD-NAS reward)", xaxis_title="trial",
                      yaxis_title="reward", template="plotly_white", height=420)
    return fig


def importances(study: optuna.Study, rows: list[TrialRow]) -> tuple[dict[str, float], str]:
    """Parameter importances for the reward over the trained trials, or ({}, why not)."""
    trained = {r.number: r.reward for r in rows if r.reward is not None}
    frozen = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.number in trained and recorded(t).duplicate_of is None]  # a copy adds no information
    if len(frozen) < 2:
        return {}, f"needs at least 2 trained trials (has {len(frozen)})"
    # Untrained trials carry placeholder values, so the evaluator sees only trained ones, scored by reward.
    scratch = optuna.create_study(direction="maximize")
    scratch.add_trials([
        create_trial(params=t.params, distributions=t.distributions, value=trained[t.number]) for t in frozen
    ])
    try:
        return dict(optuna.importance.get_param_importances(scratch)), ""
    except Exception as err:  # e.g. every trained trial has the same value
        return {}, f"not computable yet: {first_line(err)}"


def importance_figure(values: dict[str, float], why_not: str) -> go.Figure:
    fig = go.Figure()
    if values:
        names = list(values)[::-1]
        fig.add_trace(go.Bar(x=[values[n] for n in names], y=names, orientation="h", marker_color="#1f77b4",
                             text=[f"{values[n]:.2f}" for n in names], textposition="auto", name="importance"))
    else:
        fig.add_annotation(text=f"Parameter importances {why_not}", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
    fig.update_layout(title="Parameter importances for the reward (trained trials)", xaxis_title="importance",
                      template="plotly_white", height=320)
    return fig


def latency_model_figure(rows: list[TrialRow]) -> go.Figure:
    """The latency model's prediction against the measurement, for the trials measured although it had a
    prediction (its interval held the budget); the diagonal is a perfect prediction."""
    fig = go.Figure()
    checked = model_checked(rows)
    if checked:
        measured, predicted = [r.latency_median_ms for r in checked], [r.latency_model_ms for r in checked]
        fig.add_trace(go.Scatter(
            x=measured, y=predicted, mode="markers", name="trial (measured near the budget)",
            marker=dict(size=9, color="#1f77b4"), text=[f"#{r.number} {r.arch}" for r in checked],
            hoverinfo="text+x+y"))
        edge = [min(measured + predicted) * 0.9, max(measured + predicted) * 1.1]
        fig.add_trace(go.Scatter(x=edge, y=edge, mode="lines", name="predicted = measured",
                                 line=dict(color="#999", dash="dot")))
    facts = latency_model_facts(rows)
    words = (f"{facts.predicted} trials predicted instead of measured; {facts.checked} measured near the "
             f"budget with a prediction" + (f", MAPE {facts.mape:.3f}" if facts.mape is not None else "")
             + (f", Kendall's τ {facts.kendall_tau:.2f}" if facts.kendall_tau is not None else ""))
    if not checked:
        words += " (the model needs six measured shapes; a prediction clear of the budget is not measured)"
    fig.update_layout(title=f"Latency model: {words}", xaxis_title="measured ms", yaxis_title="predicted ms",
                      template="plotly_white", height=420, title_font_size=13)
    return fig
