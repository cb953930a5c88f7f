"""Where a search's time went: seconds by phase and the share spent training (summary.json's `time_ledger`).

A search exists to train students; reading latency, exporting and waiting are its overhead. The ledger adds up
what the study stores — each trial's seconds (`TrialSeconds`), each finalist's (`FinalRecord.seconds`) and the
wall seconds of each run's stages (`RunSeconds`, recorded by nas.search) — so the share of the wall time that
trained is one number a user can hold a run to.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The phases, in the order a search runs them.
PHASES = ("setup", "latency", "teacher_targets", "plans", "trials_training", "trials_other", "final_training",
          "final_other", "exports", "verification", "other")


@dataclass(frozen=True)
class RunSeconds:
    """The wall seconds of one search command's stages, added up over the runs of a study (a resumed run adds its
    own): set-up (teacher, corpus, transfer set), the teacher's and the space's readings or the target profile,
    the teacher's plans before the trials, the trials, the final stage, the shipped graph's check, the whole."""

    setup: float = 0.0
    latency: float = 0.0
    plans: float = 0.0
    trials: float = 0.0
    final: float = 0.0
    verification: float = 0.0
    wall: float = 0.0

    def plus(self, other: "RunSeconds") -> "RunSeconds":
        return RunSeconds(**{name: round(getattr(self, name) + getattr(other, name), 3) for name in vars(self)})

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any] | None) -> "RunSeconds | None":
        if attrs is None or isinstance(attrs, RunSeconds):
            return attrs
        return cls(**{k: float(v) for k, v in attrs.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class TimeLedger:
    """Seconds by phase (`PHASES`), the wall seconds they add up to and the share of them spent training."""

    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float | None = None
    training_share: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "wall_s": self.wall_s, "training_share": self.training_share}

    def line(self) -> str:
        """`time: 472 s, 61 % training (trials 120 s, final 168 s); latency 12 s, ...`."""
        if self.wall_s is None:
            return "time: not recorded (a study from before the time ledger)"
        s = self.seconds
        others = ", ".join(f"{name.replace('_', ' ')} {s[name]:.0f} s" for name in PHASES
                           if name not in ("trials_training", "final_training") and s.get(name, 0) >= 0.5)
        return (f"time: {self.wall_s:.0f} s, {100 * (self.training_share or 0):.0f} % training (trials "
                f"{s.get('trials_training', 0):.0f} s, final {s.get('final_training', 0):.0f} s); {others}")


def time_ledger(run: RunSeconds | None, trials: Iterable[Any], finals: Iterable[Any]) -> TimeLedger:
    """The ledger of a study: `run` (its runs' stages), its trial rows (`TrialRow`: seconds_total, _distill,
    _latency, _teacher) and its finalists (`FinalRecord.seconds`)."""
    if run is None:
        return TimeLedger()
    t_total = t_distill = t_latency = t_teacher = 0.0
    for row in trials:
        t_total += row.seconds_total or 0.0
        t_distill += row.seconds_distill or 0.0
        t_latency += row.seconds_latency or 0.0
        t_teacher += row.seconds_teacher or 0.0
    f: dict[str, float] = {}
    for record in finals:
        for key, value in (record.seconds or {}).items():
            f[key] = f.get(key, 0.0) + float(value)
    final_training = f.get("distill", 0.0)
    seconds = {
        "setup": run.setup, "latency": run.latency + t_latency, "teacher_targets": t_teacher, "plans": run.plans,
        "trials_training": max(0.0, t_distill - t_teacher), "trials_other": max(0.0, t_total - t_distill - t_latency),
        "final_training": final_training, "exports": f.get("export", 0.0),
        "verification": f.get("latency", 0.0) + run.verification,
    }
    # The final stage's own overhead: its baselines, fidelity table, the teacher's plans grown there, waiting.
    seconds["final_other"] = max(0.0, run.final - final_training - seconds["exports"] - f.get("latency", 0.0))
    seconds["other"] = max(0.0, run.wall - sum(seconds.values()))
    seconds = {name: round(seconds[name], 1) for name in PHASES}
    training = seconds["trials_training"] + seconds["final_training"]
    return TimeLedger(seconds, round(run.wall, 1), round(training / run.wall, 4) if run.wall > 0 else None)


class StageClock:
    """The wall seconds of a search command's stages (`nas.ledger.RunSeconds`): `mark(name)` ends one."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.spent: dict[str, float] = {}

    def mark(self, stage: str) -> None:
        now = time.monotonic()
        self.spent[stage] = self.spent.get(stage, 0.0) + now - self.last
        self.last = now

    def seconds(self) -> RunSeconds:
        return RunSeconds(**{k: round(v, 3) for k, v in self.spent.items()},
                          wall=round(time.monotonic() - self.start, 3))
