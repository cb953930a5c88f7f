"""Downstream quality: fine-tune an encoder with a classification head, over seeds, and score it.

Recipe (comparative analysis, App. D): AdamW, batch 32, a few epochs, linear warm-up over the first
10 % then linear decay; every knob is a `FinetuneConfig` field. The peak LR is 1e-4, not App. D's
2e-5: the paper fine-tunes on GLUE, thousands of steps; a bundled task is a few hundred (topic: 160),
and there 2e-5 leaves every model smaller than the teacher under-trained while the teacher scores
the same at both (topic, 3 seeds: a 3-layer student 93.6 → 96.4, the teacher's first two layers
81.3 → 95.3, the teacher 96.1 and 96.1; benchmarks/results/student_quality_finetune_lr.json). The head reads the
masked mean of the last hidden states: the bundled teachers are sentence-embedding models trained
with mean pooling, and distilled students imitate every token's state rather than a special [CLS]
state, so the mean is the sentence representation both sides actually have.

A CPU evaluation subsamples each task (stratified, the same examples for every model and seed, see
`FinetuneConfig.train_size/eval_size`), so scores are comparable across models but are not the
full-split figures. Results are cached per (weights, task, recipe, seed) under
`$KDNAS_CACHE/eval`, so a teacher is fine-tuned once for many student comparisons.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from kdnas.core.errors import InputError
from kdnas.core.quiet import wait_while_measuring
from kdnas.distill.data import pad_rows
from kdnas.distill.loop import LossReader, Optimization, autocast, shuffled_batches, train_steps
from kdnas.distill.losses import mean_pool
from ._cache import cache_file, read_json, write_json
from .models import ModelRef, encode, load_encoder, resolve_device, yardstick_precision
from .compare import outcome_string
from .tasks import Split, Task


@dataclass(frozen=True)
class FinetuneConfig:
    """The fine-tuning recipe and the evaluation protocol (subsample sizes, seeds)."""

    lr: float = 1e-4
    batch_size: int = 32
    epochs: int = 3
    max_len: int = 128
    warmup: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    # Word embeddings stay fixed: with a 30k-row vocabulary their dense AdamW update costs ~4x the
    # rest of a small model's step on CPU, and a few thousand examples touch few rows anyway
    # (XtremeDistil, §4, also freezes them for downstream fine-tuning).
    freeze_embeddings: bool = True
    train_size: int | None = 2000  # examples per task; None: the whole train split
    eval_size: int | None = 1000  # test examples per task; None: the whole test split
    seeds: tuple[int, ...] = (0, 1, 2)
    device: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"learning rate {self.lr} is invalid: must be a positive number")
        for name in ("batch_size", "epochs", "max_len"):
            if getattr(self, name) < 1:
                raise InputError(f"{name.replace('_', ' ')} {getattr(self, name)} is invalid: must be >= 1")
        if not 8 <= self.max_len <= 512:
            raise InputError(f"max length {self.max_len} is invalid: allowed 8..512")
        for name in ("train_size", "eval_size"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise InputError(f"{name.replace('_', ' ')} {value} is invalid: must be >= 2 (or all)")
        if not self.seeds:
            raise InputError("at least one seed is needed")
        if not 0 <= self.warmup < 1:
            raise InputError(f"warm-up fraction {self.warmup} is invalid: allowed 0 <= warmup < 1")

    def recipe_key(self) -> dict:
        """The fields that change a score (not seeds, device or progress)."""
        skip = {"seeds", "device", "progress"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


# --------------------------------------------------------------------------------------------
# the model


class Classifier(nn.Module):
    """An encoder, masked mean pooling, dropout, one linear layer to the classes."""

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.hidden_size, num_labels)

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        return mean_pool(states, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.pooled(input_ids, attention_mask)))


@dataclass
class RunScore:
    """One fine-tuning run (one seed) on one task."""

    seed: int
    accuracy: float
    macro_f1: float
    train_seconds: float
    train_examples: int
    test_examples: int
    # which test examples it got right ("1"/"0" in test order), for paired comparisons
    # (evaluation.compare); None in a result cached before they were kept
    outcomes: str | None = None
    cached: bool = False


def train_classifier(
    model: Classifier,
    rows: list[list[int]],
    labels: list[int],
    *,
    pad_id: int,
    config: FinetuneConfig,
    seed: int,
    bar=None,
) -> None:
    """Cross-entropy fine-tuning of every trainable parameter (AdamW, warm-up + linear decay)."""
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    total = math.ceil(len(rows) / config.batch_size) * config.epochs
    optim = Optimization(lr=config.lr, steps=total, warmup_steps=int(config.warmup * total),
                         weight_decay=config.weight_decay)
    batches = shuffled_batches(len(rows), config.batch_size, torch.Generator().manual_seed(seed), drop_last=False)
    reader = LossReader(f"fine-tuning, lr {config.lr}", "try a lower --finetune-lr")
    target = torch.tensor(labels, dtype=torch.long)

    def loss_of(index: torch.Tensor) -> torch.Tensor:
        ids, mask = pad_rows([rows[i] for i in index], pad_id)
        logits = model(ids.to(device), mask.to(device)).float()
        return nn.functional.cross_entropy(logits, target[index].to(device))

    model.train()
    for step, loss in train_steps([p for p in model.parameters() if p.requires_grad], batches, loss_of, optim, device,
                                  yardstick_precision(device)):
        reader.add(loss)
        value = reader.read(step)[0]  # every step: the bar shows it, and the runs are CPU-sized
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}")


@torch.inference_mode()
def predict_logits(model: nn.Module, rows: list[list[int]], *, pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """Logits `[N, C]` in the order of `rows` (batched by length so padding is minimal)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out: list[torch.Tensor] = [None] * len(rows)  # type: ignore[list-item]
    for start in range(0, len(order), batch_size):
        wait_while_measuring()  # a latency measurement on cores this pass shares (core.quiet)
        chunk = order[start : start + batch_size]
        ids, mask = pad_rows([rows[i] for i in chunk], pad_id)
        with autocast(device, yardstick_precision(device)):
            logits = model(ids.to(device), mask.to(device)).float().cpu()
        for i, row in zip(chunk, logits):
            out[i] = row
    model.train(was_training)
    return torch.stack(out)


