"""What a study holds, by name: the statuses a trial ends in, and the version of the record a study was written in.

A study is read by later versions of kdnas (a rerun resumes it, `kdnas report` rebuilds its pages), so each new
study stores SCHEMA_VERSION; a study of a newer version than this kdnas reads is refused in one line rather than
misread. Statuses are stored as their plain strings (JSON), and compare equal to them.

This module is the storage edge: a trial's record (`TrialRecord`, read by `recorded`, written a field at a time
by `store`) and the study's facts (`StudyFacts`, written by `record_fact`) meet Optuna's attributes here and
nowhere else in `nas` (tests/test_layout.py holds it), so a record written by an earlier version is read through
one place (`migrate`), and a field name no record has is refused when written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from enum import Enum
from typing import Any, Protocol, Self

from optuna.trial import FrozenTrial

from kdnas.core.errors import StorageError
from kdnas.evaluation.precision import FP32_GRAPH, INT8_GRAPH, MIXED_GRAPH

from .ledger import RunSeconds

# 1: every study before the version was stored; 2: precision plans (a trial's `precision`, `latency_int8`),
# the budget's tolerance, a repeated shape's status.
SCHEMA_VERSION = 2
VERSION_ATTR = "kdnas_schema"
SETTINGS_ATTR = "kdnas_settings"  # a study without it is not a kdnas study (nas.storage.check_settings)


class TrialStatus(str, Enum):
    """How a trial ended, in `trials.csv`'s `status` column and a trial's `status` attribute."""

    FEASIBLE = "feasible"  # trained and scored within the budget
    INFEASIBLE = "infeasible"  # over the budget: not trained
    REJECTED = "rejected"  # an invalid shape, or one that failed twice
    RESAMPLED = "resampled"  # predicted over the budget: not measured, proposed again, not counted
    REPEAT = "repeat"  # a shape the study holds: answered from it, proposed again, not counted
    SURPLUS = "surplus"  # one trial too many (two workers took the last slot): not run
    PRUNED = "pruned"  # stopped by the pruner
    FAILED = "failed"  # an error, or its worker died
    RUNNING = "running"  # (a row's status while its trial runs, from Optuna's state)
    WAITING = "waiting"  # (queued)

    __hash__ = str.__hash__  # a row's plain string finds its status in a dict keyed by the enum

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# The normalized loss a trial never trained is stored with (predicting the teacher's mean): its constraints
# make it infeasible, so neither samplers nor `best` use it; pages draw it at this loss.
UNTRAINED_LOSS = 1.0
# Settled before any training: what the share of trials "rejected before training" counts.
BEFORE_TRAINING = (TrialStatus.REJECTED, TrialStatus.INFEASIBLE, TrialStatus.RESAMPLED)
# Proposals that count for nothing towards --trials.
UNCOUNTED = (TrialStatus.SURPLUS, TrialStatus.RESAMPLED, TrialStatus.REPEAT)


def check_version(attrs: Mapping[str, Any], where: str) -> None:
    """Refuse a study written by a newer kdnas than this one (its records may mean something else)."""
    version = attrs.get(VERSION_ATTR, 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StorageError(f"{where} holds a study of kdnas record version {version!r}; this kdnas reads versions up "
                           f"to {SCHEMA_VERSION}: upgrade kdnas, or give another --study-name")


class _Attributed(Protocol):
    """An Optuna study or trial (live or frozen): what carries user attributes."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...


def stored(owner: _Attributed) -> Mapping[str, Any]:
    """A study's or a trial's attributes as this version reads them (`migrate`)."""
    # only a frozen trial reads Optuna's own attributes (a live one's are not the record)
    return migrate(owner.user_attrs, owner.system_attrs if isinstance(owner, FrozenTrial) else {})


def stored_system(owner: Any) -> Mapping[str, Any]:
    """Optuna's own attributes of a frozen trial (`failed_trial`: the trial a retry of Optuna's replaces)."""
    return owner.system_attrs


