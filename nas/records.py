"""A study as plain rows and facts: the single source for trials.csv, summary.json and the pages.

Read from the storage only (trial and study user attributes), so `kdnas report` can rebuild every
output without the teacher, the corpus or the search process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import optuna
from optuna.trial import TrialState

from .ledger import TimeLedger, time_ledger
from .resume import heartbeat_retries
from .schema import BEFORE_TRAINING, FinalRecord, StudyFacts, TrialRecord, TrialSeconds, TrialStatus, recorded


@dataclass(frozen=True)
class TrialRow:
    """One trial as trials.csv, summary.json and the pages show it: its record (`nas.schema.TrialRecord`) with
    the state Optuna gives it, the latency of the graph it is judged by and the reason in words."""

    number: int
    state: str = "COMPLETE"  # Optuna's
    status: str = TrialStatus.FEASIBLE  # a TrialStatus, or "running (PHASE)" while it runs
    arch: str | None = None
    layers: int | None = None
    heads: int | None = None
    hidden: int | None = None
    ffn: int | None = None
    params: int | None = None
    flops: int | None = None
    # the judged graph's reading (`_latency_columns`)
    latency_median_ms: float | None = None
    latency_p90_ms: float | None = None
    latency_min_ms: float | None = None
    latency_cv: float | None = None
    latency_noisy: bool | None = None
    latency_cached: bool | None = None
    # nas.measure.trial_latency: set where the reading was judged side by side with the teacher
    latency_scaled_by: float | None = None
    # nas.measure: predicted by the latency model instead of measured; or measured, and what it predicted
    latency_predicted: bool = False
    latency_model_ms: float | None = None
    precision: str = "fp32"
    latency_fp32_ms: float | None = None
    latency_int8_ms: float | None = None
    loss: float | None = None
    loss_se: float | None = None
    fidelity: float | None = None
    fidelity_fp32: float | None = None
    fidelity_int8: float | None = None
    l_hs_raw: float | None = None
    l_hs_norm: float | None = None
    l_hs_se: float | None = None
    reward: float | None = None
    reason: str = ""
    retry_of: int | None = None
    seconds_latency: float | None = None
    seconds_distill: float | None = None
    seconds_teacher: float | None = None  # of seconds_distill: the one-time teacher work it did first
    seconds_total: float | None = None
    datetime_start: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON and CSV hold it (the storage edge of the pages: `summary.json`, `trials.csv`)."""
        return {name: getattr(self, name) for name in COLUMNS}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> TrialRow:
        """A row read back from `summary.json`'s `trials_table` (columns this version lacks are left out)."""
        return cls(**{name: row[name] for name in COLUMNS if name in row})


COLUMNS = tuple(f.name for f in fields(TrialRow))

_STATUS_OF_STATE = {TrialState.RUNNING: TrialStatus.RUNNING, TrialState.WAITING: TrialStatus.WAITING,
                    TrialState.PRUNED: TrialStatus.PRUNED, TrialState.FAIL: TrialStatus.FAILED}


def trial_rows(study: optuna.Study) -> list[TrialRow]:
    retried_by = heartbeat_retries(study)
    return [_row(t, retried_by.get(t.number)) for t in study.get_trials(deepcopy=False)]


