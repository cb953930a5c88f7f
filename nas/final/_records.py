"""The final stage's records in the study: which trials are candidates, what a rerun finds done, and the
one claim that lets a single worker of many run the stage. Records are kept in the study's facts (`final`,
`final_over_budget` as `Refusal`s, `final_neighbours`), each tagged with the recipe (and budget)
that made it, so a rerun with the same recipe replays them and another recipe starts afresh."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from kdnas.distill import StudentSpec

from ..budgets import Budget, within
from ..neighbours import candidates
from ..recipe import recipe_of
from ..records import pareto_front, trial_rows
from ..resume import worker_alive, worker_identity
from ..schema import (AS_SHIPPED, BEFORE_TRAINING, Candidate, FinalRecord, Quality, Refusal, StudyFacts, TrialStatus,
                      recorded, store)
from ..scored import Scored

if TYPE_CHECKING:
    from ..context import SearchContext


@dataclass(frozen=True)
class Finalist:
    """One finalist as trained, exported and timed: what its search.json, the study's `final` list, the model
    card and the summary hold (`record()`, the only place it becomes JSON). `scored`: its shape, the judged
    graph's latency, the final run's loss and fidelity, reward and budget verdict, as a trial's."""

    trial: int
    scored: Scored
    dir: str
    recipe: dict[str, Any]
    run: dict[str, Any]  # steps (planned, most), time limit, rows, start, precision, augment, embed terms
    budget_ms: float
    budget: str | None  # the budget's label when the search has several (nas.budgets)
    latency: dict[str, Any]  # every graph's reading: the judged one's readings, fp32, INT8, side-by-side facts
    quality: Quality | None  # fidelity beside the untrained baselines, INT8 (nas.baselines)
    shipped: dict[str, Any]  # the export report and the sentence-transformers pipeline written
    proxy_reward: float | None
    origin: dict[str, Any]  # `neighbour_of` for an FFN neighbour (nas.neighbours)
    seconds: dict[str, float]
    budget_limit_ms: float | None = None  # the budget with its tolerance: the most the judged reading may be

    @property
    def within_budget(self) -> bool:
        return self.scored.within_budget

    @property
    def latency_ms(self) -> float:
        return self.scored.latency_ms

    def record(self) -> FinalRecord:
        """The finalist as stored: a fact `FinalRecord` has no field for is an error here, not a key no reader
        finds."""
        return FinalRecord(**{"trial": self.trial, **self.scored.record(), "dir": self.dir, "recipe": self.recipe,
                              **self.run, "budget_ms": self.budget_ms, "budget_limit_ms": self.budget_limit_ms,
                              "budget": self.budget, **self.latency, "proxy_reward": self.proxy_reward,
                              **self.origin, "quality": self.quality, **self.shipped, "seconds": self.seconds})


def finalists(study: optuna.Study, objective: str, budget: Budget | None = None) -> list[Candidate]:
    """Every trained candidate for the final phase, best reward first (Pareto: front members only); with
    `budget`, of the trials within it (one of several budgets: `nas.budgets`). The final stage's queue holds
    them beside its FFN neighbours, which it scores as it goes (`nas.neighbours`)."""
    copies = _copies(study)
    rows = [r for r in trial_rows(study) if r.number not in copies]
    rows = rows if budget is None else within(rows, budget, StudyFacts.from_study(study))
    pool = pareto_front(rows) if objective == "pareto" else [
        r for r in rows if r.status == TrialStatus.FEASIBLE and r.reward is not None]
    return [Candidate.from_attrs(r.as_dict()) for r in sorted(pool, key=lambda r: -r.reward)]


def _copies(study: optuna.Study) -> set[int]:
    """Trials that copied an earlier trial's result (the same shape): one candidate per shape, so a shape
    refused as shipped is not tried again under its copy's number (a demo whose first trial, the rule's
    3x12x384x1536, was proposed again as trial 3 measured it twice and trained it 182 steps)."""
    return {t.number for t in study.get_trials(deepcopy=False) if recorded(t).duplicate_of is not None}


def final_dir(out: Path, rank: int, arch: str, label: str | None = None) -> Path:
    """`best/` and `finalists/RANK-ARCH/`; for one of several budgets `best-LABEL/` and `finalists/LABEL/RANK-ARCH/`."""
    if rank == 1:
        return out / Budget(0.0, label).best
    return out / "finalists" / (f"{rank}-{arch}" if label is None else f"{label}/{rank}-{arch}")


def state_file(dest: Path) -> Path:
    """Where a finalist's run keeps its saved state until the finalist is written (distill.checkpoint)."""
    return dest.parent / f".{dest.name}.state.pt"


