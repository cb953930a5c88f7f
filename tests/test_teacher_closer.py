"""Where the teacher's own plan fits a budget, a student's plan is grown only where it could win: a plan keeps
at most the student's fp32 fidelity, so a teacher plan ahead of that by more than noise ends it."""

from __future__ import annotations

from kdnas.nas.final._shipping import CLOSER_BY_SE, _teacher_closer
from kdnas.nas.schema import Fidelity, PlanRecord, Quality

PLAN = PlanRecord(label="INT8, fp32: 8.ffn_out", fp32_groups=("8.ffn_out",), fidelity=0.985, latency_ms=30.0)


def quality(rho: float, se: float | None = 0.0066) -> Quality:
    return Quality(fidelity={"student": Fidelity(rho, se)})


def test_a_teacher_plan_ahead_of_the_students_fp32_graph_by_more_than_noise_skips_the_students_plan():
    why = _teacher_closer(PLAN, quality(0.898))  # MPNet at 0.5x: an 11-layer student after 20 steps
    assert why is not None and "0.985" in why and "0.898" in why and "no plan grown" in why


def test_a_lead_within_noise_or_no_measure_grows_the_plan():
    assert _teacher_closer(PLAN, quality(0.985 - CLOSER_BY_SE * 0.0066 + 1e-4)) is None  # within two SEs
    assert _teacher_closer(PLAN, quality(0.99)) is None  # the student ahead
    assert _teacher_closer(None, quality(0.5)) is None  # no teacher plan within the budget
    assert _teacher_closer(PlanRecord(label="INT8"), quality(0.5)) is None  # its probe fidelity not measured
    assert _teacher_closer(PLAN, None) is None  # no held-out fidelity (--quality-sentences 0)
    assert _teacher_closer(PLAN, quality(0.5, se=None)) is None  # no standard error
