"""Downstream quality: fine-tune an encoder with a classification head, over seeds, and score it.

Recipe (comparative analysis, App. D): AdamW, peak LR 2e-5, batch 32, a few epochs, linear warm-up
over the first 10 % then linear decay; every knob is a `FinetuneConfig` field. The head reads the
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
import hashlib
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from core import assets
from distill.data import pad_rows
from core.errors import InputError, first_line
from core.quiet import wait_while_measuring
from distill.losses import mean_pool
from .tasks import Split, Task
from distill.loop import LossReader, Optimization, autocast, shuffled_batches, train_steps

if TYPE_CHECKING:
    from .quality import QualityConfig

_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "spiece.model", "vocab.json")


@dataclass(frozen=True)
class FinetuneConfig:
    """The fine-tuning recipe and the evaluation protocol (subsample sizes, seeds)."""

    lr: float = 2e-5
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


@dataclass(frozen=True)
class ModelRef:
    """A model to evaluate: what the user typed, its local folder, and a weights fingerprint."""

    name: str
    path: str
    fingerprint: str


def resolve_model(name_or_path: str) -> ModelRef:
    """A bundled teacher name or an HF folder (e.g. `runs/demo/best`), checked before any training."""
    path = Path(assets.teacher_path(name_or_path))
    if not path.is_dir():
        raise InputError(f"model {name_or_path!r}: evaluation needs a local model folder or a bundled teacher name")
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


# --------------------------------------------------------------------------------------------
# training and scoring


@dataclass
class RunScore:
    """One fine-tuning run (one seed) on one task."""

    seed: int
    accuracy: float
    macro_f1: float
    train_seconds: float
    train_examples: int
    test_examples: int
    cached: bool = False


def resolve_device(name: str) -> torch.device:
    from distill.trainer import resolve_device as _resolve

    return _resolve(name)


def encode(tokenizer, texts, max_len: int) -> list[list[int]]:
    return tokenizer(list(texts), truncation=True, max_length=max_len, verbose=False)["input_ids"]


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
    reader = LossReader(f"fine-tuning, lr {config.lr}", "try a lower --lr")
    target = torch.tensor(labels, dtype=torch.long)

    def loss_of(index: torch.Tensor) -> torch.Tensor:
        ids, mask = pad_rows([rows[i] for i in index], pad_id)
        logits = model(ids.to(device), mask.to(device)).float()
        return nn.functional.cross_entropy(logits, target[index].to(device))

    model.train()
    for step, loss in train_steps([p for p in model.parameters() if p.requires_grad], batches, loss_of, optim, device):
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
        with autocast(device):
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
    acc, f1 = accuracy_and_f1(logits.argmax(-1).tolist(), list(test.labels), task.num_labels)
    return RunScore(seed=seed, accuracy=acc, macro_f1=f1, train_seconds=seconds,
                    train_examples=len(train), test_examples=len(test))


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


@dataclass
class ModelScores:
    model: str
    path: str
    role: str  # "teacher" or "student"
    parameters: int
    latency_ms: float | None
    tasks: dict[str, TaskScore] = field(default_factory=dict)
    quality: dict = field(default_factory=dict)  # "fidelity" and "probes" (evaluation.quality), when measured

    def to_dict(self) -> dict:
        return {"model": self.model, "path": self.path, "role": self.role, "parameters": self.parameters,
                "latency_ms": self.latency_ms, "tasks": {k: v.to_dict() for k, v in self.tasks.items()},
                **self.quality}


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
    key = json.dumps({"model": ref.fingerprint, "task": task.name, "source": task.source,
                      "sizes": task.sizes(), "recipe": config.recipe_key(), "seed": seed}, sort_keys=True)
    return assets.cache_root() / "eval" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _cached(ref: ModelRef, task: Task, config: FinetuneConfig, seed: int) -> RunScore | None:
    file = _cache_file(ref, task, config, seed)
    if not file.is_file():
        return None
    try:
        return dataclasses.replace(RunScore(**json.loads(file.read_text())), cached=True)
    except (TypeError, ValueError):
        return None  # an unreadable entry is recomputed


def _store(ref: ModelRef, task: Task, config: FinetuneConfig, run: RunScore) -> None:
    file = _cache_file(ref, task, config, run.seed)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(run)))
    tmp.replace(file)


def count_parameters(ref: ModelRef) -> int:
    """Encoder parameters, from the config (no weights loaded)."""
    from transformers import AutoConfig

    from core.spec import StudentSpec

    c = AutoConfig.from_pretrained(ref.path)
    spec = StudentSpec(layers=c.num_hidden_layers, heads=c.num_attention_heads, hidden=c.hidden_size,
                       ffn=c.intermediate_size, vocab_size=c.vocab_size,
                       max_position=c.max_position_embeddings, type_vocab_size=max(1, getattr(c, "type_vocab_size", 1) or 1))
    return spec.num_parameters()


# --------------------------------------------------------------------------------------------
# the comparison a deployment decision needs


def evaluate(
    models: list[str],
    tasks: list[str],
    config: FinetuneConfig = FinetuneConfig(),
    *,
    teacher: str | None = "minilm-l6",
    latency: bool = True,
    latency_seq: int = 128,
    threads: int = 2,
    cache: bool = True,
    log=None,
    measures: Sequence[str] = ("finetune",),
    quality: QualityConfig | None = None,
) -> dict:
    """Measure `teacher` and each model on each task; a JSON-ready report.

    `measures` (see `evaluation.quality.MEASURES`): "finetune" fine-tunes over the seeds (this
    module), "probe" and "fidelity" read frozen embeddings (`evaluation.quality`, protocol in
    `quality`, a `QualityConfig`; max length and device come from `config`). Every model, task and
    the fidelity corpus are checked before any training, so a typo fails in a second rather than
    after the teacher's fine-tuning.
    """
    from . import quality as q
    from .tasks import load_task

    log = log or (lambda message: None)
    measures = q.check_measures(measures)
    quality = quality or q.QualityConfig()
    loaded = [load_task(t) for t in tasks]
    refs = [(resolve_model(teacher), "teacher")] if teacher else []
    refs += [(resolve_model(m), "student") for m in models]
    if "fidelity" in measures and not teacher:
        raise InputError("the fidelity measure compares each model with the teacher: give a teacher, "
                         f"or leave fidelity out of the measures ({', '.join(measures)})")
    sentences = q.heldout_for(quality) if "fidelity" in measures else None
    device = resolve_device(config.device)
    log(f"evaluating {len(refs)} model(s) on {', '.join(t.name for t in loaded)} ({', '.join(measures)}"
        + (f", fine-tuning seeds {list(config.seeds)}" if "finetune" in measures else "") + f") on {device.type}")

    results: list[ModelScores] = []
    for ref, role in refs:
        extra = q.measure_model(ref, refs[0][0] if teacher else None, loaded, measures, quality, sentences,
                                max_len=config.max_len, device=config.device, cache=cache)
        scores = evaluate_model(ref, loaded, config, cache=cache) if "finetune" in measures else {}
        lat = _latency_ms(ref, latency_seq, threads) if latency else None
        results.append(ModelScores(model=ref.name, path=ref.path, role=role, parameters=count_parameters(ref),
                                   latency_ms=lat, tasks=scores, quality=extra))
        log(f"  {ref.name}: " + _summary(results[-1]))

    rows = [_relative(entry, results[0] if teacher else None) for entry in results]
    return {
        "protocol": {**asdict(config), "device": device.type, "latency": {"batch": 1, "seq": latency_seq,
                     "threads": threads, "runtime": "onnxruntime"} if latency else None,
                     **q.protocol(measures, quality, sentences)},
        "tasks": {t.name: {"labels": list(t.labels), "sizes": t.sizes(), "source": t.source,
                           "used": {"train": len(protocol_splits(t, config)[0]),
                                    "test": len(protocol_splits(t, config)[1])}} for t in loaded},
        "models": rows,
    }


def _latency_ms(ref: ModelRef, seq: int, threads: int) -> float:
    """Median CPU latency (batch 1, onnxruntime) of the model, in milliseconds."""
    from latency import profile

    return profile(ref.path, batch=1, seq=seq, threads=threads).median_ms


def _summary(entry: ModelScores) -> str:
    """One log line: fidelity ρ, full-split probe and fine-tuning accuracy, whichever were measured."""
    parts = []
    if "fidelity" in entry.quality:
        parts.append(f"fidelity ρ {entry.quality['fidelity']['spearman']:.3f}")
    parts += [f"{k} probe {100 * v['full']:.1f}" for k, v in entry.quality.get("probes", {}).items()]
    parts += [f"{k} {100 * v.mean():.1f}" for k, v in entry.tasks.items()]
    return ", ".join(parts)


def _relative(entry: ModelScores, reference: ModelScores | None) -> dict:
    """A report row: the model's scores, and beside them what share of the reference's it keeps."""
    from .quality import relative_quality

    row = entry.to_dict()
    if reference is None:
        return row
    if entry.tasks:
        row["percent_of_teacher"] = {k: 100 * v.mean() / reference.tasks[k].mean() for k, v in entry.tasks.items()}
        row["percent_of_teacher"]["average"] = sum(row["percent_of_teacher"].values()) / len(entry.tasks)
        # Raw % flatters a student that only predicts the majority class (e.g. 79 % on sentiment);
        # the share of the teacher's gain over that baseline does not.
        row["gain_kept"] = {k: _gain_kept(v.mean(), reference.tasks[k].mean(), v.majority)
                            for k, v in entry.tasks.items()}
        row["gain_kept"]["average"] = sum(row["gain_kept"].values()) / len(entry.tasks)
    row.update(relative_quality(entry.quality, reference.quality))
    if entry.latency_ms and reference.latency_ms:
        row["speedup"] = reference.latency_ms / entry.latency_ms
    return row


def _gain_kept(student: float, teacher: float, majority: float) -> float:
    """100 × (student − majority) / (teacher − majority): 0 = no better than the majority class."""
    return 100 * (student - majority) / (teacher - majority) if teacher > majority else float("nan")


def format_table(report: dict) -> str:
    """A readable table: fidelity and probe columns (`evaluation.quality.table_parts`), then fine-tuning
    accuracy mean ± std (macro-F1), % of teacher and gain kept, each when measured; params, latency."""
    from .quality import table_parts

    q_head, q_rows, q_majority, q_note = table_parts(report)
    f_head, f_rows, f_majority, f_note = _finetune_parts(report)
    head = ["model", "params", "latency ms"] + q_head + f_head
    lines = []
    for row, q_cells, f_cells in zip(report["models"], q_rows, f_rows):
        lines.append([f"{row['model']}{' (teacher)' if row['role'] == 'teacher' else ''}",
                      f"{row['parameters'] / 1e6:.1f}M",
                      f"{row['latency_ms']:.2f}" if row.get("latency_ms") else "-"] + q_cells + f_cells)
    lines.append(["majority class", "", ""] + q_majority + f_majority)
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    footer = [note for note in (q_note, f_note) if note]
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines), *footer])


def _finetune_parts(report: dict) -> tuple[list[str], list[list[str]], list[str], str]:
    """The fine-tuning columns: head, cells per model row, majority row, footer (empty when not measured)."""
    tasks = list(report["tasks"])
    if "finetune" not in report["protocol"].get("measures", ["finetune"]):
        return [], [[] for _ in report["models"]], [], ""
    head = [f"{t} acc (F1)" for t in tasks] + ["% of teacher", "gain kept"]
    rows = []
    for row in report["models"]:
        cells = []
        for t in tasks:
            s = row["tasks"][t]
            pct = row.get("percent_of_teacher", {}).get(t)
            cells.append(f"{100 * s['accuracy_mean']:.1f} ± {100 * s['accuracy_std']:.1f} ({100 * s['macro_f1_mean']:.1f})"
                         + (f" {pct:.0f}%" if pct is not None and row["role"] != "teacher" else ""))
        avg = row.get("percent_of_teacher", {}).get("average")
        cells.append(f"{avg:.1f}%" if avg is not None else "-")
        gain = row.get("gain_kept", {}).get("average")
        cells.append(f"{gain + 0.0:.1f}%" if gain is not None else "-")  # no "-0.0"
        rows.append(cells)
    majority = [f"{100 * report['models'][0]['tasks'][t]['majority_accuracy']:.1f}" for t in tasks] + ["", ""]
    p = report["protocol"]
    footer = (f"accuracy % mean ± std over seeds {p['seeds']} (macro-F1 %); fine-tuned {p['epochs']} epochs, lr {p['lr']}, "
              f"batch {p['batch_size']}, max len {p['max_len']}; train/test examples per task: "
              + ", ".join(f"{t} {v['used']['train']}/{v['used']['test']}" for t, v in report["tasks"].items())
              + "; gain kept = (student - majority) / (teacher - majority), averaged over tasks")
    return head, rows, majority, footer


# --------------------------------------------------------------------------------------------
# a cheap, scale-free read of representation quality


@torch.inference_mode()
def pooled_features(ref_or_model: ModelRef | tuple[nn.Module, object], texts, max_len: int, device: str = "auto",
                    batch_size: int = 64) -> torch.Tensor:
    """Masked-mean-pooled last hidden states `[N, d]` of a frozen encoder, fp32, in the order of `texts`.

    `ref_or_model` is a `ModelRef` (loaded onto `device`) or an `(encoder, tokenizer)` pair already in
    memory (used on its own device; a task model such as *ForMaskedLM is read through its encoder).
    Texts are batched by token length, so a batch of short sentences costs short compute.
    """
    from distill.teachers import base_model

    if isinstance(ref_or_model, ModelRef):
        encoder, tokenizer = load_encoder(ref_or_model)
        encoder.to(resolve_device(device))
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


def linear_probe(ref: ModelRef, task: Task, *, train_size: int | None = 400, eval_size: int | None = 400,
                 max_len: int = 64, steps: int = 300, lr: float = 1e-2, weight_decay: float = 1e-2,
                 seed: int = 0, device: str = "auto") -> RunScore:
    """Logistic regression on frozen, standardised pooled features (the encoder is not trained).

    Why: a briefly distilled student mostly reproduces the teacher's mean state, so its pooled
    features vary across inputs by ~1 % of their norm; fine-tuning with Adam at 1e-4 then cannot
    move the head far enough in a few dozen steps and every such student answers the majority
    class, leaving nothing to rank. Standardising each feature (train statistics) removes that
    scale, so the probe measures what the representation separates. Full-batch AdamW, deterministic.
    """
    train = task.train.subsample(train_size, seed=0)
    test = task.test.subsample(eval_size, seed=0)
    start = time.perf_counter()
    x_train = pooled_features(ref, train.texts, max_len, device)
    x_test = pooled_features(ref, test.texts, max_len, device)
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-6)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    torch.manual_seed(seed)
    head = nn.Linear(x_train.shape[1], task.num_labels)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    y = torch.tensor(train.labels)
    with torch.enable_grad():
        for _ in range(steps):
            loss = nn.functional.cross_entropy(head(x_train), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predicted = head(x_test).argmax(-1).tolist()
    acc, f1 = accuracy_and_f1(predicted, list(test.labels), task.num_labels)
    return RunScore(seed=seed, accuracy=acc, macro_f1=f1, train_seconds=time.perf_counter() - start,
                    train_examples=len(train), test_examples=len(test))
