"""The search's progress bar: trials done, best reward so far, and the current phase."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


class Progress:
    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self._bar = tqdm(total=total, initial=min(done, total), desc="kdnas search", unit="trial",
                         disable=not enabled, dynamic_ncols=True, file=sys.stderr)
        self._best = "-"
        self._phase = "starting"

    def phase(self, text: str) -> None:
        self._phase = text
        self._show()

    def note(self, text: str) -> None:
        """A line the user must see, whether the bar is shown or not."""
        tqdm.write(f"kdnas search: {text}", file=sys.stderr)

    def best(self, value: float | None) -> None:
        if value is not None:
            self._best = f"{value:.4f}"
            self._show()

    def set_done(self, done: int) -> None:
        # Counted from the storage: other workers' trials and retries move it too.
        self._bar.n = min(done, self._bar.total)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()

    def _show(self) -> None:
        self._bar.set_postfix_str(f"best {self._best} | {self._phase}", refresh=True)