def store(owner: Any, key: str, value: Any) -> None:
    """Write one field of a trial's record (`TrialRecord`; JSON-serializable: the storage is JSON at this edge). A
    trial writes its record a field at a time, as its phases go (a worker that dies leaves what it had), so a
    name the record lacks is refused here rather than stored where no reader looks."""
    owner.set_user_attr(_trial_field(key), _as_stored(value))


def _as_stored(value: Any) -> Any:
    """A value as the storage holds it: a typed record as its JSON (`to_attrs`), in lists and dicts too, anything
    else as it is."""
    if isinstance(value, (list, tuple)):
        return [_as_stored(v) for v in value]
    if isinstance(value, dict):
        return {key: _as_stored(v) for key, v in value.items()}
    return value.to_attrs() if isinstance(value, _Stored) else value


@cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


class _Stored:
    """A typed record stored as the JSON of its set fields (a nested record as its own); read back, a key this
    version does not know is left out (`_known`)."""

    def to_attrs(self) -> dict[str, Any]:
        own_first = sorted(fields(self), key=lambda f: f.kw_only)  # a shared base's keyword-only fields last
        return {f.name: _as_stored(value) for f in own_first if (value := getattr(self, f.name)) is not None}

    @classmethod
    def _known(cls, attrs: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in attrs.items() if key in _names(cls)}

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | Self | None) -> Self | None:
        """The record stored as `attrs` (a record is taken as it is; None where none was stored)."""
        if attrs is None or isinstance(attrs, cls):
            return attrs
        return cls(**cls._known(attrs))


@dataclass(frozen=True, kw_only=True)
class SideBySide(_Stored):
    """The facts of a reading judged side by side with the teacher near a ratio budget (nas.measure.beside_teacher):
    its ratio and the quartiles of its rounds, the teacher's reading then and the graph's own, the factor that put
    it on the scale of the teacher's reading that set the budget, and the pairs where it was read again near the
    edge. One declaration for every record that keeps them (a trial's reading, a refused finalist, the teacher's
    plan as shipped): keyword-only, so each record's own required fields stay first."""

    ratio_to_teacher: float | None = None
    ratio_quartiles: list[float] | None = None
    teacher_latency_now_ms: float | None = None
    read_ms: float | None = None
    latency_scaled_by: float | None = None
    edge_readings: list[dict[str, Any]] | None = None  # the pairs read near the budget (nas.measure.edge_reading)


@dataclass(frozen=True)
class LatencyRecord(SideBySide):
    """One graph's latency as a trial keeps it (`nas.measure`): read alone (its median, spread, cores and window),
    judged side by side with the teacher near a ratio budget, or predicted by the study's latency model. Stored
    as its set fields (`to_attrs`); a key this version does not know is left out when read."""

    median_ms: float
    p90_ms: float | None = None
    min_ms: float | None = None
    cv: float | None = None
    noisy: bool | None = None
    cached: bool | None = None
    cores: list[int] | None = None
    window: list[float] | None = None
    readings_ms: list[float] | None = None  # over the budget once: both readings (nas.measure.budget_latency)
    measured_in_trial: int | None = None  # another trial's reading of the shape, reused (nas.trial)
    # predicted by the latency model (nas.measure.predicted_latency) ...
    predicted: bool | None = None
    interval_ms: list[float] | None = None
    model_readings: int | None = None
    model_rel_error: float | None = None
    # ... or measured where its interval held the budget, with what it predicted (nas.measure.model_check)
    model_ms: float | None = None
    model_interval_ms: list[float] | None = None
    int8_ms: float | None = None  # the teacher's reading (StudyFacts): its all-INT8 graph's median, where INT8 is tried

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | LatencyRecord | None) -> LatencyRecord | None:
        if isinstance(attrs, LatencyRecord):
            return attrs
        if not attrs or "median_ms" not in attrs:  # none taken (an empty record of an interrupted trial)
            return None
        return cls(**cls._known(attrs))