def _row(trial: optuna.trial.FrozenTrial, retried_by: int | None = None) -> TrialRow:
    rec = recorded(trial)
    status = str(_STATUS_OF_STATE.get(trial.state) or rec.status or TrialStatus.FEASIBLE)
    if trial.state == TrialState.RUNNING:
        status = f"running ({rec.phase or 'start'})"
    arch = rec.arch
    # The arch names the shape as built; params lack `heads` when the space derives it from hidden.
    shape = [int(v) for v in arch.split("x")] if arch else [trial.params.get(k) for k in ("layers", "heads", "hidden", "ffn")]
    if arch is None and all(v is not None for v in shape):
        arch = "x".join(str(v) for v in shape)
    seconds = rec.seconds or TrialSeconds()
    loss_norm, loss_raw, loss_se = rec.l_hs_norm, rec.l_hs_raw, rec.l_hs_se
    last = rec.last_eval
    if loss_norm is None and trial.state == TrialState.PRUNED and last:
        # the held-out loss when it was stopped (on the interim rows)
        loss_norm, loss_raw, loss_se = last["l_hs_norm"], last["l_hs_raw"], last.get("l_hs_se")
    # The reward's loss (nas.proxy); a pruned trial, or one stored before the loss was, scores by L_HS
    # (only the hs proxy prunes, and it was the only proxy then).
    loss = loss_norm if rec.loss is None else rec.loss
    return TrialRow(
        number=trial.number,
        state=trial.state.name,
        status=status,
        arch=arch,
        layers=shape[0], heads=shape[1], hidden=shape[2], ffn=shape[3],
        params=rec.params,
        flops=rec.flops,
        **_latency_columns(rec),
        **_precision_columns(rec),
        loss=loss,
        loss_se=loss_se if rec.loss_se is None else rec.loss_se,
        fidelity=rec.fidelity,
        fidelity_fp32=rec.fidelity_fp32,
        fidelity_int8=rec.fidelity_int8,
        l_hs_raw=loss_raw,
        l_hs_norm=loss_norm,
        l_hs_se=loss_se,
        reward=rec.reward,
        reason=_reason(trial, retried_by),
        retry_of=rec.retry_of,  # Optuna's heartbeat retries too (schema.migrate)
        seconds_latency=seconds.latency,
        seconds_distill=seconds.distill,
        seconds_teacher=seconds.teacher,
        seconds_total=seconds.total,
        datetime_start=trial.datetime_start.isoformat(timespec="seconds") if trial.datetime_start else None,
    )


def _latency_columns(rec: TrialRecord) -> dict[str, Any]:
    """The columns of the latency record of the graph the trial is judged by: its fp32 graph, or (--runtime
    onnxruntime-auto, fp32 over the budget) its all-INT8 graph; both readings are kept beside it
    (`_precision_columns`). No columns (None) where the trial has no reading."""
    lat = rec.latency_int8 if rec.precision == "int8" else rec.latency
    if lat is None:
        return {}
    return dict(latency_median_ms=lat.median_ms, latency_p90_ms=lat.p90_ms, latency_min_ms=lat.min_ms,
                latency_cv=lat.cv, latency_noisy=lat.noisy, latency_cached=lat.cached,
                latency_scaled_by=lat.latency_scaled_by, latency_predicted=bool(lat.predicted),
                latency_model_ms=lat.median_ms if lat.predicted else lat.model_ms)


def _precision_columns(rec: TrialRecord) -> dict[str, Any]:
    return {"precision": rec.precision or "fp32", "latency_fp32_ms": rec.latency and rec.latency.median_ms,
            "latency_int8_ms": rec.latency_int8 and rec.latency_int8.median_ms}


def pareto_front(rows: list[TrialRow]) -> list[TrialRow]:
    """Feasible trained trials not dominated in (latency, the proxy's loss), sorted by latency."""
    points = [r for r in rows if r.status == TrialStatus.FEASIBLE and r.loss is not None
              and r.latency_median_ms is not None]
    points.sort(key=lambda r: (r.latency_median_ms, r.loss))
    front, best_loss = [], float("inf")
    for r in points:
        if r.loss < best_loss:
            front.append(r)
            best_loss = r.loss
    return front


def dominates_point(front: list[TrialRow], latency_ms: float, loss: float) -> TrialRow | None:
    """A front member with lower loss at equal or lower latency than the given point, if any."""
    for r in front:
        if r.latency_median_ms <= latency_ms and r.loss < loss:
            return r
    return None


def loss_of(record: dict[str, Any]) -> float | None:
    """The reward's loss of a reference or finalist record; records from before it was stored: L_HS."""
    return record.get("loss", record.get("l_hs_norm"))


def steps_label(record: FinalRecord) -> str:
    """A finalist's training steps: "1200 steps", "1043 of 1200 steps (fitted to --timeout 480 s)" or
    "2011 steps (1200 planned, more in the time --timeout 480 s left)", with the run it continued
    when a wider finalist handed it on (nas.final)."""
    steps, planned = record.steps, record.steps_planned
    label = f"{steps} steps"
    if planned is not None and steps is not None and steps != planned:
        timeout = record.timeout_s
        limit = "" if timeout is None else f" --timeout {timeout:g} s"
        if steps < planned:
            label = f"{steps} of {planned} steps" + (f" (fitted to{limit})" if limit else "")
        else:
            label = f"{steps} steps ({planned} planned, more in the time{limit} left)"
    init = record.init
    if isinstance(init, dict) and init.get("init") == "continued" and "from" in init:
        label += (f" on top of {init['after_steps']} as {init['from']} "
                  "(refused over the budget as shipped, then narrowed)")
    if isinstance(init, dict) and init.get("start_shipped"):
        label += f", then dropped ({init['start_shipped']})"
    return label


