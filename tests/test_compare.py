"""Differences between models measured against their noise (evaluation.compare), and the verdict
the student-quality benchmark draws from them."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from kdnas.evaluation.compare import Difference, Score, binomial_se, compare, outcome_string, paired_se, scores

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _row(model: str, role: str, rho: float, rho_se: float, full: float, few: list[float], *,
         finetune: list[float] | None = None) -> dict:
    row = {"model": model, "role": role,
           "fidelity": {"spearman": rho, "spearman_se": rho_se},
           "probes": {"topic": {"full": full, "few_shot_mean": sum(few) / len(few),
                                "few_shot_std": _stdev(few), "few_shot": few, "shots": 16, "test_examples": 200}},
           "tasks": {}}
    if finetune:
        row["tasks"]["topic"] = {"accuracy_mean": sum(finetune) / len(finetune), "accuracy_std": _stdev(finetune),
                                 "runs": [{"accuracy": a, "test_examples": 200} for a in finetune]}
    return row


def _stdev(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_binomial_standard_error():
    assert binomial_se(0.5, 100) == pytest.approx(0.05)
    assert binomial_se(1.0, 50) == 0.0
    assert binomial_se(0.9, 0) == math.inf


def test_scores_carry_each_measures_standard_error():
    row = _row("s", "student", 0.8, 0.01, 0.9, [0.8, 0.9], finetune=[0.90, 0.92, 0.94])
    s = scores(row)
    assert s["fidelity rho"] == Score(0.8, 0.01)
    assert s["topic probe"].se == pytest.approx(math.sqrt(0.9 * 0.1 / 200))
    # few-shot: spread of the mean over the draws, and the test split's binomial noise
    few_se = math.hypot(_stdev([0.8, 0.9]) / math.sqrt(2), math.sqrt(0.85 * 0.15 / 200))
    assert s["topic 16-shot"] == Score(pytest.approx(0.85), pytest.approx(few_se))
    tune_se = math.hypot(0.02 / math.sqrt(3), math.sqrt(0.92 * 0.08 / 200))
    assert s["topic fine-tune"] == Score(pytest.approx(0.92), pytest.approx(tune_se))


def test_a_difference_is_called_only_beyond_two_standard_errors():
    assert Difference("m", Score(0.90, 0.01), Score(0.85, 0.01)).verdict == "ahead"  # 0.05 > 2 x 0.0141
    assert Difference("m", Score(0.85, 0.01), Score(0.90, 0.01)).verdict == "behind"
    near = Difference("m", Score(0.86, 0.01), Score(0.85, 0.01))
    assert near.verdict == "within noise" and near.se == pytest.approx(math.sqrt(2) * 0.01)
    assert "+0.0100 ± 0.0141, within noise" in near.describe("base")


def test_models_tested_on_the_same_examples_are_compared_pairwise():
    # 200 examples: b gets wrong the 10 a gets wrong and 6 more (a 95.0 %, b 92.0 %)
    a = outcome_string(i >= 10 for i in range(200))
    b = outcome_string(i >= 16 for i in range(200))
    independent = Difference("m", Score(0.95, binomial_se(0.95, 200)), Score(0.92, binomial_se(0.92, 200)))
    assert independent.verdict == "within noise"  # 0.03 against 2 x 0.0246
    paired = Difference("m", Score(0.95, binomial_se(0.95, 200), (a,)), Score(0.92, binomial_se(0.92, 200), (b,)))
    # d = 1 on 6 examples, 0 elsewhere: SE = sqrt(var(d) / n)
    var = (6 - 200 * 0.03 ** 2) / 199
    assert paired.paired and paired.se == pytest.approx(math.sqrt(var / 200))
    assert paired.verdict == "ahead" and "paired, ahead" in paired.describe("b")
    # where they disagree both ways (6 examples for c, 3 for d) a net 3 of 200 is no evidence
    c = outcome_string(not (10 <= i < 13) for i in range(200))
    d = outcome_string(not (i < 3 or 20 <= i < 23) for i in range(200))
    assert Difference("m", Score(0.985, 0.0, (c,)), Score(0.97, 0.0, (d,))).verdict == "within noise"
    assert paired_se((a,), (a,)) == 0.0  # the same answers: no difference, no noise
    assert paired_se((a,), (b[:100],)) is None and paired_se(None, (b,)) is None  # nothing pairs them


def test_a_paired_difference_over_draws_counts_the_draws_and_the_examples():
    runs_a = ("1100", "1110", "1111")
    runs_b = ("1000", "1100", "1101")
    d = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0]]  # a − b, run by run
    per_example = [sum(r[i] for r in d) / 3 for i in range(4)]
    per_run = [sum(r) / 4 for r in d]
    expected = math.sqrt(_var(per_example) / 4 + _var(per_run) / 3)
    assert paired_se(runs_a, runs_b) == pytest.approx(expected)


def _var(xs: list[float]) -> float:
    return _stdev(xs) ** 2


def test_scores_carry_the_outcomes_a_row_kept():
    row = _row("s", "student", 0.8, 0.01, 0.5, [0.5, 0.25], finetune=[0.5, 0.75])
    row["probes"]["topic"]["outcomes"] = {"full": "1100", "few_shot": ["1010", "1000"]}
    for run, kept in zip(row["tasks"]["topic"]["runs"], ("0011", "0111")):
        run["outcomes"] = kept
    s = scores(row)
    assert s["topic probe"].outcomes == ("1100",) and s["topic 16-shot"].outcomes == ("1010", "1000")
    assert s["topic fine-tune"].outcomes == ("0011", "0111") and s["fidelity rho"].outcomes is None
    row["tasks"]["topic"]["runs"][0]["outcomes"] = None  # one seed from before outcomes were kept
    assert scores(row)["topic fine-tune"].outcomes is None


def test_compare_only_the_measures_both_rows_have():
    a = _row("a", "student", 0.9, 0.01, 0.95, [0.9, 0.91], finetune=[0.9, 0.9, 0.9])
    b = _row("b", "student", 0.5, 0.01, 0.95, [0.9, 0.91])
    assert [d.measure for d in compare(a, b)] == ["fidelity rho", "topic probe", "topic 16-shot"]


def test_baselines_verdict_separates_strict_failures_from_noise_and_saturation():
    from kdnas.evaluation.baselines import verdict_lines, verdicts

    report = {"models": [
        _row("teacher", "teacher", 1.0, 0.0, 0.95, [0.90, 0.92]),
        _row("student", "student", 0.88, 0.007, 0.95, [0.90, 0.91]),
        _row("inherited", "student", 0.53, 0.02, 0.96, [0.91, 0.93]),  # above the teacher on topic
        _row("first", "student", 0.30, 0.02, 0.80, [0.70, 0.72]),
    ]}
    v = verdicts(report, {"student": ["inherited", "first"]})["student"]
    assert not v["beats_both_baselines_on_every_measure"] and v["baselines"] == ["inherited", "first"]
    assert [f.split(":")[0] for f in v["failures"]] == ["topic probe", "topic 16-shot"]
    assert v["behind"] == [] and v["comparisons"] == 6
    assert v["ahead"] == 4  # fidelity vs both; probe and 16-shot vs `first`
    assert v["baseline_at_or_above_teacher"] == ["topic 16-shot", "topic probe"]
    text = "\n".join(verdict_lines({"student": v}))
    assert "every measure: no" in text and "behind beyond it on 0" in text and "at or above the teacher" in text
