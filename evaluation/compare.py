"""Is one model ahead of another on a measure, or only by noise?

Every measure of a report row (`kdnas evaluate`) comes with a standard error: fidelity ρ its
jackknife SE over sentence groups; a probe or fine-tuning accuracy the binomial SE of its test split,
√(p(1−p)/n), plus for a mean over few-shot draws or fine-tuning seeds the spread of that mean
(std/√k). Those are a row's own uncertainty.

A difference between two rows is judged **paired** where both rows keep their per-example outcomes
(which test examples each probe draw or fine-tuning seed got right; `outcomes` in the row): both
models answered the same examples after the same draws, so what varies between them is only where
they disagree. With d[k][i] = right_a − right_b for run k (a draw or seed) and example i, the
difference is mean(d) and its SE² = var_i(mean_k d)/n + var_k(mean_i d)/K — the test examples and
the runs as two random samples (the second term is absent for a single run; the interaction counts
in both, so it errs large). Without outcomes (fidelity ρ, results kept before outcomes were) the
rows are treated as independent, SE √(SE_a² + SE_b²), which overstates the noise of a shared test
split. On a 212-article test split one article is 0.47 points; two 95 % models that disagree on 6
articles have a paired SE of about 1.2 points, where the independent rule gives 2.1.

A difference beyond MARGIN standard errors is called a win or a loss; inside it, "within noise".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MARGIN = 2.0  # standard errors: about a 95 % two-sided interval


@dataclass(frozen=True)
class Score:
    """One measure of one model: its value and standard error, and the per-example outcomes behind
    the value when the row kept them (one `outcome_string` per run)."""

    value: float
    se: float
    outcomes: tuple[str, ...] | None = field(default=None, compare=False)


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
    def paired(self) -> bool:
        """Whether both sides kept outcomes on the same examples and runs (the SE is then paired)."""
        return paired_se(self.a.outcomes, self.b.outcomes) is not None

    @property
    def se(self) -> float:
        paired = paired_se(self.a.outcomes, self.b.outcomes)
        return paired if paired is not None else math.hypot(self.a.se, self.b.se)

    @property
    def verdict(self) -> str:
        """"ahead" or "behind" beyond MARGIN standard errors, else "within noise"."""
        if abs(self.delta) > MARGIN * self.se:
            return "ahead" if self.delta > 0 else "behind"
        return "within noise"

    def describe(self, other: str) -> str:
        return (f"{self.measure}: {self.a.value:.4f} vs {other} {self.b.value:.4f} "
                f"({self.delta:+.4f} ± {self.se:.4f}{', paired' if self.paired else ''}, {self.verdict})")


def outcome_string(right: Iterable[bool]) -> str:
    """Per-example outcomes as a report row keeps them: "1" right, "0" wrong, in test-split order."""
    return "".join("1" if r else "0" for r in right)


def paired_se(a: Sequence[str] | None, b: Sequence[str] | None) -> float | None:
    """SE of mean(a) − mean(b) for two models' outcomes on the same runs × examples (module doc);
    None when either lacks them or their shapes differ (then nothing pairs them)."""
    if not a or not b or len(a) != len(b) or any(len(x) != len(y) or not x for x, y in zip(a, b)):
        return None
    d = [[int(x) - int(y) for x, y in zip(run_a, run_b)] for run_a, run_b in zip(a, b)]
    k, n = len(d), len(d[0])
    if n < 2:
        return None
    per_example = [sum(run[i] for run in d) / k for i in range(n)]
    se2 = statistics.variance(per_example) / n
    if k > 1:
        se2 += statistics.variance([sum(run) / n for run in d]) / k
    return math.sqrt(se2)


def binomial_se(accuracy: float, n: int) -> float:
    """Standard error of an accuracy measured on n test examples."""
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n) if n else float("inf")


def scores(row: dict) -> dict[str, Score]:
    """Every measure of a report row, by the name the tables use, with its standard error and, where
    the row kept them, its per-example outcomes."""
    out: dict[str, Score] = {}
    if "fidelity" in row:
        out["fidelity rho"] = Score(row["fidelity"]["spearman"], row["fidelity"].get("spearman_se", 0.0))
    for task, p in row.get("probes", {}).items():
        n = p["test_examples"]
        kept = p.get("outcomes") or {}
        if p["full"] is not None:
            full = kept.get("full")
            out[f"{task} probe"] = Score(p["full"], binomial_se(p["full"], n), None if full is None else (full,))
        spread = p["few_shot_std"] / math.sqrt(len(p["few_shot"])) if p["few_shot"] else 0.0
        few = kept.get("few_shot")
        out[f"{task} {p['shots']}-shot"] = Score(p["few_shot_mean"],
                                                 math.hypot(spread, binomial_se(p["few_shot_mean"], n)),
                                                 tuple(few) if few else None)
    for task, t in row.get("tasks", {}).items():
        spread = t["accuracy_std"] / math.sqrt(len(t["runs"]))  # the seeds' sample std, as the row reports it
        n = t["runs"][0]["test_examples"]
        runs = [r.get("outcomes") for r in t["runs"]]
        out[f"{task} fine-tune"] = Score(t["accuracy_mean"], math.hypot(spread, binomial_se(t["accuracy_mean"], n)),
                                         tuple(runs) if all(runs) else None)
    return out


def compare(a: dict, b: dict) -> list[Difference]:
    """Row a against row b on every measure both have."""
    sa, sb = scores(a), scores(b)
    return [Difference(m, sa[m], sb[m]) for m in sa if m in sb]