@dataclass(frozen=True)
class Fidelity(_Stored):
    """One model's embedding fidelity on held-out sentences (`evaluation.embedding_fidelity`): Spearman's ρ of its
    pairwise cosines against the teacher's, with its jackknife standard error; `passes` where it was scored on rows
    of its own transfer set, the passes its run made over them (nas.baselines.fidelity_table)."""

    spearman: float
    spearman_se: float | None = None
    mean_cosine: float | None = None
    cosine_via: str | None = None
    pairs: int | None = None
    sentences: int | None = None
    cosine_sentences: int | None = None
    passes: float | None = None

STUDENT = "student"  # the trained model's row of `Quality.fidelity`; the untrained baselines' rows follow it


@dataclass(frozen=True)
class Quality(_Stored):
    """A shipped student's fidelity (nas.baselines.fidelity_table): its row and both untrained baselines' on the same
    `sentences` held-out sentences, whether it beats both, its fidelity on as many rows of its own transfer set
    (`trained_on`), and its INT8 graph's and precision plan's as shipped. Where it was not measured, `skipped` says
    why (the corpus holds too few sentences) and `fidelity` is empty."""

    fidelity: dict[str, Fidelity] = field(default_factory=dict)  # STUDENT first, then the baselines by name
    sentences: int | None = None
    max_len: int | None = None
    beats_baselines: bool = False
    trained_on: Fidelity | None = None
    int8: Fidelity | None = None
    mixed: Fidelity | None = None
    skipped: str | None = None

    @property
    def student(self) -> Fidelity | None:
        return self.fidelity.get(STUDENT)

    def of_graph(self, graph: str) -> Fidelity | None:
        """The row of one shipped graph: model.int8.onnx, model.mixed.onnx, else the fp32 student's."""
        return {INT8_GRAPH: self.int8, MIXED_GRAPH: self.mixed}.get(graph, self.student)

    def to_attrs(self) -> dict[str, Any]:
        return {key: value for key, value in super().to_attrs().items() if value != {}}  # skipped: no rows

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | Quality | None) -> Quality | None:
        """A quality as stored (None: fidelity was not asked for; a key this version does not know is left out)."""
        if attrs is None or isinstance(attrs, Quality):
            return attrs
        known = cls._known(attrs)
        rows = {name: Fidelity.from_attrs(row) for name, row in (known.pop("fidelity", None) or {}).items()}
        return cls(fidelity=rows, **known | {name: Fidelity.from_attrs(known.get(name))
                                             for name in ("trained_on", "int8", "mixed")})



@dataclass(frozen=True)
class Worker(_Stored):
    """The process that runs a trial, or holds the final stage's claim (`claimed_at`: when it took it): its host,
    its pid and when it started (a pid the system reused belongs to a process started at another time)."""

    host: str | None = None
    pid: int | None = None
    started: float | None = None
    claimed_at: float | None = None


@dataclass(frozen=True)
class TrialSeconds(_Stored):
    """Where a trial's time went: reading its latency, its proxy distillation (with, of that, the one-time teacher
    work it happened to do first: the teacher's targets, the probe's embeddings) and in all."""

    latency: float | None = None
    distill: float | None = None
    teacher: float | None = None
    total: float | None = None

    @property
    def own(self) -> float | None:
        """Its time less the one-time teacher work: the pace of a trial (nas.search.final_estimates)."""
        return None if self.total is None else self.total - (self.teacher or 0.0)


