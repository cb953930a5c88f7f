"""Embedding fidelity: how faithfully a student's sentence embedding reproduces the teacher's.

Spearman's ρ between the teacher's and the student's cosine similarities over random pairs of
held-out sentences (`distill.data.heldout_sentences`: documents no transfer set ever contains), and
the mean cosine between the two embeddings of the same sentence. No training: one forward pass per
sentence, so the measure is deterministic. Each model's embeddings of the held-out sentences are
cached under `$KDNAS_CACHE/quality`, so a teacher is embedded once for many students.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence

import torch
from torch import nn

from kdnas.core.errors import InputError
from ._cache import cache_file, digest
from .models import ModelRef, sentence_embeddings

MIN_PAIRS = 100
MIN_SENTENCES = 4


def cached_embeddings(ref: ModelRef, texts: Sequence[str], *, max_len: int = 128, device: str = "auto",
                      cache: bool = True) -> torch.Tensor:
    """`sentence_embeddings`, stored per (weights fingerprint, texts, max length) under the cache."""
    key = {"kind": "sentence-embeddings", "model": ref.fingerprint, "texts": digest(texts), "max_len": max_len}
    file = cache_file("quality", key, ".pt")
    if cache and file.is_file():
        try:
            stored = torch.load(file, weights_only=True)
            if isinstance(stored, torch.Tensor) and stored.shape[0] == len(texts):
                return stored
        except (OSError, RuntimeError, ValueError):
            pass  # an unreadable entry is recomputed
    embeddings = sentence_embeddings(ref, texts, max_len, device=device)
    if cache:
        file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(embeddings, file.with_suffix(".tmp"))
        file.with_suffix(".tmp").replace(file)
    return embeddings


# --------------------------------------------------------------------------------------------
# rank correlation


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks; tied values share the mean of the ranks they span ([10, 20, 20, 30] -> [1, 2.5, 2.5, 4])."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    order = torch.argsort(v, stable=True)
    _, counts = torch.unique_consecutive(v[order], return_counts=True)
    last = counts.cumsum(0)  # rank of the last member of each group of equal values
    ranks = torch.empty_like(v)
    ranks[order] = ((2 * last - counts + 1) / 2).to(torch.float64).repeat_interleave(counts)
    return ranks


def spearman(x: Sequence[float] | torch.Tensor, y: Sequence[float] | torch.Tensor) -> float:
    """Spearman's ρ: the Pearson correlation of the average ranks (ties as scipy's spearmanr).

    ρ = Σ (r_i − r̄)(q_i − q̄) / √(Σ (r_i − r̄)² · Σ (q_i − q̄)²). Ranks make ρ blind to any
    monotone distortion of either side, so a student whose cosines are compressed or shifted still
    scores 1 when it orders pairs as the teacher does. nan when a side is constant or not finite.
    """
    x, y = torch.as_tensor(x, dtype=torch.float64).flatten(), torch.as_tensor(y, dtype=torch.float64).flatten()
    if x.shape != y.shape or len(x) < 2:
        raise ValueError(f"spearman needs two sequences of equal length >= 2, got {len(x)} and {len(y)}")
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return float("nan")
    r, q = average_ranks(x), average_ranks(y)
    r, q = r - r.mean(), q - q.mean()
    denominator = torch.sqrt((r @ r) * (q @ q))  # one square root: identical inputs give exactly 1.0
    return float((r @ q) / denominator) if denominator > 0 else float("nan")


# --------------------------------------------------------------------------------------------
# embedding fidelity


def sample_pairs(n: int, pairs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`pairs` distinct unordered pairs (i, k), i < k, uniformly among the n(n−1)/2 (all when fewer), seeded.

    Pair number t = k(k−1)/2 + i enumerates them; k = ⌊(1 + √(8t+1)) / 2⌋ inverts it exactly
    with an integer square root, so no list of all pairs is built.
    """
    total = n * (n - 1) // 2
    chosen = range(total) if pairs >= total else random.Random(f"kdnas-pairs:{seed}").sample(range(total), pairs)
    second = [(1 + math.isqrt(8 * t + 1)) // 2 for t in chosen]
    first = [t - k * (k - 1) // 2 for t, k in zip(chosen, second)]
    return torch.tensor(first, dtype=torch.long), torch.tensor(second, dtype=torch.long)


def embedding_fidelity(teacher_emb: torch.Tensor, student_emb: torch.Tensor, *, pairs: int = 4000,
                       seed: int = 0) -> dict:
    """How faithfully the student's embedding of the same sentences reproduces the teacher's.

    spearman = ρ( cos(t_i, t_k), cos(s_i, s_k) ) over random pairs i ≠ k: a sentence embedding is
    used through its similarities (search, clustering, deduplication), so a faithful student
    orders pairs as the teacher does; it needs no shared width. mean_cosine = mean_j cos(t_j, P s_j):
    whether the vectors themselves point the same way (a drop-in for an index built with the
    teacher). P is the identity when the widths match ("cosine_via": "identity"); otherwise a
    least-squares affine map student -> teacher fitted on the first half of the sentences and
    scored on the second, so a wide student cannot score by fitting noise ("fitted projection").
    """
    n = teacher_emb.shape[0]
    if student_emb.shape[0] != n or teacher_emb.ndim != 2 or student_emb.ndim != 2:
        raise ValueError(f"embeddings of the same sentences are needed: {tuple(teacher_emb.shape)} vs "
                         f"{tuple(student_emb.shape)}")
    if n < MIN_SENTENCES:
        raise InputError(f"embedding fidelity needs at least {MIN_SENTENCES} sentences, got {n}")
    t, s = teacher_emb.double(), student_emb.double()
    i, k = sample_pairs(n, pairs, seed)
    tn, sn = nn.functional.normalize(t, dim=-1), nn.functional.normalize(s, dim=-1)
    t_cos, s_cos = (tn[i] * tn[k]).sum(-1), (sn[i] * sn[k]).sum(-1)
    rho = spearman(t_cos, s_cos)
    if t.shape[1] == s.shape[1]:
        cosine, via, scored = float((tn * sn).sum(-1).mean()), "identity", n
    else:
        cosine, scored = _projected_cosine(t, s)
        via = "fitted projection"
    return {"spearman": rho, "spearman_se": _jackknife_se(t_cos, s_cos, i, k, n), "mean_cosine": cosine,
            "cosine_via": via, "pairs": len(i), "sentences": n, "cosine_sentences": scored}


def _jackknife_se(t_cos: torch.Tensor, s_cos: torch.Tensor, i: torch.Tensor, k: torch.Tensor, n: int,
                  groups: int = 10) -> float:
    """Standard error of ρ by the delete-a-group jackknife over sentences: pairs share sentences, so
    they are not independent draws, and leaving out every pair of one sentence group at a time
    respects that. SE² = (G−1)/G · Σ_g (ρ_(g) − ρ̄)²."""
    group = torch.arange(n) % groups
    estimates = []
    for g in range(groups):
        keep = (group[i] != g) & (group[k] != g)
        if int(keep.sum()) >= 2:
            estimates.append(spearman(t_cos[keep], s_cos[keep]))
    if len(estimates) < 2:
        return float("nan")
    mean = sum(estimates) / len(estimates)
    return math.sqrt((len(estimates) - 1) / len(estimates) * sum((e - mean) ** 2 for e in estimates))


def _projected_cosine(t: torch.Tensor, s: torch.Tensor) -> tuple[float, int]:
    """mean cos(t_j, [s_j, 1]·W) on the second half, W = argmin ‖[S, 1]·W − T‖² on the first half."""
    half = t.shape[0] // 2
    design = torch.cat([s, torch.ones(len(s), 1, dtype=s.dtype)], dim=1)
    weights = torch.linalg.lstsq(design[:half], t[:half], driver="gelsd").solution
    predicted = design[half:] @ weights
    return float(nn.functional.cosine_similarity(predicted, t[half:], dim=-1).mean()), t.shape[0] - half


def fidelity_scores(teacher: ModelRef, student: ModelRef, sentences: Sequence[str], *, pairs: int = 4000,
                    seed: int = 0, max_len: int = 128, device: str = "auto", cache: bool = True) -> dict:
    """`embedding_fidelity` of two models on `sentences` (each model's embeddings cached once)."""
    start = time.perf_counter()
    t = cached_embeddings(teacher, sentences, max_len=max_len, device=device, cache=cache)
    s = cached_embeddings(student, sentences, max_len=max_len, device=device, cache=cache)
    return {**embedding_fidelity(t, s, pairs=pairs, seed=seed), "seconds": time.perf_counter() - start}