def trial_pace(study: optuna.Study, number: int) -> float | None:
    """Seconds per update of trial `number`'s proxy run (nas.trial records it; with the fidelity proxy
    it is the final recipe's pace), or None for a trial stored without it."""
    trials = study.get_trials(deepcopy=False)
    pace = recorded(trials[number]).step_s if 0 <= number < len(trials) else None
    return None if pace is None else float(pace)


def best_row(rows: list[TrialRow]) -> TrialRow | None:
    feasible = [r for r in rows if r.status == TrialStatus.FEASIBLE and r.reward is not None]
    return max(feasible, key=lambda r: r.reward) if feasible else None


@dataclass(frozen=True)
class LatencyModelFacts:
    """How often the latency model stood in for a measurement (`predicted`), and its error where a trial was
    measured anyway (`checked`: those near the budget, so not a random sample; benchmarks/latency_model.py holds
    one): its MAPE, and Kendall's tau from two checks on."""

    predicted: int = 0
    checked: int = 0
    mape: float | None = None
    kendall_tau: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class BudgetRow:
    """One budget of a study of several (nas.budgets): the trials it holds (every trial is scored for every budget
    it fits), the best of them, and the students shipped for it."""

    label: str
    budget_ms: float
    folder: str
    trials_within: tuple[int, ...]
    best_trial: int | None
    final: tuple[FinalRecord, ...]

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "budget_ms": self.budget_ms, "folder": self.folder,
                "trials_within": list(self.trials_within), "best_trial": self.best_trial,
                "final": [f.to_attrs() for f in self.final]}


