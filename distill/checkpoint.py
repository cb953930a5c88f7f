"""Resumable runs: a distillation's whole state, saved every N updates, so that a run stopped by a
crash, a killed job or a machine taken back goes on from its last save when it is started again —
the same updates in the same order, as if it had never stopped (a long final run on two CPU cores
takes hours: 40,000 steps of the demo's student, docs/design/final-recipe.md).

A save holds what the next update depends on: the student's and the method's weights (the method
holds the learned projections), AdamW's moments, the schedule's position, the RNG that orders the
batches and perturbs them, the batches left of the current pass over the transfer set — and the
record so far (evaluations, the losses since the last one, tokens, seconds). It is written to a
temporary name and renamed, so a run killed mid-save keeps the previous one.

A save is resumed only by the run it came from: the same student shape, teacher, training rows (a
hash of their token ids) and config. The device, the precision and the progress bar may differ —
a run begun in fp32 on one machine may go on in bf16 on another; `DistillResult.resumed_from`
says where it went on.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kdnas.core.errors import InputError

# What a save holds and how; a change there bumps it, and an older save is refused, not misread.
FORMAT = 1
# How often a long run saves by default (`kdnas distill --save-every`, a search's final run): a save
# of the demo's student takes 0.32 s (107 MB) against 0.28 s an update on two CPU cores, 0.11 % of
# the 1,000 updates between two (one-off benchmark, in git history); a shorter run never saves.
SAVE_EVERY = 1000
# Config fields that do not change what the updates compute (where, how fast, how loudly).
_FREE = ("device", "precision", "progress")


@dataclass(frozen=True)
class Checkpoints:
    """Save the run's state to `path` after every `every` updates, and after the last one too when
    `final`; a run started with a save at `path` from the same run goes on from it."""

    path: Path
    every: int
    final: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise InputError(f"save every {self.every!r} steps is invalid: must be a whole number >= 1")

    def stage(self, n: int) -> "Checkpoints":
        """The saves of stage `n` of a multi-stage recipe, beside this path."""
        return replace(self, path=self.path.with_name(f"{self.path.stem}-stage{n}{self.path.suffix}"))

    def due(self, step: int, last: bool) -> bool:
        return step % self.every == 0 or (self.final and last)


def run_identity(arch: str, teacher: str, ids: torch.Tensor, config: Any) -> dict[str, Any]:
    """What a save must share with the run that resumes it."""
    rows = hashlib.sha256(ids.contiguous().cpu().numpy().tobytes()).hexdigest()[:16]
    settings = {k: v for k, v in asdict(config).items() if k not in _FREE}
    return {"format": FORMAT, "arch": arch, "teacher": teacher, "rows": [int(ids.shape[0]), rows], "config": settings}


def save_state(path: Path, state: Any) -> None:
    """Write `state` with torch.save to `path` atomically (a temporary file beside it, then a rename);
    also how the teacher-target cache keeps its entries (distill.cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_state(path: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The state saved at `path`, None when there is none; a save from another run is refused with
    one line naming the first setting that differs (nothing is removed)."""
    if not path.is_file():
        return None
    try:
        # on the CPU: the RNG states must be there, and the run moves the weights where it trains
        state = torch.load(path, map_location="cpu", weights_only=False)
        saved = state["identity"]
    except Exception as exc:  # a torn or foreign file: say so, do not guess
        raise InputError(f"{path} is not a readable kdnas run state ({type(exc).__name__}); remove it to start "
                         "the run afresh") from exc
    if saved != identity:
        key, here, there = _first_difference(identity, saved)
        raise InputError(f"{path} holds a run with {key}={there}, this run has {key}={here}; rerun with the same "
                         "settings to go on from it, or remove it to start afresh")
    return state


def _first_difference(here: dict[str, Any], there: dict[str, Any], prefix: str = "") -> tuple[str, Any, Any]:
    for key in sorted(set(here) | set(there)):
        a, b = here.get(key), there.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if a != b:
                return _first_difference(a, b, f"{prefix}{key}.")
        elif a != b:
            return f"{prefix}{key}", a, b
    return prefix.rstrip(".") or "state", here, there
