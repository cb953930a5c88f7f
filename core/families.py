"""The model families a student is built in: the teacher's own class at smaller dimensions.

A student of an MPNet teacher is an `MPNetModel` (its relative position bias included), a student of a
RoBERTa teacher a `RobertaModel`, and so on, so inheritance at the teacher's full shape is the teacher
itself and the shipped folder loads as the teacher's family does. Every family here keeps BERT's layer
layout (Q/K/V, output, FFN, two LayerNorms per layer); a teacher of any other family (DistilBERT,
DeBERTa, ...) gets a BERT student, from `--init svd` or `random`, where its tokenizer allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError


@dataclass(frozen=True)
class Family:
    """How one transformers model family is built from a shape."""

    model_type: str
    config_class: str  # in transformers
    model_class: str
    offset_positions: bool  # positions start at pad_token_id + 1 (RoBERTa, MPNet): the table is that much longer
    token_types: bool  # has a segment embedding
    shared_position_bias: bool = False  # one relative position bias for every layer (MPNet)


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("bert", "BertConfig", "BertModel", False, True),
    Family("mpnet", "MPNetConfig", "MPNetModel", True, False, shared_position_bias=True),
    Family("roberta", "RobertaConfig", "RobertaModel", True, True),
    Family("xlm-roberta", "XLMRobertaConfig", "XLMRobertaModel", True, True),
    Family("camembert", "CamembertConfig", "CamembertModel", True, True),
    Family("electra", "ElectraConfig", "ElectraModel", False, True),
)}
# The family a student falls back to where the teacher's has no student class (built by svd or random init).
FALLBACK = "bert"


def families_help() -> str:
    """The families, as `--help` and the docs name them."""
    return (f"students are built in the teacher's own family: {', '.join(FAMILIES)}; a teacher of another family "
            "(e.g. DistilBERT) gets a BERT student with --init svd or random")


def family(model_type: str) -> Family:
    """The student family of `model_type`, or one line naming it and the supported ones."""
    if model_type not in FAMILIES:
        raise InputError(f"model type {model_type!r} has no student family; supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def student_family(model_type: str) -> str:
    """The family a teacher of `model_type` gets students in: its own where supported, else BERT."""
    return model_type if model_type in FAMILIES else FALLBACK