@dataclass(frozen=True)
class TrialRecord:
    """What a trial stores, as this version reads it (`recorded`): where it came from, who runs it, its shape,
    its readings, its scores and how it ended. Every field is optional: a trial writes them as its phases go."""

    # queued with it: a rule shape (and the smallest budget it is the rule of), or a retry of a failed trial
    origin: str | None = None
    rule_budget_ms: float | None = None
    retry_of: int | None = None
    # the worker that runs it, its heartbeat and the phase it is in (nas.resume)
    worker: Worker | None = None
    alive_at: float | None = None
    phase: str | None = None
    arch: str | None = None
    params: int | None = None
    flops: int | None = None
    # the latency records (nas.measure.latency_record) of its fp32 and, where INT8 is tried, all-INT8 graphs,
    # and which of the two the trial is judged by
    latency: LatencyRecord | None = None
    latency_int8: LatencyRecord | None = None
    precision: str | None = None
    status: TrialStatus | None = None
    reason: str | None = None
    fail_kind: str | None = None  # "error" or "interrupted"
    duplicate_of: int | None = None  # a shape the study had: answered from that trial
    last_eval: dict[str, Any] | None = None  # the held-out loss at the last interim evaluation (the pruner's)
    loss: float | None = None
    loss_se: float | None = None
    fidelity: float | None = None
    fidelity_fp32: float | None = None
    fidelity_int8: float | None = None
    l_hs_norm: float | None = None
    l_hs_raw: float | None = None
    l_hs_se: float | None = None
    reward: float | None = None
    train_loss: float | None = None
    step_s: float | None = None  # the proxy's seconds per step: the final run's pace forecast
    seconds: TrialSeconds | None = None

    def __post_init__(self) -> None:
        for name in ("latency", "latency_int8"):
            object.__setattr__(self, name, LatencyRecord.from_attrs(getattr(self, name)))
        object.__setattr__(self, "seconds", TrialSeconds.from_attrs(self.seconds))
        object.__setattr__(self, "worker", Worker.from_attrs(self.worker or None))  # {}: none stored
        if isinstance(self.status, str) and not isinstance(self.status, TrialStatus):
            try:
                object.__setattr__(self, "status", TrialStatus(self.status))
            except ValueError:  # a status this version does not know: kept as it reads
                pass

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        return cls(**{key: value for key, value in attrs.items() if key in _names(cls)})


def recorded(trial: _Attributed) -> TrialRecord:
    """A trial's record (`migrate`d from an earlier version's)."""
    return TrialRecord.from_attrs(stored(trial))




def _trial_field(key: str) -> str:
    if key not in _names(TrialRecord):
        raise KeyError(f"TrialRecord has no field {key!r}")
    return key


def store_of_another(study: Any, trial: FrozenTrial, key: str, value: Any) -> None:
    """Write one field of another worker's trial (a running trial whose worker died: `nas.resume.recover`);
    Optuna exposes no public way to, so through the study's storage."""
    study._storage.set_trial_user_attr(trial._trial_id, _trial_field(key), value)


def enqueue(study: Any, params: dict[str, Any], attrs: dict[str, Any], *, skip_if_exists: bool = False) -> None:
    """Queue a trial of `params` that starts with `attrs` stored (a rule shape, a retry)."""
    study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=skip_if_exists)


def migrate(attrs: dict[str, Any], system: Mapping[str, Any]) -> Mapping[str, Any]:
    """Records of earlier versions in this version's form. Version 1 studies (no `kdnas_schema`) and every
    version so far store what this one reads; a trial Optuna's heartbeat retried names the failed trial only
    in its system attributes, which this version reads as `retry_of`."""
    if "retry_of" not in attrs and "failed_trial" in system:
        return {**attrs, "retry_of": system["failed_trial"]}
    return attrs


# Settings that studies of earlier versions stored flat, by group: the flat key and its name in the group.
_FLAT_SETTINGS = {"proxy": {"proxy": "kind", "proxy_steps": "steps", "proxy_sentences": "sentences",
                            "proxy_method": "method"},
                  "latency": {"latency_batch": "batch", "latency_seq": "seq", "threads": "threads",
                              "runtime": "runtime"},
                  "reward": {"objective": "objective", "target_ratio": "target_ratio", "exponent": "exponent"}}


