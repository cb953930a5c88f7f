"""Is one model ahead of another on a measure, or only by noise?

Every measure of a report row (`kdnas evaluate`) comes with a standard error: fidelity ρ its
jackknife SE over sentence groups; a probe or fine-tuning accuracy the binomial SE of its test split,
√(p(1−p)/n), plus for a mean over few-shot draws or fine-tuning seeds the spread of that mean
(std/√k). A difference between two rows carries SE √(SE_a² + SE_b²), which treats the two rows as
independent; they share test sentences and draws, so this overstates the noise, never understates it.

A difference beyond MARGIN standard errors is called a win or a loss; inside it, "within noise".
On a 212-sentence test split, for example, one sentence is 0.47 points and the SE of a difference
between two 95 % models is about 2.1 points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MARGIN = 2.0  # standard errors: about a 95 % two-sided interval


@dataclass(frozen=True)
class Score:
    """One measure of one model: its value and standard error."""

    value: float
    se: float


@dataclass(frozen=True)
class Difference:
    """Model a minus model b on one measure."""

    measure: str
    a: Score
    b: Score

    @property
    def delta(self) -> float:
        return self.a.value - self.b.value

    @property
    def se(self) -> float:
        return math.hypot(self.a.se, self.b.se)

    @property
    def verdict(self) -> str:
        """"ahead" or "behind" beyond MARGIN standard errors, else "within noise"."""
        if abs(self.delta) > MARGIN * self.se:
            return "ahead" if self.delta > 0 else "behind"
        return "within noise"

    def describe(self, other: str) -> str:
        return (f"{self.measure}: {self.a.value:.4f} vs {other} {self.b.value:.4f} "
                f"({self.delta:+.4f} ± {self.se:.4f}, {self.verdict})")


def binomial_se(accuracy: float, n: int) -> float:
    """Standard error of an accuracy measured on n test examples."""
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n) if n else float("inf")


def scores(row: dict) -> dict[str, Score]:
    """Every measure of a report row, by the name the tables use, with its standard error."""
    out: dict[str, Score] = {}
    if "fidelity" in row:
        out["fidelity rho"] = Score(row["fidelity"]["spearman"], row["fidelity"].get("spearman_se", 0.0))
    for task, p in row.get("probes", {}).items():
        n = p["test_examples"]
        if p["full"] is not None:
            out[f"{task} probe"] = Score(p["full"], binomial_se(p["full"], n))
        spread = p["few_shot_std"] / math.sqrt(len(p["few_shot"])) if p["few_shot"] else 0.0
        out[f"{task} {p['shots']}-shot"] = Score(p["few_shot_mean"],
                                                 math.hypot(spread, binomial_se(p["few_shot_mean"], n)))
    for task, t in row.get("tasks", {}).items():
        spread = t["accuracy_std"] / math.sqrt(len(t["runs"]))  # the seeds' sample std, as the row reports it
        n = t["runs"][0]["test_examples"]
        out[f"{task} fine-tune"] = Score(t["accuracy_mean"], math.hypot(spread, binomial_se(t["accuracy_mean"], n)))
    return out


def compare(a: dict, b: dict) -> list[Difference]:
    """Row a against row b on every measure both have."""
    sa, sb = scores(a), scores(b)
    return [Difference(m, sa[m], sb[m]) for m in sa if m in sb]
