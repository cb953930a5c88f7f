"""What a model exposes to a distillation loss, and what a method asks for.

Teacher and student are read the same way: hidden states `H_0..H_L` and, per layer, the
query/key/value projections before the head split (docs/methods.md, Notation). A method states what it
needs (`Needs`) so the teacher cache stores only that, and the student hooks capture only that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ModelDims:
    """The shape facts a loss needs about one side (teacher or student)."""

    layers: int
    hidden: int
    heads: int
    ffn: int = 0


@dataclass(frozen=True)
class Needs:
    """Which activations a method reads. Layers are 1-based; hidden layer 0 is the embedding output."""

    hidden: frozenset[int] = frozenset()
    qkv: frozenset[int] = frozenset()
    logits: bool = False

    def __or__(self, other: "Needs") -> "Needs":
        return Needs(self.hidden | other.hidden, self.qkv | other.qkv, self.logits or other.logits)

    def key(self) -> str:
        """A stable text key, used in cache file names."""
        h = ",".join(map(str, sorted(self.hidden)))
        q = ",".join(map(str, sorted(self.qkv)))
        return f"h[{h}]-qkv[{q}]-logits[{int(self.logits)}]"


@dataclass
class Activations:
    """Activations of one batch. Missing entries were not requested.

    hidden: layer index (0..L) -> [batch, seq, d]
    query/key/value: layer index (1..L) -> [batch, seq, d], all heads concatenated
    logits: masked-LM logits [batch, seq, vocab] when the method needs them (OD)
    """

    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    query: dict[int, torch.Tensor] = field(default_factory=dict)
    key: dict[int, torch.Tensor] = field(default_factory=dict)
    value: dict[int, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "Activations":
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype)

        return Activations(
            hidden={i: move(t) for i, t in self.hidden.items()},
            query={i: move(t) for i, t in self.query.items()},
            key={i: move(t) for i, t in self.key.items()},
            value={i: move(t) for i, t in self.value.items()},
            logits=None if self.logits is None else move(self.logits),
        )
