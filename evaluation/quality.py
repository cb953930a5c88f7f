"""How close is a student's sentence embedding to the teacher's, and how useful is it?

The bundled teachers are sentence-embedding models: what a user keeps of them is a vector per
sentence, compared by cosine. So a student is measured on that vector, without training it:

* embedding fidelity — Spearman's ρ between the teacher's and the student's cosine similarities
  over random pairs of held-out sentences (`distill.data.heldout_sentences`: documents no transfer
  set ever contains), and the mean cosine between the two embeddings of the same sentence;
* linear probes (MTEB's classification protocol) — multinomial logistic regression on the frozen
  embeddings of a labeled task, trained on the full train split and on a few examples per class.

Neither trains the encoder (one forward pass per text, then a convex fit), so both are
deterministic and need no seeds over training runs.
Results are cached under `$KDNAS_CACHE/quality`: the held-out sentences' embeddings per weights
(so a teacher is embedded once for many students) and probe scores per (weights, task, protocol).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from core import assets
from distill.data import HELDOUT_EVERY
from core.errors import InputError
from .finetune import ModelRef, _gain_kept, load_encoder, pooled_features, resolve_device, resolve_model
from .tasks import Task

if TYPE_CHECKING:
    from distill.teachers import Teacher

MEASURES = ("fidelity", "probe", "finetune")
PROBE_MAX_ITER = 100  # MTEB: scikit-learn LogisticRegression(max_iter=100)
PROBE_C = 1.0  # scikit-learn's default inverse L2 strength
PROBE_TOL = 1e-4  # scikit-learn's default tol: L-BFGS stops when every gradient entry is below it
MIN_PAIRS = 100
MIN_SENTENCES = 4


@dataclass(frozen=True)
class QualityConfig:
    """The protocol of the fidelity and probe measures (max length and device are the fine-tuning ones)."""

    corpus: str = "news"  # held-out sentences for fidelity come from this corpus
    fidelity_sentences: int = 1000
    fidelity_pairs: int = 4000
    shots: int = 16  # examples per class in a few-shot probe
    draws: int = 10  # few-shot draws (the same for every model)
    seed: int = 0

    def __post_init__(self) -> None:
        limits = {"fidelity_sentences": MIN_SENTENCES, "fidelity_pairs": MIN_PAIRS, "shots": 1, "draws": 1}
        for name, low in limits.items():
            if getattr(self, name) < low:
                raise InputError(f"{name.replace('_', ' ')} {getattr(self, name)} is invalid: must be >= {low}")


def check_measures(measures: str | Sequence[str]) -> tuple[str, ...]:
    """The measures as a tuple in `MEASURES` order; an unknown name is a user error naming it."""
    names = [m.strip() for m in (measures.split(",") if isinstance(measures, str) else measures) if m.strip()]
    for name in names:
        if name not in MEASURES:
            raise InputError(f"measure {name!r} is unknown; allowed: {', '.join(MEASURES)}")
    if not names:
        raise InputError(f"no measure given; allowed: {', '.join(MEASURES)}")
    return tuple(m for m in MEASURES if m in names)


# --------------------------------------------------------------------------------------------
# embeddings


def sentence_embeddings(ref_or_model: ModelRef | str | tuple[nn.Module, object] | Teacher, texts: Sequence[str],
                        max_len: int = 128, batch_size: int = 64, device: str = "auto") -> torch.Tensor:
    """Sentence embeddings `[N, d]`: the masked mean of the last hidden states, fp32.

    e(x) = Σ_t m_t·h_t(x) / Σ_t m_t (m: attention mask), the pooling the bundled teachers were
    trained with, so it is the vector a user of the teacher compares. `ref_or_model`: a `ModelRef`,
    a bundled name or model folder, an `(encoder, tokenizer)` pair, or a loaded `Teacher`.
    Batches are sorted by length (see `evaluation.finetune.pooled_features`, the one implementation).
    """
    if isinstance(ref_or_model, str):
        ref_or_model = resolve_model(ref_or_model)
    elif hasattr(ref_or_model, "model") and hasattr(ref_or_model, "tokenizer"):
        ref_or_model = (ref_or_model.model, ref_or_model.tokenizer)
    return pooled_features(ref_or_model, list(texts), max_len, device=device, batch_size=batch_size)


def cached_embeddings(ref: ModelRef, texts: Sequence[str], *, max_len: int = 128, device: str = "auto",
                      cache: bool = True) -> torch.Tensor:
    """`sentence_embeddings`, stored per (weights fingerprint, texts, max length) under the cache."""
    key = {"kind": "sentence-embeddings", "model": ref.fingerprint, "texts": _digest(texts), "max_len": max_len}
    file = _cache_file(key, ".pt")
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


# --------------------------------------------------------------------------------------------
# linear probes


def probe(train_x: torch.Tensor, train_y: Sequence[int], test_x: torch.Tensor, test_y: Sequence[int],
          num_labels: int, *, seed: int = 0, max_iter: int = PROBE_MAX_ITER, c: float = PROBE_C) -> float:
    """Test accuracy of multinomial logistic regression on frozen embeddings (MTEB's classifier).

    Features are standardised with the train split's mean and (population) std, then W, b minimise
        (1/n) Σ_i CE(W·x_i + b, y_i) + ‖W‖² / (2·C·n)
    — scikit-learn's LogisticRegression(C=1, max_iter=100) objective (its sum form divided by C·n),
    bias unpenalised — by full-batch L-BFGS from zeros in float64: convex, so the answer depends
    on the data alone. `seed` is scikit-learn's `random_state`, which its L-BFGS solver ignores too.
    Standardising removes the scale of a student's features (often ~1 % spread around a mean
    vector), which would otherwise decide how far a fixed iteration cap gets.
    """
    x, z = train_x.double(), test_x.double()
    y, gold = torch.as_tensor(list(train_y), dtype=torch.long), torch.as_tensor(list(test_y), dtype=torch.long)
    if len(x) != len(y) or len(z) != len(gold) or not len(y) or not len(gold):
        raise ValueError("probe needs non-empty train and test sets with one label per row")
    mean, std = x.mean(0), x.std(0, correction=0)
    std = torch.where(std > 0, std, torch.ones_like(std))  # a constant feature is left as it is
    x, z = (x - mean) / std, (z - mean) / std
    w = torch.zeros(x.shape[1], num_labels, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_labels, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], lr=1, max_iter=max_iter, history_size=10, tolerance_grad=PROBE_TOL,
                                  tolerance_change=64 * torch.finfo(torch.float64).eps, line_search_fn="strong_wolfe")
    l2 = 1.0 / (2 * c * len(y))

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(x @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    with torch.no_grad():
        return float(((z @ w + b).argmax(-1) == gold).double().mean())


def few_shot_draws(labels: Sequence[int], shots: int, draws: int, seed: int = 0) -> list[list[int]]:
    """`draws` index lists, each with `shots` examples of every class (all of a smaller class).

    Draw d depends only on (labels, shots, seed, d): every model is probed on the same examples,
    and asking for more draws keeps the first ones.
    """
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(index)
    result = []
    for draw in range(draws):
        rng = random.Random(f"kdnas-few-shot:{seed}:{shots}:{draw}")
        chosen = [i for _, members in sorted(by_class.items()) for i in rng.sample(members, min(shots, len(members)))]
        result.append(sorted(chosen))
    return result


def probe_scores(ref: ModelRef | str, task: Task, *, shots: int = 16, draws: int = 10, seed: int = 0,
                 max_len: int = 128, device: str = "auto", cache: bool = True, full: bool = True) -> dict:
    """Probe accuracy on the task's full test split: trained on the full train split ("full") and
    over `draws` stratified draws of `shots` per class ("few_shot_mean" ± "few_shot_std", sample std).

    Each split is embedded once for both settings; the result is cached per (weights, task, protocol).
    `full=False` skips the full-split probe and embeds only the drawn training examples (a large
    train split costs most of the time).
    """
    ref = resolve_model(ref) if isinstance(ref, str) else ref
    setting = {"kind": "probe", "shots": shots, "draws": draws, "seed": seed, "max_len": max_len,
               "max_iter": PROBE_MAX_ITER, "C": PROBE_C, "standardize": True, "full": full}
    file = _cache_file({"model": ref.fingerprint, "task": _task_key(task), "protocol": setting}, ".json")
    if cache and (hit := _read_json(file)) is not None:
        return {**hit, "cached": True}
    start = time.perf_counter()
    encoder, tokenizer = load_encoder(ref)
    model = (encoder.to(resolve_device(device)), tokenizer)
    train_y, test_y = list(task.train.labels), list(task.test.labels)
    draws_index = few_shot_draws(train_y, shots, draws, seed)
    used = list(range(len(train_y))) if full else sorted({i for index in draws_index for i in index})
    row_of = {i: r for r, i in enumerate(used)}
    train_x = sentence_embeddings(model, [task.train.texts[i] for i in used], max_len)
    test_x = sentence_embeddings(model, task.test.texts, max_len)
    fit = lambda index: probe(train_x[[row_of[i] for i in index]], [train_y[i] for i in index],  # noqa: E731
                              test_x, test_y, task.num_labels, seed=seed)
    few = [fit(index) for index in draws_index]
    result = {"full": fit(used) if full else None, "few_shot_mean": statistics.fmean(few),
              "few_shot_std": statistics.stdev(few) if len(few) > 1 else 0.0, "few_shot": few,
              "majority": task.test.majority_accuracy(), "shots": shots, "draws": draws,
              "train_examples": len(train_y), "test_examples": len(test_y),
              "seconds": time.perf_counter() - start}
    if cache:
        _write_json(file, result)
    return {**result, "cached": False}


# --------------------------------------------------------------------------------------------
# the cache


def _digest(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def _task_key(task: Task) -> dict:
    """Name, source, sizes and a digest of the exact texts and labels (an edited file is re-scored)."""
    content = _digest([f"{s}|{y}|{x}" for s in ("train", "test") for x, y in
                       zip(task.split(s).texts, task.split(s).labels)])
    return {"name": task.name, "source": task.source, "sizes": task.sizes(), "labels": list(task.labels),
            "content": content}


def _cache_file(key: dict, suffix: str) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return assets.cache_root() / "quality" / f"{name}{suffix}"


def _read_json(file: Path) -> dict | None:
    try:
        return json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        return None  # an unreadable entry is recomputed


def _write_json(file: Path, value: dict) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(file)


# --------------------------------------------------------------------------------------------
# in the `kdnas evaluate` report


def heldout_for(config: QualityConfig) -> list[str]:
    """The fidelity sentences: a seeded sample of the corpus's held-out sentences."""
    from distill.data import heldout_sentences, load_corpus

    return heldout_sentences(load_corpus(config.corpus), config.fidelity_sentences, seed=config.seed)