def migrate_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A study's settings with the proxy's, the latency's and the reward's as this version nests them: studies of earlier
    versions stored their fields flat, and a study from before the fidelity proxy named none (`hs`)."""
    found = dict(settings)
    for group, flat in _FLAT_SETTINGS.items():
        if not isinstance(found.get(group), dict):
            found[group] = {name: settings.get(key) for key, name in flat.items()}
    found["proxy"] = {**found["proxy"], "kind": found["proxy"].get("kind") or "hs"}
    return found


@dataclass(frozen=True)
class PlanRecord(_Stored):
    """A precision plan as measured (`export.PlanPoint.to_dict`): the first `kept` groups of its order kept in fp32
    (`fp32_groups`, in the weight range `full_range`), its label, and its probe fidelity and latency where read."""

    label: str | None = None
    fp32_groups: tuple[str, ...] = ()
    kept: int | None = None
    full_range: bool | None = None
    fidelity: float | None = None
    latency_ms: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp32_groups", tuple(self.fp32_groups or ()))


@dataclass(frozen=True)
class TeacherPlanRow(_Stored):
    """The teacher's best plan within one budget (nas.plans): whether one fits, the plan (`export.PlanPoint.to_dict`:
    its fp32 groups, label, probe fidelity and latency), the all-INT8 graph's readings where it was read again near
    the budget, why its growth waited for the final stage under a --timeout (`deferred`: the forecast, the seconds
    spent then; its plan meanwhile the all-INT8 graph) and the decision taken again at the final stage
    (`nas.plans.teacher_plans_again`)."""

    label: str | None
    budget_ms: float
    fits: bool
    plan: PlanRecord | None = None
    int8_readings: list[float] | None = None
    again: dict[str, Any] | None = None
    deferred: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", PlanRecord.from_attrs(self.plan))


@dataclass(frozen=True)
class TeacherPlans(_Stored):
    """The teacher's plans (nas.plans.teacher_plans): a row per budget of the study, largest first, its all-INT8
    graph's latency, the group order its sensitivity pass measured (none where that graph fitted no budget), the
    fp32 graph's probe fidelity and the seconds they took. Stored as JSON (`to_attrs`)."""

    budgets: tuple[TeacherPlanRow, ...] = ()
    int8_ms: float | None = None
    full_range: bool = False
    order: tuple[dict[str, Any], ...] = ()
    fp32_fidelity: float | None = None
    sensitivity_s: float | None = None
    seconds: float | None = None

    def row(self, label: str | None) -> TeacherPlanRow | None:
        return next((r for r in self.budgets if r.label == label), None)

    def fitting(self, label: str | None) -> PlanRecord | None:
        """The plan within one budget, where one fits."""
        row = self.row(label)
        return row.plan if row is not None and row.fits else None

    def to_attrs(self) -> dict[str, Any]:
        rows = [{f.name: _as_stored(v) for f in fields(r) if (v := getattr(r, f.name)) is not None or f.name == "label"}
                for r in self.budgets]  # a search of one budget: label None
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"budgets": rows, "order": list(self.order)}

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | TeacherPlans | None) -> TeacherPlans | None:
        if attrs is None or isinstance(attrs, TeacherPlans):
            return attrs
        rows = tuple(TeacherPlanRow(**TeacherPlanRow._known(r)) for r in attrs["budgets"])
        known = cls._known(attrs)
        return cls(**known | {"budgets": rows, "order": tuple(attrs.get("order") or ())})



BEFORE_TRAINING, AS_SHIPPED = "before training", "as shipped"  # where a finalist was refused (`Refusal.stage`)


@dataclass(frozen=True)
class Refusal(SideBySide):
    """A finalist refused over its budget (nas.final): `stage` BEFORE_TRAINING (its shipped graph read over; `graph`
    the one judged) or AS_SHIPPED (after its run of `steps` in `distill_s`, its folder moved to `dir`), with the
    reading that refused it and, read side by side with the teacher, that pair's facts (`nas.final._latency`)."""

    trial: int
    arch: str
    recipe: dict[str, Any]
    stage: str
    latency_ms: float
    budget_ms: float
    budget_limit_ms: float | None = None
    dir: str | None = None
    latency_readings_ms: list[float] | None = None  # where it was read again (the first over)
    settled_from_ms: list[float] | None = None  # a reading near an absolute budget, read again (nas.time_limit.settled)
    neighbour_of: str | None = None  # an FFN neighbour's parent (nas.neighbours)
    graph: str | None = None
    steps: int | None = None
    distill_s: float | None = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | Refusal) -> Refusal:
        """A refusal as stored (a key this version does not know is left out; a study of before `recipe` has {})."""
        if isinstance(attrs, Refusal):
            return attrs
        return cls(**cls._known(attrs) | {"recipe": attrs.get("recipe") or {}})


