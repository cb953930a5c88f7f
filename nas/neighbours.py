"""The final stage's candidates: the trained trials, best reward first, and the FFN neighbours of a finalist.

A search of a few trials samples the space sparsely, and the budget's edge usually falls between
two FFN widths of the winner's shape: half MiniLM's latency lies between 3x12x384x1280 and
3x12x384x1536, where each 256 FFN channels are worth about 0.01 of embedding fidelity
(docs/design/final-recipe.md). So before a finalist is trained, its shape with the FFN at the
space's next wider width is tried, and after a finalist is refused over the budget, its shape at
the next narrower width: a neighbour is measured like a finalist (its shipped graph, before any
training), scored by the search's proxy like a trial, and takes its place among the candidates
by reward. At most `MAX_NEIGHBOURS` per final stage, and never a shape that a trial, a finalist or
another neighbour already had.
"""

from __future__ import annotations

from typing import Any

from .schema import Candidate, FinalRecord, Refusal

MAX_NEIGHBOURS = 2
WIDER, NARROWER = 1, -1


def candidates(pool: list[Candidate], over: list[Refusal], neighbours: list[Candidate]) -> list[Candidate]:
    """The finalists in the order they are tried: the trials of `pool` and the scored `neighbours`,
    without the shapes already refused over the budget (a repeated shape is as slow as the first),
    best reward first (a trial before a neighbour of equal reward)."""
    refused = {s.arch for s in over}
    return sorted([r for r in pool + neighbours if r.arch not in refused], key=lambda r: -r.reward)


def ffn_neighbour(space: Any, row: Candidate, direction: int, taken: set[str]) -> Candidate | None:
    """`row`'s shape with its FFN at the space's next width in `direction` (WIDER or NARROWER), not
    yet scored (`reward` None); None when there is no such width, the shape is in `taken`, or the
    space rejects it."""
    widths = sorted((f for f in space.ffn if (f - row.ffn) * direction > 0), key=lambda f: abs(f - row.ffn))
    if not widths:
        return None
    ffn = widths[0]
    arch = f"{row.layers}x{row.heads}x{row.hidden}x{ffn}"
    if arch in taken or space.reject_reason(row.layers, row.heads, row.hidden, ffn):
        return None
    return Candidate(number=row.number, arch=arch, layers=row.layers, heads=row.heads, hidden=row.hidden, ffn=ffn,
                     neighbour_of=row.arch, parent_latency_ms=row.scored_latency)


def on_trial_scale(ms: float, parent_then: float | None, parent_now: float | None) -> tuple[float, float]:
    """A neighbour's reading `ms`, put on the scale of the readings its parent was scored with.

    The parent was read when it was a trial, minutes earlier; a shared host's speed drifts by more
    than the FFN step between the two (the same 3x12x384x1280 graph read 8.91 and 9.93 ms in two
    demos), and the reward compares the two readings. The parent's graph is read again just before
    its neighbour (`parent_now`), so `ms × parent_then / parent_now` is the side-by-side ratio on the
    trials' scale. Returns the reading and the factor (1.0 when either parent reading is missing)."""
    if not parent_then or not parent_now:
        return ms, 1.0
    factor = parent_then / parent_now
    return ms * factor, factor


def rank_in(queue: list[Candidate], row: Candidate) -> None:
    """Put `row` into the candidates: a neighbour not yet scored first (it is tried at once), a
    scored candidate after every one with at least its reward."""
    at = 0 if row.reward is None else next((i for i, r in enumerate(queue)
                                            if r.reward is not None and r.reward < row.reward), len(queue))
    queue.insert(at, row)


def origin(trial: int, parent: str | None) -> str:
    """Where a finalist's shape came from (trial `trial`, or the FFN neighbour of its shape `parent`), for the
    summary, the report and the model card."""
    return f"trial #{trial}" if parent is None else f"the FFN neighbour of trial #{trial}'s {parent}"


def shape_label(final: FinalRecord) -> str:
    """A shipped finalist's shape, with where it came from when it was a neighbour (not a trial)."""
    return f"{final.arch} ({origin(final.trial, final.neighbour_of)})" if final.neighbour_of else final.arch
