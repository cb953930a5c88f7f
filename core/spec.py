"""Student architecture specs: frozen, validated, buildable.

An architecture is written `layers x heads x hidden x ffn` (e.g. `4x12x192x768`). The vocabulary,
position and segment sizes come from the teacher's tokenizer/config so the student can reuse the
teacher's tokenizer unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .errors import InputError

_ARCH_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*[xX×]\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass(frozen=True)
class StudentSpec:
    """A BERT encoder shape. Validated on construction."""

    layers: int
    heads: int
    hidden: int
    ffn: int
    vocab_size: int = 30522
    max_position: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "hidden", "ffn", "vocab_size", "max_position", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"architecture {name}={value!r} is invalid: must be a positive integer")
        if self.hidden % self.heads:
            raise InputError(
                f"architecture {self.arch}: hidden={self.hidden} is not divisible by heads={self.heads}; "
                f"allowed heads for hidden {self.hidden}: {_divisors(self.hidden, limit=64)}"
            )

    @property
    def arch(self) -> str:
        return f"{self.layers}x{self.heads}x{self.hidden}x{self.ffn}"

    def replace(self, **changes: int) -> "StudentSpec":
        return dataclasses.replace(self, **changes)

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count of the BertModel this spec builds (pooler included), without building it."""
        h, f = self.hidden, self.ffn
        per_layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
        emb = (self.vocab_size + self.max_position + self.type_vocab_size) * h + 2 * h
        pooler = h * h + h
        return self.layers * per_layer + pooler + (emb if include_embeddings else 0)

    def flops(self, seq_len: int = 128) -> int:
        """Multiply-accumulate-based FLOPs (2 per MAC) of one forward pass on one sequence."""
        h, f, s = self.hidden, self.ffn, seq_len
        per_layer = 2 * s * (4 * h * h + 2 * h * f) + 2 * 2 * s * s * h
        return self.layers * per_layer

    def to_config(self, **extra):
        """A transformers BertConfig with eager attention (so attention can be exported/fused)."""
        from transformers import BertConfig

        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            intermediate_size=self.ffn,
            max_position_embeddings=self.max_position,
            type_vocab_size=self.type_vocab_size,
            pad_token_id=self.pad_token_id,
            hidden_act="gelu",
            attn_implementation="eager",
            **extra,
        )


def parse_arch(text: str, **sizes: int) -> StudentSpec:
    """Parse `LxAxHxF` (layers x heads x hidden x ffn) into a validated spec."""
    match = _ARCH_RE.match(str(text))
    if not match:
        raise InputError(
            f"architecture {text!r} is not of the form LAYERSxHEADSxHIDDENxFFN, e.g. 4x12x192x768"
        )
    layers, heads, hidden, ffn = (int(g) for g in match.groups())
    return StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **sizes)


def build_student(spec: StudentSpec, seed: int | None = 0):
    """A freshly initialised `BertModel` of this shape (eager attention)."""
    import torch
    from transformers import BertModel

    if seed is not None:
        torch.manual_seed(seed)
    return BertModel(spec.to_config())


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]