@dataclass(frozen=True)
class Candidate(_Stored):
    """A shape the final stage may train (nas.final, nas.neighbours): a trained trial (`number`, its proxy reward,
    reading and seconds as its row of the trial table has them), or the FFN neighbour of one (`neighbour_of` the
    parent's shape, `parent_latency_ms` the reading the parent was scored with), which the stage reads and scores
    by the proxy when it reaches it (`reward` None until then; then its proxy's record, the recipe and the
    readings: what the study's `final_neighbours` holds)."""

    number: int
    arch: str
    layers: int
    heads: int
    hidden: int
    ffn: int
    reward: float | None = None
    latency_median_ms: float | None = None
    seconds_distill: float | None = None
    seconds_total: float | None = None
    seconds_teacher: float | None = None
    neighbour_of: str | None = None
    parent_latency_ms: float | None = None
    proxy: dict[str, Any] | None = None  # a neighbour's proxy score (`nas.scored.Scored.record`)
    recipe: dict[str, Any] | None = None
    latency_read_ms: float | None = None
    parent_read_ms: float | None = None
    latency_scaled_by: float | None = None

    @property
    def scored_latency(self) -> float | None:
        """The latency its reward was computed with: a trial's reading, or a neighbour's proxy's."""
        return self.latency_median_ms or (self.proxy or {}).get("latency_ms")


@dataclass(frozen=True)
class TeacherInt8(_Stored):
    """The alternative a user has for free (nas.baselines.teacher_int8): the teacher's all-INT8 graph, its latency
    read as the shipped graphs are and its fidelity on the held-out sentences the students are scored on."""

    latency: LatencyRecord
    fidelity: Fidelity
    sentences: int | None = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | TeacherInt8 | None) -> TeacherInt8 | None:
        if attrs is None or isinstance(attrs, TeacherInt8):
            return attrs
        return cls(**cls._known(attrs) | {"latency": LatencyRecord.from_attrs(attrs["latency"]),
                                          "fidelity": Fidelity.from_attrs(attrs["fidelity"])})


@dataclass(frozen=True)
class Rival(_Stored):
    """The student a teacher's plan was set against: its shape, its shipped graph's held-out ρ (None: not
    measured) and, where the teacher took its place in best/, the folder it was moved to."""

    arch: str
    rho: float | None = None
    graph: str | None = None
    dir: str | None = None


@dataclass(frozen=True)
class FinalTeacher(SideBySide):
    """The teacher's plan within one budget set beside that budget's best shipped student (nas.final._teacher):
    the plan (`TeacherPlanRow.plan`: its fp32 groups, label, probe ρ and latency), its fidelity on the held-out
    sentences, the student's, and whether the teacher `shipped` in the student's place; where it did, its folder,
    graph and readings as shipped (the judged graph's, side by side with the teacher, and every graph's)."""

    budget_ms: float
    plan: PlanRecord
    fidelity: Fidelity
    student: Rival
    shipped: bool
    budget: str | None = None  # the budget's label when the search has several (nas.budgets)
    budget_limit_ms: float | None = None
    dir: str | None = None
    graph: str | None = None
    latency_ms: float | None = None
    latency_readings_ms: list[float] | None = None
    latencies: dict[str, dict[str, Any]] | None = None  # every shipped graph's LatencyRecord, by file
    within_budget: bool | None = None
    params: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", PlanRecord.from_attrs(self.plan))

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | FinalTeacher) -> FinalTeacher:
        if isinstance(attrs, FinalTeacher):
            return attrs
        return cls(**cls._known(attrs) | {"fidelity": Fidelity.from_attrs(attrs["fidelity"]),
                                          "student": Rival(**Rival._known(attrs["student"]))})


