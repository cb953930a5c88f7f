"""The search's progress line for a long phase: steps or rows done, the rate and the time left."""

from __future__ import annotations

from kdnas.nas import _progress
from kdnas.nas._progress import Progress


def test_a_long_phase_shows_its_count_rate_and_time_left(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(_progress.time, "monotonic", lambda: clock[0])
    progress = Progress(8, 0, enabled=False)
    tick = progress.counter("final 1/1 3x12x384x1536: distill", "steps")
    tick(1, 1201)
    assert progress._phase == "final 1/1 3x12x384x1536: distill: 1/1201 steps"  # no pace from one tick
    clock[0] += 0.5
    tick(51, 1201)  # redrawn at most once a second: still the first line
    assert progress._phase.endswith(": 1/1201 steps")
    clock[0] += 0.5
    tick(101, 1201)  # 100 steps in 1 s: 1,100 left take 11 s
    assert progress._phase == "final 1/1 3x12x384x1536: distill: 101/1201 steps, 100.0/s, 0:11 left"
    tick(1201, 1201)  # the last count is always shown
    assert progress._phase.startswith("final 1/1 3x12x384x1536: distill: 1201/1201 steps")
    clock[0] += 10
    tick(32, 640)  # a count that goes back is a new pass: its rate is its own
    clock[0] += 2
    tick(96, 640)
    assert progress._phase.endswith(": 96/640 steps, 32.0/s, 0:17 left")


def test_a_teacher_pass_reports_its_rows(teacher, small_data):
    from kdnas.distill import TeacherCache
    from kdnas.distill.activations import Needs

    seen = []
    cache = TeacherCache(teacher, small_data, batch_size=50, on_rows=lambda done, total: seen.append((done, total)))
    cache.ensure("train", Needs(hidden=frozenset({6})))
    assert seen == [(50, 128), (100, 128), (128, 128)]
