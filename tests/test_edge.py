"""A budget's edge: readings near it are read again beside the teacher until one side is sure, a disturbed
reading never decides, and what is left to decide follows one stated rule (the budget with its tolerance).
The readings are fakes fed to the judge (nas.measure's functions and `beside_teacher` with a fake judge)."""

from __future__ import annotations

from dataclasses import replace
import pytest

from kdnas.latency import LatencyResult, PairResult
from kdnas.nas import SearchConfig
from kdnas.nas.budgets import Budget
from kdnas.nas.measure import EDGE_READINGS, beside_teacher, deciding, disturbed, edge_reading


def reading(ms: float, p90_over: float = 1.05) -> LatencyResult:
    return LatencyResult(median_ms=ms, p90_ms=ms * p90_over, min_ms=ms * 0.97, mean_ms=ms, cv=0.02, runs=180,
                         noisy=False, batch=1, seq=128, threads=2, runtime="onnxruntime", cpu="cpu", versions={},
                         cached=False, key="k")


def pair(ratio: float, spread: float = 0.004, teacher_ms: float = 10.0, p90_over: float = 1.05) -> PairResult:
    """A side-by-side reading: `ratio` with its rounds' quartiles `spread` apart."""
    return PairResult(ratio=ratio, ratio_low=ratio - spread / 2, ratio_high=ratio + spread / 2, rounds=12,
                      target=reading(ratio * teacher_ms, p90_over), reference=reading(teacher_ms))


class Judge:
    """Answers each `pair` with the next of `readings`, and counts them."""

    def __init__(self, *readings: PairResult) -> None:
        self.config, self.readings, self.calls = SearchConfig(), list(readings), 0

    def pair(self, target, reference):
        self.calls += 1
        return self.readings.pop(0)


def test_a_reading_clear_of_the_budget_is_read_once():
    for ratio in (0.40, 0.60):  # far under, far over the limit of 0.5
        judge = Judge(pair(ratio), pair(0.0))
        result, facts = beside_teacher("m.onnx", judge, 10.0, budget_ms=5.0)
        assert judge.calls == 1 and "edge_readings" not in facts
        assert result.median_ms == pytest.approx(ratio * 10.0)


def test_a_reading_that_holds_the_budget_in_its_spread_is_read_again_until_one_side_is_sure():
    # 0.501 with quartiles 0.499-0.503 holds the limit 0.5: read again; with 0.48 (0.478-0.482) beside it the
    # readings' interval (the medians of their quartiles: 0.4885-0.4925) lies under the limit: sure, it fits
    judge = Judge(pair(0.501), pair(0.48), pair(0.7))
    result, facts = beside_teacher("m.onnx", judge, 10.0, budget_ms=5.0)
    assert judge.calls == 2 and len(facts["edge_readings"]) == 2
    assert result.median_ms == pytest.approx(4.8)  # the lower middle of two readings decides: within
    assert facts["ratio_to_teacher"] == 0.48


def test_at_most_three_readings_then_their_median_decides_by_the_stated_rule():
    # a shape exactly at the limit: every reading holds it; after EDGE_READINGS the median ratio decides
    judge = Judge(pair(0.5005), pair(0.4990), pair(0.5020), pair(0.3))
    result, facts = beside_teacher("m.onnx", judge, 10.0, budget_ms=5.0)
    assert judge.calls == EDGE_READINGS == 3
    assert result.median_ms == pytest.approx(5.005) and result.median_ms > 5.0  # over the limit by its median
    # the same readings against a budget with a 1 % tolerance (limit 5.05 ms): within, for the same stated reason
    limit = Budget(5.0, None, 0.01).limit_ms
    judge = Judge(pair(0.5005), pair(0.4990), pair(0.5020))
    result, _ = beside_teacher("m.onnx", judge, 10.0, budget_ms=limit)
    assert judge.calls == 1 and result.median_ms <= limit  # 0.4985-0.5025 lies under 0.505: sure at once


def test_a_disturbed_reading_never_decides():
    calm, burst = pair(0.497), pair(0.45, p90_over=2.0)  # a burst of other work in its runs
    assert disturbed(burst) and not disturbed(calm) and disturbed(pair(0.5, spread=0.2))
    judge = Judge(burst, pair(0.5005), calm, pair(0.9))
    result, facts = beside_teacher("m.onnx", judge, 10.0, budget_ms=5.0)
    # the disturbed first reading is set aside: the calm ones decide (0.497 and 0.5005: the lower middle)
    assert judge.calls == 3 and [r["disturbed"] for r in facts["edge_readings"]] == [True, False, False]
    assert result.median_ms == pytest.approx(4.97)
    assert deciding([burst]) is burst  # only disturbed readings: they stand, and the facts say so


def test_edge_reading_stops_when_the_limit_leaves_the_interval():
    reads = iter([pair(0.47)])
    assert len(edge_reading([pair(0.5)], lambda: next(reads), 0.5)) == 2
    assert len(edge_reading([pair(0.47)], lambda: pytest.fail("not near the budget"), 0.5)) == 1


def test_the_tolerance_is_one_rule_for_every_budget_and_is_refused_out_of_range():
    from kdnas.core.errors import InputError
    from kdnas.nas.budgets import study_budgets, within
    from kdnas.nas.records import TrialRow
    from kdnas.nas.schema import StudyFacts

    facts = StudyFacts(budget_ms=10.0, budget_tolerance=0.01, budgets=[{"label": "0.5x", "ms": 10.0},
                                                                       {"label": "0.25x", "ms": 5.0}])
    budgets = study_budgets(facts)
    assert [b.limit_ms for b in budgets] == [pytest.approx(10.1), pytest.approx(5.05)]
    assert "5.05 with its 1% tolerance" in budgets[1].named
    rows = [TrialRow(number=0, latency_median_ms=5.04), TrialRow(number=1, latency_median_ms=5.06)]
    assert within(rows, budgets[1]) == rows[:1]
    # a study made before the tolerance: none
    assert study_budgets(StudyFacts.from_attrs({"budget_ms": 10.0}))[0].limit_ms == 10.0
    for bad in (-0.01, 0.5, "x"):
        with pytest.raises(InputError, match="--budget-tolerance"):
            SearchConfig.from_flags(budget_tolerance=bad)
    assert replace(SearchConfig().latency, budget_tolerance=0.0).budget_tolerance == 0.0


def test_every_fact_of_a_reading_at_the_edge_is_a_field_of_the_records_that_keep_it():
    """The side-by-side facts of a reading near the budget (read again: `edge_readings` too) are kept by a finalist
    refused over the budget and by the teacher's plan shipped in a student's place: each record takes all of them
    (a demo's teacher plan read at the edge as shipped once failed on the one its record lacked)."""
    from kdnas.nas.schema import BEFORE_TRAINING, Fidelity, FinalTeacher, Refusal, Rival

    _, facts = beside_teacher("m.onnx", Judge(pair(0.501), pair(0.48)), 10.0, budget_ms=5.0)
    assert "edge_readings" in facts
    refusal = Refusal(trial=1, arch="3x12x384x1536", recipe={}, stage=BEFORE_TRAINING, latency_ms=5.1, budget_ms=5.0,
                      **facts)
    teacher = FinalTeacher(budget_ms=5.0, plan={}, fidelity=Fidelity(0.99), student=Rival("3x12x384x1536"),
                           shipped=True, **facts)
    assert refusal.edge_readings == teacher.edge_readings == facts["edge_readings"]