@dataclass(frozen=True)
class FinalRecord(SideBySide):
    """A finalist as shipped (nas.final.Finalist.record): what the study's `final` list, summary.json and its
    search.json hold, read by the summary printer, the model card, the pages and a rerun. Its proxy-style scores
    (the judged graph's reading, loss, fidelity, reward, verdict), the run (steps planned and taken, the time
    limit, rows, start, precision), the budget, every shipped graph's reading, its fidelity table (`Quality`), the
    export and sentence-transformers pipeline written, the precision plan grown on it and the seconds each phase
    took; `rank`, and where the teacher's plan took its place in best/ (`shipped_as`, `displaced_by`)."""

    trial: int
    arch: str
    dir: str
    latency_ms: float
    within_budget: bool = False
    params: int | None = None
    latency: LatencyRecord | None = None  # the judged graph's reading
    loss: float | None = None
    loss_se: float | None = None
    fidelity: float | None = None
    l_hs_norm: float | None = None
    l_hs_raw: float | None = None
    l_hs_se: float | None = None
    reward: float | None = None
    recipe: dict[str, Any] | None = None  # nas.recipe.recipe_of: a rerun with the same one replays this record
    steps: int | None = None
    steps_planned: int | None = None
    steps_most: int | None = None
    timeout_s: float | None = None
    train: int | None = None
    train_rows: int | None = None
    init: dict[str, Any] | None = None
    precision: str | None = None
    augment: float | None = None
    embed_terms: Any = None
    budget_ms: float | None = None
    budget_limit_ms: float | None = None
    budget: str | None = None  # the budget's label when the search has several (nas.budgets)
    latency_readings_ms: list[float] | None = None
    latency_fp32_onnx: LatencyRecord | None = None
    latency_int8_onnx: LatencyRecord | None = None
    latency_mixed_onnx: LatencyRecord | None = None
    budget_graph: str | None = None  # the graph the budget judged, and the one to deploy
    verdict: dict[str, Any] | None = None
    proxy_reward: float | None = None
    neighbour_of: str | None = None  # an FFN neighbour of this trial's shape (nas.neighbours)
    quality: Quality | None = None
    export: dict[str, Any] | None = None
    sentence_transformers: dict[str, Any] | None = None
    precision_plan: dict[str, Any] | None = None  # grown on its trained weights (evaluation.PrecisionChoice.to_dict)
    seconds: dict[str, float] | None = None
    rank: int | None = None
    shipped_as: str | None = None  # where it was written before the teacher's plan took its place
    displaced_by: str | None = None

    def __post_init__(self) -> None:
        for name in ("latency", "latency_fp32_onnx", "latency_int8_onnx", "latency_mixed_onnx"):
            object.__setattr__(self, name, LatencyRecord.from_attrs(getattr(self, name)))
        object.__setattr__(self, "quality", Quality.from_attrs(self.quality))

    @property
    def reward_loss(self) -> float | None:
        """The loss its reward was computed with; a record from before it was stored: L_HS."""
        return self.l_hs_norm if self.loss is None else self.loss

    @property
    def recipe_budget(self) -> str | None:
        """The budget label of its recipe (one of several budgets), None for a search of one."""
        return (self.recipe or {}).get("budget")

    def latency_of(self, graph: str) -> LatencyRecord | None:
        """The reading of one shipped graph as shipped (model.onnx, model.int8.onnx, model.mixed.onnx)."""
        return {FP32_GRAPH: self.latency_fp32_onnx, INT8_GRAPH: self.latency_int8_onnx,
                MIXED_GRAPH: self.latency_mixed_onnx}.get(graph)

    @property
    def shipped_rho(self) -> float | None:
        """The held-out ρ of the graph it ships (the one the budget judged): its plan's, INT8 or fp32."""
        row = None if self.quality is None else self.quality.of_graph(self.budget_graph or FP32_GRAPH)
        return None if row is None else float(row.spearman)


