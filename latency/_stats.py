"""Timing loop and statistics, kept free of any runtime so they can be tested with a fake clock."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    """When a measurement is done: the median has settled, or a cap is hit.

    Settled means adding the last `window` runs moved the median by at most `rel_tol`; `min_runs`
    and `min_seconds` come first so a fast model is still sampled over enough wall time to average
    out the scheduler (the CPU is shared with whatever else runs on the machine).
    """

    warmup_runs: int = 5
    warmup_seconds: float = 0.3
    min_runs: int = 20
    min_seconds: float = 1.0
    max_runs: int = 2000
    max_seconds: float = 10.0
    window: int = 10
    rel_tol: float = 0.01


@dataclass(frozen=True)
class Stats:
    median_ms: float
    p90_ms: float
    min_ms: float
    mean_ms: float
    cv: float  # standard deviation / mean
    runs: int
    stable: bool


def measure(run_once: Callable[[], object], rule: StopRule = StopRule(),
            clock: Callable[[], float] = time.perf_counter) -> Stats:
    """Warm up, then time `run_once` until the median is stable or a cap is hit."""
    start = clock()
    done = 0
    while done < rule.warmup_runs or clock() - start < rule.warmup_seconds:
        run_once()
        done += 1
    samples: list[float] = []
    start = clock()
    stable = False
    while True:
        t0 = clock()
        run_once()
        t1 = clock()
        samples.append((t1 - t0) * 1e3)
        n, elapsed = len(samples), t1 - start
        if n >= rule.min_runs and n > rule.window and elapsed >= rule.min_seconds and n % rule.window == 0:
            now, before = statistics.median(samples), statistics.median(samples[:-rule.window])
            if abs(now - before) <= rule.rel_tol * now:
                stable = True
                break
        if n >= rule.max_runs or elapsed >= rule.max_seconds:
            break
    return summarize(samples, stable)


def measure_blocks(run_once: Callable[[], object], rule: StopRule = StopRule(), *, blocks: int = 3,
                   retries: int = 2, max_cv: float = 0.10, clock: Callable[[], float] = time.perf_counter,
                   sleep: Callable[[float], None] = time.sleep) -> tuple[Stats, list[Stats], bool]:
    """`blocks` measurements (each by `measure`), plus up to `retries` more while none was quiet.

    A burst of other work on a shared machine lasts seconds and lands in one block, and other work
    can only add time, so the least disturbed block is kept (timeit's "min of repeats" reasoning):
    the settled block with the lowest median. Its cv is not a filter: a few preempted runs inflate
    the cv without moving the median. Returns (that block, every block in order, quiet), quiet
    meaning at least one block settled with a spread within `max_cv`.
    """
    done: list[Stats] = []
    quiet = False
    for attempt in range(blocks + retries):
        if attempt:
            sleep(0.2 if attempt < blocks else 1.0)  # a longer pause lets a burst pass before a retry
        done.append(measure(run_once, rule, clock))
        quiet = any(s.stable and s.cv <= max_cv for s in done)
        if len(done) >= blocks and quiet:
            break
    return min(done, key=lambda s: (not s.stable, s.median_ms)), done, quiet


@dataclass(frozen=True)
class PairStats:
    """Two models timed in alternation: the ratio of their latencies and each one's runs."""

    ratio: float  # median over the rounds of (target's median / reference's median) in that round
    ratio_low: float  # the round ratios' lower and upper quartiles: how far one round strays
    ratio_high: float
    target: Stats
    reference: Stats
    rounds: int


def measure_pair(run_target: Callable[[], object], run_reference: Callable[[], object], *, rounds: int = 12,
                 runs: int = 15, warmup_runs: int = 5, clock: Callable[[], float] = time.perf_counter) -> PairStats:
    """The latency of `run_target` relative to `run_reference`, timed side by side.

    A shared host's speed drifts by more than a budget's margin between two measurements made
    seconds apart (one graph read 12.39, 10.88 and 9.09 ms within a minute), so a student and its
    teacher measured one after the other can land on either side of "half the teacher". Here the
    two alternate in short rounds of `runs` runs each (the order flips every round, so a steady
    drift weighs on both alike); a burst of other work slows both within a round and mostly cancels
    in that round's ratio, and the median over rounds sets aside the rounds it did not."""
    for _ in range(warmup_runs):
        run_target()
        run_reference()
    ratios: list[float] = []
    target_ms: list[float] = []
    reference_ms: list[float] = []
    for r in range(rounds):
        pair = (run_target, run_reference) if r % 2 == 0 else (run_reference, run_target)
        first, second = (_timed_runs(run, runs, clock) for run in pair)
        target, reference = (first, second) if r % 2 == 0 else (second, first)
        ratios.append(statistics.median(target) / statistics.median(reference))
        target_ms += target
        reference_ms += reference
    ordered = sorted(ratios)
    return PairStats(ratio=statistics.median(ratios), ratio_low=_percentile(ordered, 0.25),
                     ratio_high=_percentile(ordered, 0.75), target=summarize(target_ms),
                     reference=summarize(reference_ms), rounds=rounds)


def _timed_runs(run_once: Callable[[], object], runs: int, clock: Callable[[], float]) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = clock()
        run_once()
        times.append((clock() - t0) * 1e3)
    return times


def summarize(samples_ms: list[float], stable: bool = True) -> Stats:
    if not samples_ms:
        raise ValueError("no samples")
    ordered = sorted(samples_ms)
    mean = statistics.fmean(ordered)
    sd = statistics.pstdev(ordered) if len(ordered) > 1 else 0.0
    return Stats(
        median_ms=statistics.median(ordered),
        p90_ms=_percentile(ordered, 0.9),
        min_ms=ordered[0],
        mean_ms=mean,
        cv=sd / mean if mean > 0 else 0.0,
        runs=len(ordered),
        stable=stable,
    )


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted data."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