def measure_model(ref: ModelRef, teacher: ModelRef | None, tasks: Sequence[Task], measures: Sequence[str],
                  config: QualityConfig, sentences: Sequence[str] | None, *, max_len: int = 128,
                  device: str = "auto", cache: bool = True) -> dict:
    """The `fidelity` (against `teacher`) and `probes` entries of one model's report row."""
    out: dict = {}
    if "fidelity" in measures:
        if teacher is None or sentences is None:
            raise InputError("the fidelity measure compares a model with a teacher: give a teacher, "
                             "or leave fidelity out of the measures")
        out["fidelity"] = fidelity_scores(teacher, ref, sentences, pairs=config.fidelity_pairs, seed=config.seed,
                                          max_len=max_len, device=device, cache=cache)
    if "probe" in measures:
        out["probes"] = {t.name: probe_scores(ref, t, shots=config.shots, draws=config.draws, seed=config.seed,
                                              max_len=max_len, device=device, cache=cache) for t in tasks}
    return out


def relative_quality(entry: dict, reference: dict) -> dict:
    """Probe gain kept per task and averaged: 100·(student − majority)/(teacher − majority).

    Raw accuracy flatters a model that only finds the majority class; the share of the teacher's
    gain over that baseline does not. `probe_gain_kept` uses the full-split probe,
    `probe_few_shot_gain_kept` the few-shot mean.
    """
    if "probes" not in entry or "probes" not in reference:
        return {}
    out = {}
    for key, score in (("probe_gain_kept", "full"), ("probe_few_shot_gain_kept", "few_shot_mean")):
        gains = {name: _gain_kept(p[score], reference["probes"][name][score], p["majority"])
                 for name, p in entry["probes"].items()}
        gains["average"] = sum(gains.values()) / len(entry["probes"])
        out[key] = gains
    return out


