"""The models an evaluation reads: a checked reference to a model folder, its encoder and tokenizer,
and its sentence embedding (the masked mean of the last hidden states).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from kdnas.core import assets
from kdnas.core.errors import InputError, first_line
from kdnas.core.quiet import wait_while_measuring
from kdnas.distill.data import pad_rows
from kdnas.distill.losses import mean_pool
from kdnas.distill.trainer import resolve_device  # one device rule for training and evaluation

if TYPE_CHECKING:
    from kdnas.distill.teachers import Teacher

_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "spiece.model", "vocab.json")


@dataclass(frozen=True)
class ModelRef:
    """A model to evaluate: what the user typed, its local folder, and a weights fingerprint."""

    name: str
    path: str
    fingerprint: str


def yardstick_precision(device: torch.device) -> str:
    """The precision evaluation trains and infers in: bf16 on CUDA, fp32 on every CPU — a score
    measured on a CPU with native bf16 (where distillation uses it) means the same as one measured
    on a CPU without it."""
    return "bf16" if device.type == "cuda" else "fp32"


def resolve_model(name_or_path: str, what: str = "model") -> ModelRef:
    """A bundled teacher name or an HF folder (e.g. `runs/demo/best`), checked before any training;
    `what` names it in a one-line error ("model", "--teacher")."""
    path = Path(assets.teacher_path(name_or_path, what))
    if not path.is_dir():
        raise InputError(f"{what} {name_or_path!r}: evaluation needs a local model folder or a bundled teacher name")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise InputError(
            f"model folder {str(path)!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save the "
            "teacher's tokenizer beside the weights (kdnas distill and kdnas search do this)"
        )
    return ModelRef(name=name_or_path, path=str(path), fingerprint=_weights_fingerprint(path))


def _weights_fingerprint(folder: Path) -> str:
    """sha256 over config and weight files: a retrained student never reuses an old score."""
    digest = hashlib.sha256()
    files = [folder / "config.json", *sorted(folder.glob("*.safetensors")), *sorted(folder.glob("*.bin"))]
    for file in files:
        if file.is_file():
            digest.update(file.name.encode())
            digest.update(assets.sha256_file(file).encode())
    return digest.hexdigest()[:16]


def load_encoder(ref: ModelRef) -> tuple[nn.Module, object]:
    """The encoder (no task head) and tokenizer of a model folder."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref.path)
    except (OSError, ValueError) as err:
        raise InputError(f"model folder {ref.path!r}: tokenizer could not be loaded: {first_line(err)}") from None
    try:
        encoder = AutoModel.from_pretrained(ref.path)
    except (OSError, ValueError) as err:
        raise InputError(f"model folder {ref.path!r} could not be loaded: {first_line(err)}") from None
    return encoder, tokenizer



def encode(tokenizer, texts, max_len: int) -> list[list[int]]:
    return tokenizer(list(texts), truncation=True, max_length=max_len, verbose=False)["input_ids"]



def count_parameters(ref: ModelRef) -> int:
    """Encoder parameters, from the config (no weights loaded)."""
    from transformers import AutoConfig

    from kdnas.core.families import student_family
    from kdnas.core.sentence import usable_positions
    from kdnas.core.spec import StudentSpec

    c = AutoConfig.from_pretrained(ref.path)
    spec = StudentSpec(layers=c.num_hidden_layers, heads=c.num_attention_heads, hidden=c.hidden_size,
                       ffn=c.intermediate_size, vocab_size=c.vocab_size, max_position=usable_positions(c.to_dict()),
                       type_vocab_size=max(1, getattr(c, "type_vocab_size", 1) or 1),
                       pad_token_id=int(c.pad_token_id or 0), family=student_family(c.model_type))
    return spec.num_parameters()


@torch.inference_mode()
def sentence_embeddings(ref_or_model: ModelRef | str | tuple[nn.Module, object] | Teacher, texts: Sequence[str],
                        max_len: int = 128, batch_size: int = 64, device: str = "auto") -> torch.Tensor:
    """Sentence embeddings `[N, d]`: the masked mean of the last hidden states, fp32, in the order of `texts`.

    e(x) = Σ_t m_t·h_t(x) / Σ_t m_t (m: attention mask), the pooling the bundled teachers were
    trained with, so it is the vector a user of the teacher compares. `ref_or_model`: a `ModelRef`
    or a bundled name or model folder (loaded onto `device`), or an `(encoder, tokenizer)` pair or a
    loaded `Teacher` already in memory (used on its own device; a task model such as *ForMaskedLM
    is read through its encoder). Texts are batched by token length, so a batch of short sentences
    costs short compute.
    """
    from kdnas.distill.teachers import base_model

    if isinstance(ref_or_model, str):
        ref_or_model = resolve_model(ref_or_model)
    if isinstance(ref_or_model, ModelRef):
        encoder, tokenizer = load_encoder(ref_or_model)
        encoder.to(resolve_device(device))
    elif hasattr(ref_or_model, "model") and hasattr(ref_or_model, "tokenizer"):
        encoder, tokenizer = base_model(ref_or_model.model), ref_or_model.tokenizer
    else:
        encoder, tokenizer = ref_or_model
        encoder = base_model(encoder)
    was_training = encoder.training
    encoder.eval()
    on = next(encoder.parameters()).device
    rows = encode(tokenizer, texts, max_len)
    pad_id = int(tokenizer.pad_token_id or 0)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = torch.empty(len(rows), encoder.config.hidden_size)
    for start in range(0, len(order), batch_size):
        wait_while_measuring()  # a latency measurement on cores this pass shares (core.quiet)
        chunk = order[start : start + batch_size]
        ids, mask = pad_rows([rows[i] for i in chunk], pad_id)
        states = encoder(input_ids=ids.to(on), attention_mask=mask.to(on), return_dict=True).last_hidden_state
        out[chunk] = mean_pool(states.float(), mask.to(on)).cpu()
    encoder.train(was_training)
    return out
