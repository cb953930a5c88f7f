"""Student architecture specs: frozen, validated, buildable.

An architecture is written `layers x heads x hidden x ffn` (e.g. `4x12x192x768`). The vocabulary,
position and segment sizes come from the teacher's tokenizer/config so the student can reuse the
teacher's tokenizer unchanged, and so does its family: a student is the teacher's own model class
(core.families), an MPNet for an MPNet teacher, a BERT for a BERT one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .errors import InputError
from .families import FAMILIES, family as _family

# MPNet's relative position buckets (transformers' default, every released MPNet's value).
_MPNET_BUCKETS = 32
_ARCH_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*[xX×]\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass(frozen=True)
class StudentSpec:
    """An encoder shape in one model family (core.families). Validated on construction."""

    layers: int
    heads: int
    hidden: int
    ffn: int
    vocab_size: int = 30522
    max_position: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    family: str = "bert"  # the transformers model_type the student is built as

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise InputError(f"student family {self.family!r} is invalid; supported: {', '.join(FAMILIES)}")
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

    @property
    def position_table(self) -> int:
        """Rows of the position embedding: the usable positions, plus the padding offset of RoBERTa-style
        families (their positions start at pad_token_id + 1)."""
        offset = self.pad_token_id + 1 if _family(self.family).offset_positions else 0
        return self.max_position + offset

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count of the model this spec builds (pooler included), without building it."""
        h, f, fam = self.hidden, self.ffn, _family(self.family)
        per_layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
        segments = self.type_vocab_size if fam.token_types else 0
        emb = (self.vocab_size + self.position_table + segments) * h + 2 * h
        pooler = 0 if self.family == "electra" else h * h + h
        bias = _MPNET_BUCKETS * self.heads if fam.shared_position_bias else 0
        return self.layers * per_layer + pooler + bias + (emb if include_embeddings else 0)

    def flops(self, seq_len: int = 128) -> int:
        """Multiply-accumulate-based FLOPs (2 per MAC) of one forward pass on one sequence."""
        h, f, s = self.hidden, self.ffn, seq_len
        per_layer = 2 * s * (4 * h * h + 2 * h * f) + 2 * 2 * s * s * h
        return self.layers * per_layer

    def to_config(self, **extra):
        """A transformers config of the spec's family with eager attention (so attention can be exported/fused).
        `extra` overrides or adds fields (an inherited student takes its teacher's eps and activation)."""
        import transformers

        fam = _family(self.family)
        fields = dict(vocab_size=self.vocab_size, hidden_size=self.hidden, num_hidden_layers=self.layers,
                      num_attention_heads=self.heads, intermediate_size=self.ffn,
                      max_position_embeddings=self.position_table, pad_token_id=self.pad_token_id,
                      hidden_act="gelu", attn_implementation="eager")
        if fam.token_types:
            fields["type_vocab_size"] = self.type_vocab_size
        if self.family == "electra":
            fields["embedding_size"] = self.hidden  # no projection between the embeddings and the layers
        return getattr(transformers, fam.config_class)(**{**fields, **extra})


def parse_arch(text: str, **sizes: int | str) -> StudentSpec:
    """Parse `LxAxHxF` (layers x heads x hidden x ffn) into a validated spec."""
    match = _ARCH_RE.match(str(text))
    if not match:
        raise InputError(
            f"architecture {text!r} is not of the form LAYERSxHEADSxHIDDENxFFN, e.g. 4x12x192x768"
        )
    layers, heads, hidden, ffn = (int(g) for g in match.groups())
    return StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **sizes)


def build_student(spec: StudentSpec, seed: int | None = 0, *, mlm: bool = False, **extra):
    """A freshly initialised model of this shape in its family (eager attention): the encoder with its
    pooler, or with `mlm` the family's masked-LM model. `extra`: config fields (StudentSpec.to_config)."""
    import torch
    import transformers

    if seed is not None:
        torch.manual_seed(seed)
    config = spec.to_config(**extra)
    if mlm:
        return transformers.AutoModelForMaskedLM.from_config(config)
    return getattr(transformers, _family(spec.family).model_class)(config)


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]