@dataclass(frozen=True)
class StudyFacts:
    """What a study holds beside its trials. Made once with the study — the settings, the teacher's reading, the
    budgets and their rule shapes — then added to by the stages that follow (`record_fact`). The teacher's reading
    and plans, its INT8 graph, its plans set beside the students, the refused finalists and the FFN neighbours
    scored and the finalists shipped are typed records (`LatencyRecord`, `TeacherPlans`, `TeacherInt8`,
    `FinalTeacher`, `Refusal`, `Candidate`, `FinalRecord`); other nested records stay the JSON they are stored as."""

    settings: dict[str, Any] | None = None  # stored as SETTINGS_ATTR
    version: int = 1  # stored as VERSION_ATTR; absent: a study of before the version was stored
    teacher_latency: LatencyRecord | None = None  # the teacher's reading (with int8_ms where INT8 is tried)
    budget_ms: float | None = None  # the largest budget: the trials' gate
    budget_tolerance: float = 0.0
    budgets: list[dict[str, Any]] | None = None  # several budgets: one record each, largest first
    fastest: dict[str, Any] | None = None
    space_size: int | None = None
    rule: dict[str, Any] | None = None  # the rule shape of the largest budget
    rules: list[dict[str, Any] | None] | None = None  # several budgets: each one's
    int8_rules: list[dict[str, Any] | None] | None = None  # the rule's depth as an all-INT8 graph, each budget's
    trials_reached: int | None = None  # trials that followed the time (nas.search._trials_reached)
    teacher_plans: TeacherPlans | None = None  # nas.plans
    reference: Any = None  # the reference shapes' scores (--reference)
    teacher_int8: TeacherInt8 | None = None
    final: tuple[FinalRecord, ...] | None = None  # the finalists, every budget's
    final_teacher: tuple[FinalTeacher, ...] | None = None  # the teacher's plan where it was a finalist, per budget
    final_over_budget: tuple[Refusal, ...] | None = None  # every budget's
    final_neighbours: tuple[Candidate, ...] | None = None  # the FFN neighbours scored, every budget's
    run_seconds: RunSeconds | None = None  # the runs' stages' wall seconds, added up (nas.ledger)
    target: dict[str, Any] | None = None  # the target profile that judged the search (--target): its host and error
    verified: tuple[dict[str, Any], ...] | None = None  # the shipped graphs checked on the target (nas.verify)

    def __post_init__(self) -> None:
        if self.settings is not None:
            object.__setattr__(self, "settings", migrate_settings(self.settings))
        object.__setattr__(self, "teacher_latency", LatencyRecord.from_attrs(self.teacher_latency))
        object.__setattr__(self, "teacher_plans", TeacherPlans.from_attrs(self.teacher_plans))
        object.__setattr__(self, "teacher_int8", TeacherInt8.from_attrs(self.teacher_int8))
        object.__setattr__(self, "run_seconds", RunSeconds.from_attrs(self.run_seconds))
        if self.verified is not None:
            object.__setattr__(self, "verified", tuple(self.verified))
        for name, record in (("final", FinalRecord), ("final_over_budget", Refusal), ("final_teacher", FinalTeacher),
                             ("final_neighbours", Candidate)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(map(record.from_attrs, getattr(self, name))))

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> StudyFacts:
        """The facts in a study's attributes (keys this version does not know are left out)."""
        return cls(**{name: attrs[key] for key in attrs if (name := _FACT_OF.get(key, key)) in _names(cls)})

    @classmethod
    def from_study(cls, study: _Attributed) -> StudyFacts:
        return cls.from_attrs(stored(study))

    def set_fields(self) -> dict[str, Any]:
        """The facts that are set, by field name (what a new study is made with), the settings last: a study
        without them is not a kdnas study (nas.storage.check_settings), so they mark it complete."""
        found = {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}
        return dict(sorted(found.items(), key=lambda item: item[0] == "settings"))


_STORED_AS = {"settings": SETTINGS_ATTR, "version": VERSION_ATTR}
_FACT_OF = {key: name for name, key in _STORED_AS.items()}


def record_fact(study: Any, name: str, value: Any) -> None:
    """Store one of the study's facts (a field of `StudyFacts`: a name it does not have is an error here, not a
    record no reader finds)."""
    if name not in _names(StudyFacts):
        raise KeyError(f"StudyFacts has no field {name!r}")
    study.set_user_attr(_STORED_AS.get(name, name), _as_stored(value))