def refused_records(study: optuna.Study, cfg: Any, label: str | None = None) -> list[Refusal]:
    """Finalists already trained with this recipe whose shipped model missed the budget."""
    return [s for s in StudyFacts.from_study(study).final_over_budget or () if s.recipe == recipe_of(cfg, label)]


def neighbour_records(study: optuna.Study, cfg: Any, label: str | None = None) -> list[Candidate]:
    """FFN neighbours of finalists scored with this recipe (nas.neighbours)."""
    return [n for n in StudyFacts.from_study(study).final_neighbours or () if n.recipe == recipe_of(cfg, label)]


def shippable(study: optuna.Study, pool: list[Candidate], cfg: Any, label: str | None = None) -> list[Candidate]:
    return candidates(pool, refused_records(study, cfg, label), neighbour_records(study, cfg, label))[:cfg.final.top_k]


def of_other_budgets(records: Sequence[Any], label: str | None) -> list[Any]:
    """The records (dicts, `Refusal`s or `Candidate`s) of a study's other budgets, kept when one budget's are written (none for a
    single budget, whose records of an earlier recipe are replaced, as they always were)."""
    return [r for r in records if ((r.get("recipe") if isinstance(r, dict) else r.recipe) or {}).get("budget") != label]


def claim_final(study: optuna.Study, stale_after_s: float) -> str | None:
    """Take the final stage for this worker; None when it is ours, else who holds it (one line).

    The claim is a study named `<study>:final` created through the storage: creating a study is
    atomic in every Optuna storage, so of N workers that finish together exactly one gets it. A
    claim whose worker is gone (same host: its process; another host: older than `stale_after_s`)
    is taken over, so a rerun after a crash still ships.
    """
    name = f"{study.study_name}:final"
    me = replace(worker_identity(), claimed_at=time.time())
    for _ in range(2):
        try:
            claim = optuna.create_study(storage=study._storage, study_name=name)
            store(claim, "worker", me)
            return None
        except optuna.exceptions.DuplicatedStudyError:
            holder = recorded(optuna.load_study(study_name=name, storage=study._storage)).worker
            if holder is not None and worker_alive(holder, holder.claimed_at, stale_after_s):
                return (f"the final stage is run by another worker (host {holder.host}, pid {holder.pid}); "
                        "its best/ is in that worker's --out")
            try:
                optuna.delete_study(study_name=name, storage=study._storage)  # a dead worker's claim
            except KeyError:
                pass  # another worker removed it first; try to create it again
    return "the final stage was claimed by another worker a moment ago"


def is_done(study: optuna.Study, out: Path, pool: list[Candidate], ctx: "SearchContext") -> bool:
    """Whether the final stage of `ctx`'s budget has shipped `pool`'s candidates with this recipe already."""
    cfg, label = ctx.config, ctx.budget_label
    done = [f for f in StudyFacts.from_study(study).final or () if f.recipe_budget == label]
    want = [(r.number, recipe_of(cfg, label), str(final_dir(out, i, r.arch, label)))
            for i, r in enumerate(shippable(study, pool, cfg, label), 1)]
    # a student the teacher displaced from best/ (nas.final._teacher) is kept under the folder it shipped as
    have = [(f.trial, f.recipe, f.shipped_as or f.dir) for f in done]
    return have == want and all((Path(d) / "export.json").is_file() for *_, d in want)


def spec_of(ctx: "SearchContext", row: Candidate) -> StudentSpec:
    return StudentSpec(layers=row.layers, heads=row.heads, hidden=row.hidden, ffn=row.ffn, **ctx.sizes)


def over_record(row: Candidate, ctx: "SearchContext", moved_to: Path | None, latency_ms: float,
                readings: list[float], **facts: Any) -> Refusal:
    """`row` refused over `ctx`'s budget: before training (`moved_to` None) or as shipped; `facts`: the side-by-side
    pair's (`drift_of`), the graph judged, or the run's steps and seconds."""
    return Refusal(trial=row.number, arch=row.arch, recipe=recipe_of(ctx.config, ctx.budget_label),
                   stage=BEFORE_TRAINING if moved_to is None else AS_SHIPPED,
                   dir=None if moved_to is None else str(moved_to), latency_ms=latency_ms, budget_ms=ctx.budget.ms,
                   budget_limit_ms=ctx.budget_ms, latency_readings_ms=readings, neighbour_of=row.neighbour_of, **facts)


def origin_of(row: Candidate) -> dict[str, str]:
    return {"neighbour_of": row.neighbour_of} if row.neighbour_of is not None else {}


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