def protocol(measures: Sequence[str], config: QualityConfig, sentences: Sequence[str] | None) -> dict:
    """The report's protocol entries for the measures taken."""
    out: dict = {"measures": list(measures)}
    if "fidelity" in measures and sentences is not None:
        out["fidelity"] = {"corpus": config.corpus, "sentences": len(sentences), "pairs": config.fidelity_pairs,
                           "seed": config.seed, "heldout": f"one corpus document in {HELDOUT_EVERY}, never in a transfer set"}
    if "probe" in measures:
        out["probe"] = {"shots": config.shots, "draws": config.draws, "seed": config.seed,
                        "classifier": f"logistic regression, L2 C={PROBE_C}, L-BFGS max {PROBE_MAX_ITER} iterations, "
                                      "standardised features", "splits": "full train (or few-shot draws) / full test"}
    return out


def table_parts(report: dict) -> tuple[list[str], list[list[str]], list[str], str]:
    """Head, one list of cells per model row, the majority row and a footer for the quality columns."""
    measures, tasks, models = report["protocol"].get("measures", []), list(report["tasks"]), report["models"]
    head: list[str] = []
    rows: list[list[str]] = [[] for _ in models]
    majority: list[str] = []
    notes = []
    if "fidelity" in measures:
        head += ["fidelity ρ", "mean cos"]
        majority += ["", ""]
        for cells, row in zip(rows, models):
            f = row["fidelity"]
            cells += [f"{f['spearman']:.3f}", f"{f['mean_cosine']:.3f}{'' if f['cosine_via'] == 'identity' else '*'}"]
        p = report["protocol"]["fidelity"]
        notes.append(f"fidelity ρ = Spearman of teacher vs student cosine similarities over {models[0]['fidelity']['pairs']} "
                     f"pairs of {p['sentences']} held-out {p['corpus']} sentences; mean cos = teacher vs student "
                     "embedding of the same sentence (* through a least-squares projection fitted on half of them)")
    if "probe" in measures:
        p = report["protocol"]["probe"]
        head += [f"{t} probe" for t in tasks] + [f"{t} {p['shots']}-shot" for t in tasks] + ["probe gain kept"]
        majority += [f"{100 * models[0]['probes'][t]['majority']:.1f}" for t in tasks] * 2 + [""]
        for cells, row in zip(rows, models):
            probes, gain = row["probes"], row.get("probe_gain_kept", {}).get("average")
            cells += [f"{100 * probes[t]['full']:.1f}" for t in tasks]
            cells += [f"{100 * probes[t]['few_shot_mean']:.1f} ± {100 * probes[t]['few_shot_std']:.1f}" for t in tasks]
            cells.append(f"{gain + 0.0:.1f}%" if gain is not None else "-")
        notes.append(f"probe = logistic regression on frozen embeddings, accuracy % on the full test split, trained "
                     f"on the full train split / on {p['shots']} per class (mean ± std over {p['draws']} draws); "
                     "probe gain kept from the full-split probe")
    return head, rows, majority, "; ".join(notes)
