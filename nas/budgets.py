"""Several budgets in one study: `--budget-ratio 0.5,0.25` or `--budget-ms 8,4,2`.

The trials do not depend on the budget but for one thing: a shape over it is not trained. The reward
(`nas.reward`) is the teacher-relative KD-NAS reward, the same number under every budget, so one study
serves them all: every shape within the largest budget is trained and scored once, each budget's
finalists are the scored trials within it, best reward first, and a student is shipped for each budget
into a folder named by it. Each budget's rule shape (`nas.space.rule_params`) is one of the study's first
trials, so every budget has the one-line rule's student among its candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .schema import StudyFacts, TrialStatus

if TYPE_CHECKING:
    from .config import SearchConfig
    from .records import TrialRow


@dataclass(frozen=True)
class Budget:
    """One budget of a search: its milliseconds (for a ratio, of the teacher's latency as measured when the
    study was made), its label (`0.25x`, `8ms`; None for a search of one budget, folders as before) and its
    tolerance (`--budget-tolerance`): a graph fits when its reading is at most `limit_ms`, the budget and
    that share over it — the same rule for every trial, finalist and plan (docs/search.md)."""

    ms: float
    label: str | None = None
    tolerance: float = 0.0

    @property
    def limit_ms(self) -> float:
        """The most a graph may read and fit: the budget and its tolerance."""
        return self.ms * (1.0 + self.tolerance)

    @property
    def best(self) -> str:
        """The shipped student's folder in OUT: `best`, or `best-0.25x` for one of several budgets."""
        return "best" if self.label is None else f"best-{self.label}"

    @property
    def named(self) -> str:
        """How messages name it: `the budget of 4.12 ms`, `the 0.25x budget (4.12 ms)`, with its tolerance."""
        within = f"{self.ms:.2f} ms" + (f", {self.limit_ms:.2f} with its {self.tolerance:.0%} tolerance"
                                        if self.tolerance else "")
        return f"the budget of {within}" if self.label is None else f"the {self.label} budget ({within})"


def label_of(value: float, ratio: bool) -> str:
    """`0.25x` for a ratio of the teacher's latency, `8ms` for milliseconds."""
    return f"{value:g}x" if ratio else f"{value:g}ms"


def study_budgets(facts: StudyFacts) -> list[Budget]:
    """The budgets of a study, largest first, from its facts: `budgets` where several were asked for (a
    study of one budget, and one made before several were possible, holds `budget_ms` only), each with the
    study's `budget_tolerance` (none in a study made before it)."""
    tolerance = float(facts.budget_tolerance)
    if not facts.budgets:
        return [Budget(float(facts.budget_ms), None, tolerance)]
    return [Budget(float(b["ms"]), b["label"], tolerance) for b in facts.budgets]


def budget_facts(cfg: SearchConfig, budgets_ms: tuple[float, ...]) -> list[dict[str, Any]]:
    """A new study's record of several budgets (none for one): each one's label and milliseconds."""
    if len(budgets_ms) < 2:
        return []
    ratio = cfg.budget_ms is None
    return [{"label": label_of(value, ratio), "ms": ms} for value, ms in zip(cfg.budgets, budgets_ms)]


def within(rows: list[TrialRow], budget: Budget, facts: StudyFacts | None = None) -> list[TrialRow]:
    """The trial rows whose judged graph fits `budget` (a trial is scored for every budget it fits). With the
    study's `facts`, a row whose judged graph is over but whose all-INT8 graph fits and was scored (under
    --runtime onnxruntime-auto, where a smaller budget needs it) stands as that graph: its INT8 latency,
    fidelity and the reward they give."""
    out = []
    for r in rows:
        if r.latency_median_ms is not None and r.latency_median_ms <= budget.limit_ms:
            out.append(r)
        elif facts is not None and _int8_fits(r, budget):
            out.append(as_int8(r, facts))
    return out


def _int8_fits(row: TrialRow, budget: Budget) -> bool:
    return (row.fidelity_int8 is not None and row.latency_int8_ms is not None
            and row.latency_int8_ms <= budget.limit_ms and row.status == TrialStatus.FEASIBLE)


def as_int8(row: TrialRow, facts: StudyFacts) -> TrialRow:
    """A trained trial's row as its all-INT8 graph: the latency, fidelity, loss and reward of that graph."""
    from .config import StoredSettings
    from .reward import kdnas_reward

    reward = StoredSettings.of(facts.settings).reward
    loss, ms = 1.0 - float(row.fidelity_int8), float(row.latency_int8_ms)
    teacher_ms = float(facts.teacher_latency.median_ms)
    return replace(row, precision="int8", latency_median_ms=ms, fidelity=row.fidelity_int8, loss=loss,
                   reward=kdnas_reward(loss, ms, teacher_ms, reward.target_ratio, reward.exponent))
