"""The search's progress bar: trials done, best reward so far, and the current phase."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm.auto import tqdm

# A long phase's counter is redrawn at most this often (seconds): a step takes milliseconds.
TICK_S = 1.0


@dataclass
class _Pass:
    """A counter's pass: when and at which count it started, and its last tick and redraw."""

    t0: float = 0.0
    d0: int = 0
    last_t: float = 0.0
    last_done: int = -1


class Progress:
    def __init__(self, total: int | None, done: int, enabled: bool) -> None:
        """`total`: the trials to run, or None where the time decides how many."""
        self._bar = tqdm(total=total, initial=done if total is None else min(done, total), desc="kdnas search",
                         unit="trial", disable=not enabled, dynamic_ncols=True, file=sys.stderr)
        self._best = "-"
        self._phase = "starting"

    def phase(self, text: str) -> None:
        self._phase = text
        self._show()

    def counter(self, label: str, unit: str = "steps") -> Callable[[int, int], None]:
        """`tick(done, total)` for a long phase (a final run's steps, a teacher pass's rows): the phase reads
        `label: done/total unit, rate, time left`, the rate measured from the first tick of the pass (a count
        that goes back starts a new pass), redrawn at most every TICK_S."""
        state = _Pass()

        def tick(done: int, total: int) -> None:
            now = time.monotonic()
            if done < state.last_done or state.last_done < 0:
                state.t0, state.d0, state.last_t = now, done, 0.0
            state.last_done = done
            if now - state.last_t < TICK_S and done < total:
                return
            state.last_t = now
            pace = _rate_and_left(done - state.d0, now - state.t0, total - done)
            self.phase(f"{label}: {done}/{total} {unit}{pace}")

        return tick

    def note(self, text: str) -> None:
        """A line the user must see, whether the bar is shown or not."""
        tqdm.write(f"kdnas search: {text}", file=sys.stderr)

    def best(self, value: float | None) -> None:
        if value is not None:
            self._best = f"{value:.4f}"
            self._show()

    def set_done(self, done: int) -> None:
        # Counted from the storage: other workers' trials and retries move it too.
        self._bar.n = done if self._bar.total is None else min(done, self._bar.total)
        self._bar.refresh()

    def set_total(self, total: int) -> None:
        self._bar.total = total
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()

    def _show(self) -> None:
        self._bar.set_postfix_str(f"best {self._best} | {self._phase}", refresh=True)


def _rate_and_left(done: int, seconds: float, left: int) -> str:
    if done <= 0 or seconds <= 0:
        return ""
    rate = done / seconds
    eta = int(left / rate)
    return f", {rate:.1f}/s, {eta // 60}:{eta % 60:02d} left"
