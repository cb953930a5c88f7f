"""Linear probes (MTEB's classification protocol): multinomial logistic regression on the frozen
sentence embeddings of a labelled task, trained on the full train split and on a few examples per
class. The encoder is not trained (one forward pass per text, then a convex fit), so the scores are
deterministic; they are cached per (weights, task, protocol) under `$KDNAS_CACHE/quality`.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn

from ._cache import cache_file, read_json, task_key, write_json
from .compare import outcome_string
from .models import ModelRef, load_encoder, resolve_device, resolve_model, sentence_embeddings
from .tasks import Task

PROBE_MAX_ITER = 100  # MTEB: scikit-learn LogisticRegression(max_iter=100)
PROBE_C = 1.0  # scikit-learn's default inverse L2 strength
PROBE_TOL = 1e-4  # scikit-learn's default tol: L-BFGS stops when every gradient entry is below it


def probe(train_x: torch.Tensor, train_y: Sequence[int], test_x: torch.Tensor, test_y: Sequence[int],
          num_labels: int, *, seed: int = 0, max_iter: int = PROBE_MAX_ITER, c: float = PROBE_C) -> float:
    """Test accuracy of multinomial logistic regression on frozen embeddings (`probe_outcomes`)."""
    return float(probe_outcomes(train_x, train_y, test_x, test_y, num_labels, seed=seed, max_iter=max_iter,
                                c=c).double().mean())


def probe_outcomes(train_x: torch.Tensor, train_y: Sequence[int], test_x: torch.Tensor, test_y: Sequence[int],
                   num_labels: int, *, seed: int = 0, max_iter: int = PROBE_MAX_ITER, c: float = PROBE_C
                   ) -> torch.Tensor:
    """Whether each test example is classified right (bool `[N]`) by multinomial logistic regression on
    frozen embeddings (MTEB's classifier).

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
        return (z @ w + b).argmax(-1) == gold


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
    "outcomes" holds which test examples each probe got right, for paired comparisons (evaluation.compare).
    `full=False` skips the full-split probe and embeds only the drawn training examples (a large
    train split costs most of the time).
    """
    ref = resolve_model(ref) if isinstance(ref, str) else ref
    setting = {"kind": "probe", "shots": shots, "draws": draws, "seed": seed, "max_len": max_len,
               "max_iter": PROBE_MAX_ITER, "C": PROBE_C, "standardize": True, "full": full, "outcomes": True}
    file = cache_file("quality", {"model": ref.fingerprint, "task": task_key(task), "protocol": setting}, ".json")
    if cache and (hit := read_json(file)) is not None:
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
    fit = lambda index: probe_outcomes(train_x[[row_of[i] for i in index]], [train_y[i] for i in index],  # noqa: E731
                                       test_x, test_y, task.num_labels, seed=seed)
    few_right = [fit(index) for index in draws_index]
    full_right = fit(used) if full else None
    few = [float(r.double().mean()) for r in few_right]
    result = {"full": None if full_right is None else float(full_right.double().mean()),
              "few_shot_mean": statistics.fmean(few),
              "few_shot_std": statistics.stdev(few) if len(few) > 1 else 0.0, "few_shot": few,
              "outcomes": {"full": None if full_right is None else outcome_string(full_right.tolist()),
                           "few_shot": [outcome_string(r.tolist()) for r in few_right]},
              "majority": task.test.majority_accuracy(), "shots": shots, "draws": draws,
              "train_examples": len(train_y), "test_examples": len(test_y),
              "seconds": time.perf_counter() - start}
    if cache:
        write_json(file, result)
    return {**result, "cached": False}
