"""The architecture search space: which (layers, heads, hidden, FFN) the sampler may propose.

Each dimension is a sorted tuple of allowed integers. The default is derived from the teacher so
that every combination is a valid BERT shape (every hidden size is divisible by every head
count): then an impossible shape cannot be proposed at all. A user-given space may contain
invalid (heads, hidden) pairs; those are rejected at once, before anything is built (see
`reject_reason`), and a space with no valid shape at all is a user error.

A space may instead fix the *head size* (`head_size`): then the head count is not searched but
follows the width (heads = hidden / head_size). The default space does so for students inherited
from their teacher: every student head is then one whole teacher head (Minitron prunes heads and
keeps their size), where a different head size has to merge or split teacher heads and loses most
of what inheritance gives (docs/design/final-recipe.md measures it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdnas.core.errors import KdnasError, InputError, first_line

DIMENSIONS = ("layers", "heads", "hidden", "ffn")
_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class SearchSpace:
    """Allowed values per dimension, each a sorted tuple of distinct positive integers."""

    layers: tuple[int, ...]
    heads: tuple[int, ...]
    hidden: tuple[int, ...]
    ffn: tuple[int, ...]
    head_size: int | None = None  # set: heads = hidden / head_size, not searched

    def __post_init__(self) -> None:
        if self.head_size is not None:
            if not isinstance(self.head_size, int) or isinstance(self.head_size, bool) or self.head_size < 1:
                raise InputError(f"search space: head_size={self.head_size!r} must be a positive integer")
            uneven = [h for h in self.hidden if isinstance(h, int) and h % self.head_size]
            if uneven:
                raise InputError(f"search space: hidden {uneven} not a multiple of the head size {self.head_size}; "
                                 f"allowed: multiples of {self.head_size}, or a free `heads` list")
            object.__setattr__(self, "heads", tuple(h // self.head_size for h in self.hidden))
        for name in DIMENSIONS:
            values = getattr(self, name)
            if not values:
                raise InputError(f"search space: {name} has no allowed value")
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
                raise InputError(f"search space: {name} values {list(values)} must be positive integers")
            # Normalise so two equal spaces compare (and are stored) equal.
            object.__setattr__(self, name, tuple(sorted(set(values))))
        if not self.widths():
            raise InputError(
                f"search space has no valid shape: no hidden size in {list(self.hidden)} is divisible "
                f"by any head count in {list(self.heads)}"
            )

    def widths(self) -> list[tuple[int, int]]:
        """The valid (heads, hidden) pairs."""
        if self.head_size is not None:
            return [(h // self.head_size, h) for h in self.hidden]
        return [(a, h) for h in self.hidden for a in self.heads if h % a == 0]

    @property
    def size(self) -> int:
        """Number of valid shapes."""
        return len(self.layers) * len(self.widths()) * len(self.ffn)

    @property
    def rectangular(self) -> bool:
        """True when every combination is valid, so nothing the sampler proposes is ever rejected."""
        return self.head_size is not None or len(self.widths()) == len(self.heads) * len(self.hidden)

    def reject_reason(self, layers: int, heads: int, hidden: int, ffn: int) -> str | None:
        if hidden % heads:
            return f"hidden {hidden} is not divisible by {heads} heads"
        if self.head_size is not None and hidden // heads != self.head_size:
            return f"{heads} heads of {hidden} hidden are not of the space's head size {self.head_size}"
        return None

    def fastest(self) -> tuple[int, int, int, int]:
        """The cheapest valid shape: fewest layers, narrowest width, fewest heads, smallest FFN."""
        heads, hidden = min(self.widths(), key=lambda w: (w[1], w[0]))
        return self.layers[0], heads, hidden, self.ffn[0]

    def suggest(self, trial: Any) -> tuple[int, int, int, int]:
        """Ask an Optuna trial for one shape (layers, heads, hidden, ffn)."""
        if self.head_size is None:
            return tuple(_suggest(trial, name, getattr(self, name)) for name in DIMENSIONS)  # type: ignore[return-value]
        layers, hidden, ffn = (_suggest(trial, name, getattr(self, name)) for name in ("layers", "hidden", "ffn"))
        return layers, hidden // self.head_size, hidden, ffn

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: list(getattr(self, name)) for name in DIMENSIONS}
        if self.head_size is not None:
            out["head_size"] = self.head_size
        return out


def rule_params(space: SearchSpace, teacher_layers: int, ratio: float) -> dict[str, int] | None:
    """The one-line rule's shape as the sampler's parameters: as many of the teacher's layers as the budget's
    share of its latency allows (latency grows with depth at a fixed width), at the widest hidden size and FFN
    of the space — "the teacher's full width at the depth that fits". None where the space cannot hold it."""
    depth = max(1, math.floor(teacher_layers * ratio + 1e-9))
    layers = [n for n in space.layers if n <= depth]
    if not layers or ratio <= 0:
        return None
    params = {"layers": max(layers), "hidden": max(space.hidden), "ffn": max(space.ffn)}
    if space.head_size is None:
        fitting = [a for a in space.heads if params["hidden"] % a == 0]
        if not fitting:
            return None
        params["heads"] = max(fitting)
    return params


def default_space(layers: int, heads: int, hidden: int, ffn: int, keep_head_size: bool = False) -> SearchSpace:
    """A space derived from the teacher's shape (L_T, A_T, d_T, d_f).

    With `keep_head_size` (the default for inherited students): the teacher's head size d_T/A_T is
    kept, hidden runs over multiples of it near 96 up to d_T, and heads follow (e.g. 3, 6, 9, 12
    heads of 32 for MiniLM's 96..384); layers and FFN as below. Otherwise:

    - layers 1..L_T;
    - heads: the divisors of A_T that are at least A_T/3 (e.g. 4, 6, 12 for 12 heads);
    - hidden: multiples of a step up to d_T, the step being a multiple of every head count (so every
      pair is valid) near 96 (e.g. 96, 192, 288, 384 for MiniLM; 96..768 for a base model);
    - FFN: sixths of the teacher's FFN, rounded to 64 (e.g. 256..1536 for MiniLM), independent of hidden, as in the
      paper's 4L (576 hidden, 768 FFN) and 3L (384 hidden, 1024 FFN) students.
    """
    # Sixths of the teacher's FFN, rounded to multiples of 64 (exact for 1536 and 3072).
    ffn_choices = tuple(sorted({max(64, round(ffn * k / 6 / 64) * 64) for k in range(1, 6)} | {ffn}))
    if keep_head_size and hidden % heads == 0:
        size = hidden // heads
        step = size * max(1, math.ceil(96 / size))
        widths = sorted(set(range(step, hidden + 1, step)) | {hidden})
        return SearchSpace(layers=tuple(range(1, layers + 1)), heads=(), hidden=tuple(widths), ffn=ffn_choices,
                           head_size=size)
    head_choices = [a for a in range(1, heads + 1) if heads % a == 0 and 3 * a >= heads]
    lcm = math.lcm(*head_choices)
    step = lcm * max(1, math.ceil(96 / lcm))
    hidden_choices = list(range(step, hidden + 1, step))
    if hidden % lcm == 0 and hidden not in hidden_choices:
        hidden_choices.append(hidden)
    if not hidden_choices:  # a teacher narrower than one step: keep its own width
        hidden_choices = [hidden]
        head_choices = [heads]
    return SearchSpace(
        layers=tuple(range(1, layers + 1)),
        heads=tuple(head_choices),
        hidden=tuple(hidden_choices),
        ffn=tuple(ffn_choices),
    )


def parse_choices(value: Any, name: str) -> tuple[int, ...]:
    """Read one dimension: `6`, `"4,6,12"`, `"1-6"`, `"96-384:96"`, or a list of those."""
    if isinstance(value, bool):
        raise InputError(f"search space: {name}={value!r} is not a number, list or range")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, (list, tuple)):
        out: list[int] = []
        for item in value:
            out.extend(parse_choices(item, name))
        return tuple(out)
    text = str(value).strip()
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _RANGE_RE.match(part)
        if match:
            lo, hi, step = int(match[1]), int(match[2]), int(match[3] or 1)
            if lo > hi or step < 1:
                raise InputError(f"search space: {name} range {part!r} is empty (want LO-HI[:STEP], LO <= HI)")
            out.extend(range(lo, hi + 1, step))
        elif part.isdigit():
            out.append(int(part))
        else:
            raise InputError(
                f"search space: {name}={part!r} is not understood; use a number, a list `4,6,12` "
                "or a range `LO-HI[:STEP]`"
            )
    if not out:
        raise InputError(f"search space: {name}={value!r} has no value")
    return tuple(out)


def override_space(base: SearchSpace, overrides: Mapping[str, Any]) -> SearchSpace:
    """`base` with the given dimensions replaced (values as accepted by `parse_choices`)."""
    unknown = set(overrides) - set(DIMENSIONS)
    if unknown:
        raise InputError(
            f"search space: unknown key(s) {sorted(unknown)}; allowed: {', '.join(DIMENSIONS)}"
        )
    values = base.to_dict()
    for name, value in overrides.items():
        if value is not None:
            values[name] = list(parse_choices(value, name))
    # Choosing the head counts frees them; otherwise a fixed head size stays and heads follow hidden.
    head_size = None if overrides.get("heads") is not None else base.head_size
    return SearchSpace(**{name: tuple(values[name]) for name in DIMENSIONS}, head_size=head_size)


def load_space_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or YAML file of space overrides (keys: layers, heads, hidden, ffn).

    A `[space]` table / `space:` mapping is used when present, so one file can hold more settings.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"space file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            raise InputError(f"space file {path}: use a .toml, .yaml or .yml file")
    except KdnasError:
        raise
    except Exception as err:  # a syntax error in the user's file
        raise InputError(f"space file {path} cannot be parsed: {first_line(err)}") from None
    if isinstance(data, dict) and isinstance(data.get("space"), dict):
        data = data["space"]
    if not isinstance(data, dict):
        raise InputError(f"space file {path}: expected a mapping with keys {', '.join(DIMENSIONS)}")
    return data


def _arithmetic_step(values: Sequence[int]) -> int | None:
    if len(values) < 2:
        return 1
    step = values[1] - values[0]
    if all(b - a == step for a, b in zip(values, values[1:])):
        return step
    return None


def _suggest(trial: Any, name: str, values: tuple[int, ...]) -> int:
    # An evenly spaced dimension is an ordered integer for the sampler (TPE models neighbours);
    # anything else is categorical.
    step = _arithmetic_step(values)
    if step is not None:
        return int(trial.suggest_int(name, values[0], values[-1], step=step))
    return int(trial.suggest_categorical(name, list(values)))
