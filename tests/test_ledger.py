"""The time ledger (nas.ledger): a study's seconds by phase, adding up to its runs' wall time, and the share
spent training."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kdnas.nas.ledger import PHASES, RunSeconds, TimeLedger, time_ledger


def _row(total, distill, latency, teacher=None):
    return SimpleNamespace(seconds_total=total, seconds_distill=distill, seconds_latency=latency,
                           seconds_teacher=teacher)


def test_the_phases_add_up_to_the_wall_time_and_training_is_its_share():
    run = RunSeconds(setup=10, latency=5, plans=20, trials=100, final=200, verification=4, wall=350)
    rows = [_row(50, 40, 6, teacher=15), _row(30, 20, 8), _row(2, 0, 2)]  # the first did the teacher's targets
    finals = [SimpleNamespace(seconds={"baselines": 5, "distill": 150, "quality": 10, "export": 12, "latency": 8})]
    ledger = time_ledger(run, rows, finals)
    s = ledger.seconds
    assert list(s) == list(PHASES)
    assert s["trials_training"] == 45 and s["teacher_targets"] == 15 and s["trials_other"] == 6
    assert s["latency"] == 5 + 16 and s["final_training"] == 150 and s["exports"] == 12
    assert s["verification"] == 8 + 4 and s["final_other"] == 200 - 150 - 12 - 8
    assert sum(s.values()) == pytest.approx(350) and ledger.wall_s == 350
    assert ledger.training_share == pytest.approx((45 + 150) / 350, abs=1e-4)
    assert ledger.line().startswith("time: 350 s, 56 % training (trials 45 s, final 150 s); setup 10 s")


def test_runs_add_up_and_a_study_from_before_the_ledger_says_so():
    one = RunSeconds(setup=1, trials=2, wall=5)
    assert one.plus(one) == RunSeconds(setup=2, trials=4, wall=10)
    assert RunSeconds.from_attrs({"setup": 1, "wall": 5, "unknown": 3}) == RunSeconds(setup=1, wall=5)
    assert time_ledger(None, [], []) == TimeLedger() and "not recorded" in TimeLedger().line()
