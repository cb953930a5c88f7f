"""PyTorch vs onnxruntime on real tokenized sentences, padded batches of several lengths.

Padded positions are excluded from max-abs: their hidden states are never used (pooling masks
them) and fused attention is free to compute them differently.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Real sentences of very different lengths, so each batch carries heavy padding.
SENTENCES = (
    "Stocks fell.",
    "The central bank left interest rates unchanged on Thursday.",
    "A storm knocked out power to thousands of homes along the coast overnight.",
    "Researchers said the new vaccine was safe and produced a strong immune response in adults.",
    "Is it raining in Berlin?",
    "The company, which employs about 4,000 people worldwide, reported a third-quarter loss after "
    "sales of its flagship phone fell short of analysts' expectations and costs rose sharply.",
    "Fans waited for hours in the cold to buy tickets for the final concert of the tour.",
    "After weeks of negotiations, lawmakers agreed on a budget that raises spending on schools, "
    "roads and hospitals while cutting taxes for small businesses, although critics said the deal "
    "leaves the deficit largely untouched and postpones hard choices to next year.",
)
# Batches of different sizes and padded lengths: this also exercises the dynamic axes.
BATCHES = ((0, 1, 2, 3), (4, 5), (6, 7, 0))

FP32_MAX_ABS = 1e-4
# INT8 warns when the MEAN cosine of its sentence embeddings to fp32 falls under this. The mean, not
# the minimum: the minimum falls as the check set grows (MiniLM-L6: 0.988 over these 8 sentences,
# 0.982 over 256 news sentences, both with mean 0.992-0.993), so a threshold on it means nothing
# without the set size. The minimum is still reported beside it.
INT8_MEAN_COSINE = 0.99


@dataclass(frozen=True)
class Parity:
    """How close onnxruntime is to PyTorch. `cosine` is the minimum over the sentences."""

    max_abs: float
    cosine: float
    tolerance: float
    sentences: int
    lengths: tuple[int, ...]

    @property
    def passed(self) -> bool:
        return self.max_abs <= self.tolerance

    def to_dict(self) -> dict:
        return {
            "max_abs": self.max_abs, "min_cosine": self.cosine, "tolerance": self.tolerance,
            "passed": self.passed, "sentences": self.sentences, "token_lengths": list(self.lengths),
        }


def tokenized_batches(tokenizer, input_names: tuple[str, ...], max_length: int = 256) -> list[dict[str, np.ndarray]]:
    batches = []
    for idx in BATCHES:
        enc = tokenizer([SENTENCES[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                        return_tensors="np")
        batches.append(graph_feed(enc, input_names))
    return batches


def graph_feed(encoding: Mapping[str, Any], input_names: Collection[str]) -> dict[str, np.ndarray]:
    """The int64 inputs a graph with `input_names` takes, from a tokenizer's `encoding`. Segment ids a graph
    takes but the tokenizer does not make (a BERT under an MPNet-style tokenizer, such as a student kdnas
    wrote before it gave those one segment) are zeros, as BertModel makes them when none are given."""
    feed = {"input_ids": np.asarray(encoding["input_ids"], dtype=np.int64),
            "attention_mask": np.asarray(encoding["attention_mask"], dtype=np.int64)}
    if "token_type_ids" in input_names:
        segments = encoding.get("token_type_ids")
        feed["token_type_ids"] = (np.zeros_like(feed["input_ids"]) if segments is None
                                  else np.asarray(segments, dtype=np.int64))
    return feed


def compare(reference: list[tuple], candidate: list[tuple], batches: list[dict], tolerance: float) -> Parity:
    """Max-abs over unpadded hidden states, min cosine over sentence embeddings."""
    max_abs, cosines, lengths = 0.0, [], []
    for (ref_h, ref_e), (cand_h, cand_e), batch in zip(reference, candidate, batches):
        keep = batch["attention_mask"].astype(bool)
        max_abs = max(max_abs, float(np.abs(ref_h[keep] - cand_h[keep]).max()))
        cosines.extend(_cosine(ref_e, cand_e).tolist())
        lengths.extend(int(n) for n in keep.sum(1))
    return Parity(max_abs, float(min(cosines)), tolerance, len(cosines), tuple(lengths))


def onnx_sentence_embeddings(path: str | Path, tokenizer, texts: Sequence[str], *, max_len: int = 128,
                             batch_size: int = 32) -> np.ndarray:
    """[len(texts), hidden]: the `sentence_embedding` output of an exported graph (model.onnx or
    model.int8.onnx) for `texts`, tokenized by `tokenizer` and cut to `max_len` tokens, in padded
    batches — what a user who deploys the graph gets."""
    batches = [dict(tokenizer(list(texts[i:i + batch_size]), padding=True, truncation=True, max_length=max_len,
                              return_tensors="np")) for i in range(0, len(texts), batch_size)]
    return np.concatenate([outputs[1] for outputs in run_onnx(str(path), batches)])


def run_onnx(path: str, batches: list[dict]) -> list[tuple]:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return [tuple(session.run(None, graph_feed(batch, names))) for batch in batches]


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