def accuracy_and_f1(predicted: list[int], gold: list[int], num_labels: int) -> tuple[float, float]:
    """Accuracy and macro-F1 (F1 averaged over all classes; a class never predicted nor present counts 0)."""
    if len(predicted) != len(gold) or not gold:
        raise ValueError("predictions and labels must be non-empty and of equal length")
    correct = sum(p == g for p, g in zip(predicted, gold))
    f1s = []
    for c in range(num_labels):
        tp = sum(p == c and g == c for p, g in zip(predicted, gold))
        fp = sum(p == c and g != c for p, g in zip(predicted, gold))
        fn = sum(p != c and g == c for p, g in zip(predicted, gold))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return correct / len(gold), sum(f1s) / num_labels


def protocol_splits(task: Task, config: FinetuneConfig) -> tuple[Split, Split]:
    """The train and test examples the protocol uses: the same for every model and seed."""
    return task.train.subsample(config.train_size, seed=0), task.test.subsample(config.eval_size, seed=0)


def finetune_once(ref: ModelRef, task: Task, config: FinetuneConfig, seed: int, *, bar=None) -> RunScore:
    """Fine-tune a fresh copy of the model on the task's train subsample and score the test subsample."""
    device = resolve_device(config.device)
    encoder, tokenizer = load_encoder(ref)
    torch.manual_seed(seed)  # the head's initialisation depends on the seed
    model = Classifier(encoder, task.num_labels, config.dropout).to(device)
    if config.freeze_embeddings:
        encoder.get_input_embeddings().requires_grad_(False)
    train, test = protocol_splits(task, config)
    pad_id = int(tokenizer.pad_token_id or 0)
    start = time.perf_counter()
    train_classifier(model, encode(tokenizer, train.texts, config.max_len), list(train.labels),
                     pad_id=pad_id, config=config, seed=seed, bar=bar)
    seconds = time.perf_counter() - start
    logits = predict_logits(model, encode(tokenizer, test.texts, config.max_len), pad_id=pad_id)
    predicted = logits.argmax(-1)
    acc, f1 = accuracy_and_f1(predicted.tolist(), list(test.labels), task.num_labels)
    return RunScore(seed=seed, accuracy=acc, macro_f1=f1, train_seconds=seconds,
                    train_examples=len(train), test_examples=len(test),
                    outcomes=outcome_string((predicted == torch.as_tensor(list(test.labels))).tolist()))


# --------------------------------------------------------------------------------------------
# several seeds, several tasks, several models


@dataclass
class TaskScore:
    task: str
    runs: list[RunScore]
    majority: float  # accuracy of the majority class on the same test examples

    def _values(self, what: str) -> list[float]:
        return [getattr(r, what) for r in self.runs]

    def mean(self, what: str = "accuracy") -> float:
        return statistics.fmean(self._values(what))

    def std(self, what: str = "accuracy") -> float:
        values = self._values(what)
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "accuracy_mean": self.mean("accuracy"), "accuracy_std": self.std("accuracy"),
            "macro_f1_mean": self.mean("macro_f1"), "macro_f1_std": self.std("macro_f1"),
            "majority_accuracy": self.majority,
            "runs": [asdict(r) for r in self.runs],
        }


def evaluate_model(ref: ModelRef, tasks: list[Task], config: FinetuneConfig, *, cache: bool = True) -> dict[str, TaskScore]:
    """Fine-tune and score `ref` on every task over `config.seeds` (cached results are reused)."""
    from tqdm.auto import tqdm

    scores: dict[str, TaskScore] = {}
    for task in tasks:
        train, test = protocol_splits(task, config)
        steps = math.ceil(len(train) / config.batch_size) * config.epochs
        runs: list[RunScore] = []
        todo = []
        for seed in config.seeds:
            hit = _cached(ref, task, config, seed) if cache else None
            if hit is not None:
                runs.append(hit)
            else:
                todo.append(seed)
        bar = tqdm(total=steps * len(todo), desc=f"fine-tune {Path(ref.name).name or ref.name} on {task.name}",
                   disable=not config.progress or not todo, dynamic_ncols=True, leave=False)
        for seed in todo:
            run = finetune_once(ref, task, config, seed, bar=bar)
            if cache:
                _store(ref, task, config, run)
            runs.append(run)
        bar.close()
        runs.sort(key=lambda r: r.seed)
        scores[task.name] = TaskScore(task=task.name, runs=runs, majority=test.majority_accuracy())
    return scores


def _cache_file(ref: ModelRef, task: Task, config: FinetuneConfig, seed: int) -> Path:
    return cache_file("eval", {"model": ref.fingerprint, "task": task.name, "source": task.source,
                              "sizes": task.sizes(), "recipe": config.recipe_key(), "seed": seed}, ".json")


def _cached(ref: ModelRef, task: Task, config: FinetuneConfig, seed: int) -> RunScore | None:
    stored = read_json(_cache_file(ref, task, config, seed))
    try:
        return None if stored is None else dataclasses.replace(RunScore(**stored), cached=True)
    except TypeError:
        return None  # an unreadable entry is recomputed


def _store(ref: ModelRef, task: Task, config: FinetuneConfig, run: RunScore) -> None:
    write_json(_cache_file(ref, task, config, run.seed), asdict(run))
