"""The search's outputs, rebuilt from the storage: trials.csv, summary.json, pareto.html, report.html.

Pages are fully offline (plotly.js embedded once per page) and written atomically, so a browser or
a second `kdnas report` never reads half a file, also while a search is writing the study.
"""

from __future__ import annotations

import csv
import html
import io
import json
from pathlib import Path
from typing import Any

import optuna
import plotly.io as pio

from kdnas.core.files import atomic_write_text

from .neighbours import shape_label
from .config import StoredSettings
from .plots import (history_figure, importance_figure, importances, latency_model_figure, latency_setting, pareto_figure,
                    students_figure)
from .records import COLUMNS, StudySummary, TrialRow, steps_label, study_summary, trial_rows

_TABLE_COLUMNS = (
    ("number", "#"), ("status", "status"), ("arch", "L×A×H×F"), ("params", "params (M)"),
    ("flops", "GFLOPs"), ("latency_median_ms", "latency ms"), ("latency_p90_ms", "p90 ms"),
    ("latency_cv", "cv"), ("loss", "proxy loss"), ("loss_se", "± SE"), ("fidelity", "fidelity ρ"),
    ("l_hs_norm", "L_HS norm"), ("reward", "reward"),
    ("seconds_total", "time s"), ("reason", "reason"),
)


def write_outputs(study: optuna.Study, out: str | Path) -> StudySummary:
    """Write all four outputs into `out`; returns the summary."""
    out = Path(out)
    rows = trial_rows(study)
    summary = study_summary(study, rows)
    atomic_write_text(out / "summary.json", json.dumps(summary.to_json(), indent=2, default=str) + "\n")
    atomic_write_text(out / "trials.csv", _csv(rows))
    pareto, students = pareto_figure(rows, summary.facts), students_figure(summary.facts)
    atomic_write_text(out / "pareto.html", _pareto_page(summary, pareto, students))
    values, why_not = importances(study, rows)
    atomic_write_text(out / "report.html", _report_page(summary, [
        students, pareto, history_figure(rows), importance_figure(values, why_not), latency_model_figure(rows)]))
    return summary


def _pareto_page(summary: StudySummary, pareto: Any, students: Any) -> str:
    """pareto.html: the students the final stage shipped (the models to pick), then the trials by proxy score."""
    divs = [pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False, config={"displaylogo": False})
            for i, fig in enumerate((students, pareto))]  # plotly.js comes with the first figure on the page
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kdnas Pareto: {html.escape(summary.study_name)}</title>
<style>body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}</style></head><body>
<h2>Shipped students</h2>{divs[0]}
<h2>Trials: latency against the proxy's loss</h2>{divs[1]}
</body></html>
"""


def _csv(rows: list[TrialRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in r.as_dict().items()})
    return buffer.getvalue()


def _cell(key: str, value: Any) -> str:
    if value is None or value == "":
        return ""
    if key == "params":
        return f"{value / 1e6:.2f}"
    if key == "flops":
        return f"{value / 1e9:.2f}"
    if isinstance(value, float):
        return f"{value:.3f}" if key.startswith(("latency", "seconds")) else f"{value:.4f}"
    return html.escape(str(value))


def _proxy(settings: StoredSettings) -> str:
    """How trials were scored, in words."""
    proxy = settings.proxy
    if proxy.kind == "fidelity":
        return (f"proxy: the final recipe for {proxy.steps} steps, scored by embedding fidelity on "
                f"{proxy.sentences} held-out sentences (loss = 1 − ρ)")
    return f"proxy: {proxy.method} for {proxy.steps} steps, scored by held-out L_HS"


def _report_page(summary: StudySummary, figures: list) -> str:
    divs = [pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False, config={"displaylogo": False})
            for i, fig in enumerate(figures)]
    s, teacher, best = StoredSettings.of(summary.settings), summary.facts.teacher_latency, summary.best_trial
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items()))
    lines = [
        f"teacher <b>{html.escape(str(s.teacher))}</b>, corpus {html.escape(str(s.corpus))}, "
        f"objective {s.reward.objective}, sampler {s.sampler}, {html.escape(_proxy(s))}",
        f"{_budgets_line(summary)}; teacher latency "
        f"{_cell('latency', teacher and teacher.median_ms)} ms ({html.escape(latency_setting(summary.settings))})",
        f"trials {summary.trials}: {html.escape(counts)}; rejected before training: "
        f"{summary.rejected_before_training}",
        "best trial: " + (f"#{best.number} {best.arch}, reward {best.reward:.4f}, "
                          f"proxy loss {best.loss:.4f}, {best.latency_median_ms:.2f} ms" if best else "none yet"),
    ]
    for f in summary.facts.final or ():
        lines.append(f"final {html.escape(f.dir)}: {shape_label(f)} after {steps_label(f)}, loss {f.reward_loss:.4f}, "
                     f"{f.latency_ms:.2f} ms, reward {f.reward:.4f}")
    lines.append("mean seconds per trial: " + ", ".join(f"{k} {_cell('seconds', v)}"
                                                        for k, v in summary.seconds_per_trial.items()))
    lines.append("where the time went: " + html.escape(summary.time_ledger.line().removeprefix("time: ")))
    if summary.facts.target is not None:
        lines.append(f"latency judged by the target profile of {html.escape(summary.facts.target['cpu'])} "
                     f"({html.escape(summary.facts.target['file'])}): no reading in the search")
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in _TABLE_COLUMNS)
    body = "".join(
        f"<tr class='{html.escape(r.status.split(' ')[0])}'>"
        + "".join(f"<td>{_cell(k, getattr(r, k))}</td>" for k, _ in _TABLE_COLUMNS) + "</tr>"
        for r in summary.rows
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kdnas search report: {html.escape(summary.study_name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }} th, td {{ border: 1px solid #ddd; padding: 3px 6px; }}
th {{ background: #f3f3f3; position: sticky; top: 0; }} td {{ text-align: right; }} td:last-child {{ text-align: left; }}
tr.infeasible, tr.rejected {{ color: #b22; }} tr.pruned {{ color: #c60; }} tr.failed {{ color: #777; }}
ul.facts li {{ margin: 2px 0; }}
</style></head><body>
<h1>kdnas search: {html.escape(summary.study_name)}</h1>
<ul class="facts">{''.join(f'<li>{line}</li>' for line in lines)}</ul>
<h2>Shipped students</h2>{divs[0]}
<h2>Pareto plot</h2>{divs[1]}
<h2>Optimization history</h2>{divs[2]}
<h2>Parameter importances</h2>{divs[3]}
<h2>Latency model: predicted against measured</h2>{divs[4]}
<h2>Trials</h2>
<table id="trials"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
</body></html>
"""


def _budgets_line(summary: StudySummary) -> str:
    if not summary.budgets:
        return f"budget <b>{_cell('latency', summary.facts.budget_ms)} ms</b>"
    return "budgets " + ", ".join(f"<b>{html.escape(b.label)} {_cell('latency', b.budget_ms)} ms</b> "
                                  f"({len(b.trials_within)} trained trials within, shipped in "
                                  f"{html.escape(b.folder)}/)" for b in summary.budgets)
