"""`--timeout`: one wall-clock limit for the whole search command, as AutoML tools offer.

Without it a run is the same on every host (its trials and its final steps are fixed); with it the
command ends in time on a slow or busy host and says what it gave up, and on a fast one spends
the time it has on a longer final run. The time is split in two:

- **trials** start only while less than TRIAL_SHARE of it is spent (at least one always runs): the
  final run usually costs more than all trials together, and it is what ships. Without a trial count
  their number follows the time: they go on while less than TIMED_TRIAL_SHARE of it is spent. After the sampler's
  random start (FIRST_TRIALS), a trial starts only while the final run's planned steps, at the pace
  the trials measured, still fit after it (`final_run_s`): on a slow host the last trials give way
  to the student that ships;
- **the final run** trains as many steps as fit before the limit less what still follows it —
  fewer than `--final-steps` on a slow host, more (up to `SearchConfig.final_most`) on a fast one —
  with the pace measured on the run itself (`distill.loop.StepPlan`). What follows
  it — the student's fidelity, the export, the latency readings of the shipped graphs — is
  estimated from the same kinds of work timed just before the training, on the same host
  (`after_training_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kdnas.core.spec import parse_arch

TRIAL_SHARE = 0.5
# Without a trial count (`--trials`), trials go on while less than this share of the time is spent, the
# one-time teacher work left out — and at least the default count (nas.config.DEFAULT_TRIALS, 8) run:
# a 10-minute demo (8 trials take about 3 of its minutes) keeps its 8 and its final run's time, and an
# hour-long MPNet search (a trial about 19 s) gets past TPE's random start-up with about 45 trials and
# still trains its student for most of the hour.
TIMED_TRIAL_SHARE = 0.25
# Trials that start whatever the final run's forecast says: the sampler's random start (TPE's startup
# trials, nas.search.TPE_STARTUP_TRIALS); before them a proposal is not informed by any result.
FIRST_TRIALS = 5
# The work around a final run, in typical trials: before it the finalist's and its neighbour's graph
# readings, the neighbour's proxy and the untrained baselines, after it an export and readings. An
# fp32 demo on 2 cores took 65-75 s for it against a median trial of 25 s (2.6-3.0 trials).
FINAL_OVERHEAD_TRIALS = 3
# After the final run: the export, then at most four readings — its fp32 graph beside the teacher
# (the two timed in alternation; for an absolute budget, read twice when over), the INT8 graph.
# Each of these steps costs about what one step of the same graph's pre-training export-and-read
# cost (an export, one to three readings). Where the plain fp32 graph ships (nas.variant), its
# export is one step more (nas.final._shipping.finish adds it).
STEPS_AFTER = 5
# A finalist whose shipped graph reads within this share of the budget before its training (or fits
# only on a second reading) may well read over it once trained: two readings of one graph on a
# shared 2-core host differ by more (6.89 and 8.64 ms; 13.32 and 12.14 ms), and so do four
# side-by-side measurements of 3x12x384x1536 (0.484 to 0.511 of the teacher: 5.4 % of a budget of
# half; a one-off benchmark, in git history; docs/latency.md). Its run leaves time for the fallback (`fallback_s`),
# so a refusal does not overrun the limit.
MARGIN = 0.05
# What a whole command may run past its --timeout: the work after the final run that no estimate can cut
# short (the export, the readings of what ships, writing the pages), at the least limit that works
# (nas.config.MIN_TIMEOUT_S) on the bundled teacher and 2 cores.
TIMEOUT_MARGIN_S = 60
# The teacher's precision plan is grown before the trials only where its forecast (nas.plans.replan_s) ends it
# within this share of the time; otherwise its all-INT8 graph stands until the final stage, which grows the plan
# where the trials' measured pace leaves the final run its least work (nas.plans.teacher_plans_again). At the least
# --timeout on a slow 2-core host the plans before the trials took 139-140 s of 300 (their sensitivity pass 52-55 s),
# the one trial that always runs 77 s (the teacher's targets included) and the final stage about 135 s: the command
# ran 366-370 s, past the limit and its margin. A quarter leaves the first trial and the final stage their time.
PLANS_SHARE = 0.25


@dataclass(frozen=True)
class TimeLimit:
    """`seconds` of wall-clock time from `started` (a `time.monotonic()` value)."""

    started: float
    seconds: float

    @property
    def end(self) -> float:
        return self.started + self.seconds

    def trials_may_start(self, done: int, now: float | None = None) -> bool:
        """Whether another trial may start, `done` being the finished ones."""
        now = time.monotonic() if now is None else now
        return done < 1 or now - self.started < TRIAL_SHARE * self.seconds

    def timed_trials_may_start(self, one_time_s: float, now: float | None = None) -> bool:
        """Whether trials that follow the time may go on: less than TIMED_TRIAL_SHARE of it spent, less
        `one_time_s` of one-time work (the teacher's targets, which a first trial happened to make)."""
        now = time.monotonic() if now is None else now
        return now - self.started - one_time_s < TIMED_TRIAL_SHARE * self.seconds

    def plans_before_trials(self, forecast_s: float, now: float | None = None) -> bool:
        """Whether a precision plan forecast to take `forecast_s` may be grown before the trials: it ends within
        PLANS_SHARE of the time."""
        now = time.monotonic() if now is None else now
        return now + forecast_s - self.started <= PLANS_SHARE * self.seconds

    def keeps_final_run(self, final_s: float, trial_s: float, now: float | None = None) -> bool:
        """Whether one more trial of about `trial_s` still leaves the final run its forecast `final_s`."""
        now = time.monotonic() if now is None else now
        return now + trial_s + final_s <= self.end

    def final_until(self, after_s: float, finalists_left: int = 1, now: float | None = None,
                    before_s: float = 0.0, trailing: int = 0) -> float:
        """When the next final run must end: the time left, less `after_s` for what follows each of the
        `finalists_left` runs still to go (this one and the rest: `--final-top-k`, other budgets) and of the
        `trailing` ones after them that take no share of the time (nas.search.final_order), and `before_s` for
        what precedes each later one (its untrained baselines), shared evenly among the `finalists_left` runs.
        The others are taken to need what this one does: reserving only this run's own left the last of four
        MPNet budgets sharing an hour 20 steps, and the command 82% over its --timeout."""
        now = time.monotonic() if now is None else now
        left = max(1, finalists_left)
        reserved = (left + trailing) * after_s + (left - 1 + trailing) * before_s
        return now + (self.end - now - reserved) / left


def final_run_s(steps: int, step_s: float, trial_s: float) -> float:
    """Forecast seconds of the final stage at its planned `steps`: the likely finalist's pace `step_s`
    from its trial (the fidelity proxy trains the final recipe, same batch and rows, for fewer
    steps) and FINAL_OVERHEAD_TRIALS trials of `trial_s` for the work around the run."""
    return steps * step_s + FINAL_OVERHEAD_TRIALS * trial_s


def pace_of(step_s: float, measured: str, shipped: str, seq_len: int) -> float:
    """The pace per update of shape `shipped`, from `step_s` measured on shape `measured`, in
    proportion to their FLOPs per sequence (`StudentSpec.flops`). The final stage may ship the best
    trial's wider FFN neighbour, which no trial timed: a forecast from the best trial's own pace ran
    short by a quarter when it did (0.224 s measured on 3x12x384x1024, 0.278 s on 3x12x384x1280)."""
    return step_s * parse_arch(shipped).flops(seq_len) / parse_arch(measured).flops(seq_len)


def after_training_s(step_s: float, baselines_s: float) -> float:
    """Seconds a finalist still needs once trained, from work timed before its training: `step_s`
    per step of its shipped graph's export-and-read, and `baselines_s` (the teacher's held-out
    embeddings and the two untrained baselines' — the student's own passes cost less than half, its
    INT8 graph's on the same sentences a sixth more: 2.5 s beside 14.3 s on the demo's host).
    What was set aside and what was taken, run by run: benchmarks/results/search_timeout.json."""
    return STEPS_AFTER * step_s + baselines_s * 2 / 3


def marginal(read_ms: float, budget_ms: float, read_twice: bool) -> bool:
    """Whether a finalist's pre-training reading of its shipped graph is too close to the budget to
    count on: within MARGIN of it, or within it only on a second reading."""
    return read_twice or read_ms > (1 - MARGIN) * budget_ms


def settled(read_ms: float, budget_ms: float, read_again: Callable[[], float]) -> tuple[float, list[float]]:
    """A finalist's pre-training reading as its run counts it, and the readings taken: one that fits within
    MARGIN of the budget is read once more and the two are averaged, so that one noisy reading neither sets
    aside a fallback's time (`fallback_s`: 564 s of a 1,500 s `--timeout` for an MPNet student read at 0.951
    of its budget) nor lets a finalist over the budget train. Readings outside the margin stand as read."""
    if not (1 - MARGIN) * budget_ms < read_ms <= budget_ms:
        return read_ms, []
    again = read_again()
    return (read_ms + again) / 2, [read_ms, again]


def fallback_s(after_s: float, step_s: float, baselines_s: float, proxy_s: float, continued_s: float = 0.0) -> float:
    """Seconds the candidate after a finalist refused as shipped needs, from the same timings: its
    shipped graph exported and read beside its parent's (three steps of `step_s`), the proxy that
    scores it (`proxy_s`, a trial's), its untrained baselines, what follows any run (`after_s`), and
    `continued_s` for the fewest steps the refused run is continued with (nas.final.MIN_CONTINUED_STEPS,
    at its trial's pace): without them it ships narrowed and untrained, ρ 0.854 in one fp32 demo."""
    return 3 * step_s + proxy_s + baselines_s + after_s + continued_s