@dataclass(frozen=True)
class StudySummary:
    """A study as summary.json, the pages and the printed summary show it: its facts (`StudyFacts`), its trial rows,
    and what is counted from them — the statuses, the trials rejected before training, the mean time split, the
    best trial, the latency model's record, the Pareto front and each budget's row."""

    study_name: str
    facts: StudyFacts
    rows: tuple[TrialRow, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    rejected_before_training: int = 0
    rejected_before_training_share: float | None = None
    seconds_per_trial: dict[str, float | None] = field(default_factory=dict)
    best_trial: TrialRow | None = None
    latency_model: LatencyModelFacts = LatencyModelFacts()
    pareto_front: tuple[int, ...] = ()
    budgets: tuple[BudgetRow, ...] | None = None  # a study of several budgets: one row each, largest first
    time_ledger: TimeLedger = TimeLedger()  # seconds by phase and the share training (nas.ledger)

    @property
    def trials(self) -> int:
        return len(self.rows)

    @property
    def settings(self) -> dict[str, Any]:
        return self.facts.settings or {}

    def to_json(self, table: bool = True) -> dict[str, Any]:
        """summary.json (the storage edge of the pages): the facts' JSON and the counts, with the trials' table."""
        f = self.facts
        summary = {
            "study_name": self.study_name, "settings": self.settings,
            "teacher_latency": f.teacher_latency and f.teacher_latency.to_attrs(), "budget_ms": f.budget_ms,
            "budget_tolerance": f.budget_tolerance, "fastest": f.fastest, "space_size": f.space_size, "rule": f.rule,
            "trials": self.trials, "counts": self.counts, "rejected_before_training": self.rejected_before_training,
            "rejected_before_training_share": self.rejected_before_training_share,
            "seconds_per_trial": self.seconds_per_trial,
            "best_trial": None if self.best_trial is None else self.best_trial.as_dict(),
            "latency_model": self.latency_model.to_json(), "pareto_front": list(self.pareto_front), "reference": f.reference,
            "final": [r.to_attrs() for r in f.final] if f.final is not None else None,
            **{name: _json_of(getattr(f, name)) for name in ("teacher_int8", "teacher_plans")},
            **{name: [r.to_attrs() for r in getattr(f, name) or ()]
               for name in ("final_teacher", "final_over_budget", "final_neighbours")},
            **({"budgets": [b.to_json() for b in self.budgets]} if self.budgets else {}),
            "time_ledger": self.time_ledger.to_json(), "target": f.target,
            "verified": list(f.verified) if f.verified is not None else None,
        }
        return {**summary, "trials_table": [r.as_dict() for r in self.rows]} if table else summary


def _json_of(record: Any) -> Any:
    return None if record is None else record.to_attrs()


def study_summary(study: optuna.Study, rows: list[TrialRow]) -> StudySummary:
    """The study's facts with its rows counted: what summary.json and the pages show."""
    facts = StudyFacts.from_study(study)
    counts: dict[str, int] = {}
    for r in rows:
        key = r.status.split(" ")[0]
        counts[key] = counts.get(key, 0) + 1
    finished = [r for r in rows if r.state in ("COMPLETE", "PRUNED", "FAIL")]
    before_training = [r for r in finished if r.status in BEFORE_TRAINING]
    timed = [r for r in finished if r.seconds_total is not None]

    def mean(key: str) -> float | None:
        values = [getattr(r, key) for r in timed if getattr(r, key) is not None]
        return round(sum(values) / len(values), 3) if values else None

    return StudySummary(
        study_name=study.study_name, facts=facts, rows=tuple(rows), counts=counts,
        rejected_before_training=len(before_training),
        rejected_before_training_share=round(len(before_training) / len(finished), 4) if finished else None,
        seconds_per_trial={"latency": mean("seconds_latency"), "distill": mean("seconds_distill"),
                           "total": mean("seconds_total")},
        best_trial=best_row(rows), latency_model=latency_model_facts(rows),
        pareto_front=tuple(r.number for r in pareto_front(rows)),
        budgets=tuple(budget_table(facts, rows)) if facts.budgets else None,
        time_ledger=time_ledger(facts.run_seconds, rows, facts.final or ()))


def budget_table(facts: StudyFacts, rows: list[TrialRow]) -> list[BudgetRow]:
    """A study of several budgets, one row each, largest first (nas.budgets)."""
    from .budgets import study_budgets, within

    table = []
    for budget in study_budgets(facts):
        fits = [r for r in within(rows, budget, facts) if r.status == TrialStatus.FEASIBLE]
        best = best_row(fits)
        table.append(BudgetRow(label=budget.label, budget_ms=budget.ms, folder=budget.best,
                               trials_within=tuple(r.number for r in fits),
                               best_trial=None if best is None else best.number,
                               final=tuple(f for f in facts.final or () if f.recipe_budget == budget.label)))
    return table


def model_checked(rows: list[TrialRow]) -> list[TrialRow]:
    """Trials measured in their own run although the latency model had a prediction for them (its interval
    held the budget): the only trials where predicted and measured stand side by side. A trial that reused
    another's reading of its shape carries no prediction (nas.trial._stored_latency), so none counts twice."""
    return [r for r in rows if r.latency_model_ms is not None and not r.latency_predicted
            and r.latency_median_ms is not None]


def latency_model_facts(rows: list[TrialRow]) -> LatencyModelFacts:
    from kdnas.latency import kendall_tau, mape

    checked = model_checked(rows)
    facts = LatencyModelFacts(predicted=sum(r.latency_predicted for r in rows), checked=len(checked))
    if not checked:
        return facts
    predicted, measured = [r.latency_model_ms for r in checked], [r.latency_median_ms for r in checked]
    return replace(facts, mape=round(mape(predicted, measured), 4),
                   kendall_tau=round(kendall_tau(predicted, measured), 4) if len(checked) >= 2 else None)


def _reason(trial: optuna.trial.FrozenTrial, retried_by: int | None) -> str:
    reason = recorded(trial).reason or ""
    if retried_by is None or trial.state != TrialState.FAIL:
        return reason
    # Failed by Optuna's heartbeat: its worker died; the user attributes are from its last phase.
    return (f"stale: its worker stopped sending heartbeats during phase {(recorded(trial).phase or 'start')!r}; "
            f"retried as trial {retried_by}")
