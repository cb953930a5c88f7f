"""Task-transfer distillation, XtremeDistilTransformers (Mukherjee et al. 2021, §2-3, Algorithm 1).

The teacher is first fine-tuned on a source task (default `sentiment`). The student — word
embeddings initialised from the SVD of the teacher's (§3.1) — then learns in five progressive
stages, each freezing what the previous stage learned so errors from lower layers do not spoil
what is learned above them:

    1 representation  encoder θ (+ the up-projection W^f)   multi-layer hidden + attention, Eq. 8-9, unlabeled
    2 logit-head      head W^S only (θ frozen)               task-logit loss, Eq. 12, teacher soft labels, unlabeled
    3 logit-all       θ and W^S                              task-logit loss, Eq. 12
    4 ce-head         W^S only (θ frozen)                    cross-entropy, Eq. 13, hard labels
    5 ce-all          θ and W^S                              cross-entropy, Eq. 13

The task-logit loss is Eq. 12's MSE, ½‖z_S − z_T‖², or — `logit_loss="od"` — Hinton's output
distribution τ²·KL(softmax(z_T/τ) ‖ softmax(z_S/τ)) (`distill.losses.od_loss`) on the task logits.
The unlabeled transfer data are the source task's training texts (labels unused). The student's
encoder is then an ordinary model folder that `kdnas evaluate` fine-tunes on the other tasks
(task transfer) and on the source task.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from kdnas.distill.cache import TeacherCache
from kdnas.distill.data import make_transfer_set, pad_rows
from kdnas.core.errors import InputError, check_choice
from kdnas.core.files import staged_folder
from .finetune import Classifier, FinetuneConfig, accuracy_and_f1, predict_logits, train_classifier
from .models import encode, load_encoder, resolve_device, resolve_model, yardstick_precision
from kdnas.distill.losses import od_loss
from kdnas.core.spec import parse_arch
from .tasks import Task, load_task
from kdnas.distill.teachers import teacher_from_model
from kdnas.distill.loop import LossReader, Optimization, shuffled_batches, train_steps
from kdnas.distill.trainer import DistillConfig, distill

LOGIT_LOSSES = ("mse", "od")


@dataclass(frozen=True)
class Stage:
    """One step of Algorithm 1: which loss, which parameters learn, which data."""

    name: str
    loss: str  # "representation" | "logit" | "ce"
    trains: str  # "encoder" | "head" | "all"


STAGES: tuple[Stage, ...] = (
    Stage("representation", "representation", "encoder"),
    Stage("logit-head", "logit", "head"),
    Stage("logit-all", "logit", "all"),
    Stage("ce-head", "ce", "head"),
    Stage("ce-all", "ce", "all"),
)


@dataclass(frozen=True)
class StageBudget:
    steps: int
    lr: float


@dataclass(frozen=True)
class TransferConfig:
    """Everything a task-transfer distillation run depends on (besides teacher and source task)."""

    arch: str = "4x12x192x768"  # XtremeDistil's attention loss needs the teacher's head count
    transfer_size: int = 1024  # unlabeled sequences from the source task's training texts
    labeled_size: int | None = 2000  # labeled source examples for the CE stages (and teacher fine-tuning)
    seq_len: int = 64
    batch_size: int = 32
    # Steps and peak LR per stage. Stage 1 uses the task-agnostic LR (App. B); head-only stages a
    # higher one (a fresh linear layer), end-to-end stages a fine-tuning one.
    representation: StageBudget = StageBudget(400, 5e-4)
    logit_head: StageBudget = StageBudget(60, 1e-3)
    logit_all: StageBudget = StageBudget(150, 1e-4)
    ce_head: StageBudget = StageBudget(30, 1e-3)
    ce_all: StageBudget = StageBudget(60, 1e-4)
    logit_loss: str = "mse"
    temperature: float = 2.0  # only for logit_loss="od"
    teacher_finetune: FinetuneConfig = FinetuneConfig(lr=1e-4, epochs=2, max_len=64, seeds=(0,))
    seed: int = 0
    device: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        parse_arch(self.arch)
        check_choice("logit loss", self.logit_loss, LOGIT_LOSSES)
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise InputError(f"temperature {self.temperature} is invalid: must be a positive number")
        for stage in STAGES:
            budget = self.budget(stage)
            if budget.steps < 0 or not budget.lr > 0:
                raise InputError(f"stage {stage.name}: steps {budget.steps} must be >= 0 and lr {budget.lr} > 0")
        if self.transfer_size < 2 or self.batch_size < 1:
            raise InputError("transfer size must be >= 2 and batch size >= 1")
        if self.labeled_size is not None and self.labeled_size < 2:  # checked before the teacher's fine-tuning
            raise InputError(f"labeled size {self.labeled_size} is invalid: must be >= 2 (or all)")
        if not 8 <= self.seq_len <= 512:
            raise InputError(f"sequence length {self.seq_len} is invalid: allowed 8..512")

    def budget(self, stage: Stage) -> StageBudget:
        return getattr(self, stage.name.replace("-", "_"))


@dataclass
class TransferResult:
    student: Classifier
    tokenizer: object
    teacher_source: dict  # teacher accuracy / macro-F1 on the source test split
    student_source: dict  # student (after stage 5) on the same examples
    stages: list[dict] = field(default_factory=list)
    config: TransferConfig | None = None
    source: str = ""
    teacher: str = ""

    def summary(self) -> dict:
        return {"teacher": self.teacher, "source": self.source, "config": _jsonable(asdict(self.config)),
                "teacher_source_test": self.teacher_source, "student_source_test": self.student_source,
                "stages": self.stages}

    def save(self, out_dir: str | Path) -> Path:
        """The encoder as an HF folder (for `kdnas evaluate`), its tokenizer, the head, and transfer.json;
        built beside `out_dir` and renamed in whole (an earlier result there is replaced)."""
        out = Path(out_dir)
        with staged_folder(out) as stage:
            self.student.encoder.save_pretrained(stage)
            self.tokenizer.save_pretrained(stage)
            torch.save(self.student.head.state_dict(), stage / "task_head.pt")
            (stage / "transfer.json").write_text(json.dumps(self.summary(), indent=2))
        return out


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# freezing


def set_trainable(student: Classifier, stage: Stage, projection: nn.Module | None = None,
                  *, freeze_embeddings: bool = True) -> None:
    """Freeze and unfreeze for a stage (Algorithm 1): `encoder` θ (+W^f), `head` W^S, or `all` (θ, W^S).

    In the task stages (2-5) the word embeddings — learned in stage 1 from the SVD init — stay
    frozen when `freeze_embeddings` (XtremeDistil §4 freezes them downstream; see FinetuneConfig).
    """
    encoder_on = stage.trains in ("encoder", "all")
    head_on = stage.trains in ("head", "all")
    student.encoder.requires_grad_(encoder_on)
    student.head.requires_grad_(head_on)
    if freeze_embeddings and stage.loss != "representation":
        student.encoder.get_input_embeddings().requires_grad_(False)
    if projection is not None:
        projection.requires_grad_(stage.trains == "encoder")


# --------------------------------------------------------------------------------------------
# stages 2-5


Batches = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def run_stage(
    student: Classifier,
    stage: Stage,
    batches: Batches,
    num_examples: int,
    budget: StageBudget,
    *,
    config: TransferConfig,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> dict:
    """Train the parameters `stage` unfreezes for `budget.steps` steps on `loss_fn(logits, targets)`.

    `batches(index)` returns (ids, mask, targets) for example indices; order reshuffles each pass.
    """
    set_trainable(student, stage, freeze_embeddings=config.teacher_finetune.freeze_embeddings)
    params = [p for p in student.parameters() if p.requires_grad]
    device = next(student.parameters()).device
    if budget.steps == 0:
        return {"stage": stage.name, "steps": 0, "loss": None, "seconds": 0.0}
    optim = Optimization(lr=budget.lr, steps=budget.steps, warmup_steps=budget.steps // 10, weight_decay=0.01)
    generator = torch.Generator().manual_seed(config.seed + STAGES.index(stage))
    reader = LossReader(f"stage {stage.name}, lr {budget.lr}", "lower that stage's lr")

    def loss_of(index: torch.Tensor) -> torch.Tensor:
        ids, mask, targets = batches(index)
        logits = student(ids.to(device), mask.to(device)).float()
        return loss_fn(logits, targets.to(device))

    student.train()
    losses: list[float] = []
    start = time.perf_counter()
    with _bar(config, budget.steps, f"stage {STAGES.index(stage) + 1} {stage.name}") as bar:
        for step, loss in train_steps(params, shuffled_batches(num_examples, config.batch_size, generator,
                                                               drop_last=True), loss_of, optim, device,
                                      yardstick_precision(device)):
            reader.add(loss)
            losses += reader.read(step)
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    tail = losses[-max(1, len(losses) // 10):]
    return {"stage": stage.name, "steps": budget.steps, "lr": budget.lr, "loss_first": losses[0],
            "loss_last": sum(tail) / len(tail), "seconds": round(time.perf_counter() - start, 2)}


def logit_loss(kind: str, temperature: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Eq. 12 (`mse`: ½‖z_S − z_T‖², mean over examples) or Hinton OD on task logits (`od`)."""
    if kind == "mse":
        return lambda student, teacher: 0.5 * (student - teacher).pow(2).sum(-1).mean()
    return lambda student, teacher: od_loss(student, teacher, temperature)


# --------------------------------------------------------------------------------------------
# the whole recipe


def task_transfer(teacher_name: str = "minilm-l6", source: str | Task = "sentiment",
                  config: TransferConfig = TransferConfig()) -> TransferResult:
    """Fine-tune the teacher on `source`, then distill a student through the five stages."""
    device = resolve_device(config.device)
    task = load_task(source) if isinstance(source, str) else source
    ref = resolve_model(teacher_name)
    _check_student(ref, config)
    ft = config.teacher_finetune
    labeled = task.train.subsample(config.labeled_size, seed=0)
    test = task.test.subsample(ft.eval_size, seed=0)

    teacher, tokenizer, labeled_rows, test_rows, first = _finetuned_teacher(ref, task, labeled, test, config, device)
    pad_id = int(tokenizer.pad_token_id or 0)
    teacher_source = {k: v for k, v in first.items() if k not in ("stage", "seconds")}
    stages = [first]

    # Unlabeled transfer data: the source task's training texts, labels dropped.
    data = make_transfer_set(tokenizer, list(task.train.texts), seq_len=config.seq_len,
                             num_train=config.transfer_size, num_eval=64, seed=config.seed)

    student_encoder, stage = _representation_stage(teacher_name, task, teacher, tokenizer, data, config)
    stages += [stage] if stage else []
    torch.manual_seed(config.seed)
    student = Classifier(student_encoder, task.num_labels, ft.dropout).to(device)

    # Stages 2-3: task logits of the fine-tuned teacher on the unlabeled transfer rows.
    ids_all, mask_all = data.split("train")
    teacher_logits = _teacher_logits(teacher, ids_all, mask_all)
    soft = logit_loss(config.logit_loss, config.temperature)

    def unlabeled(index: torch.Tensor):
        return ids_all[index], mask_all[index], teacher_logits[index]

    for stage in STAGES[1:3]:
        stages.append(run_stage(student, stage, unlabeled, data.num_train, config.budget(stage),
                                config=config, loss_fn=soft))

    # Stages 4-5: cross-entropy on the labeled source examples.
    hard = torch.tensor(list(labeled.labels))

    def labeled_batches(index: torch.Tensor):
        ids, mask = pad_rows([labeled_rows[i] for i in index], pad_id)
        return ids, mask, hard[index]

    for stage in STAGES[3:]:
        stages.append(run_stage(student, stage, labeled_batches, len(labeled_rows), config.budget(stage),
                                config=config, loss_fn=nn.functional.cross_entropy))
    student.requires_grad_(True)
    student_source = _score(student, test_rows, list(test.labels), pad_id, task.num_labels)
    student.cpu()
    return TransferResult(student=student, tokenizer=tokenizer, teacher_source=teacher_source,
                          student_source=student_source, stages=stages, config=config,
                          source=task.name, teacher=teacher_name)


def _finetuned_teacher(ref, task: Task, labeled, test, config: "TransferConfig", device: torch.device):
    """The teacher, fine-tuned on hard labels of the source task (Algorithm 1, input a), its scores on
    the test rows, and the encoded labeled and test rows."""
    ft = config.teacher_finetune
    encoder, tokenizer = load_encoder(ref)
    torch.manual_seed(config.seed)
    teacher = Classifier(encoder, task.num_labels, ft.dropout).to(device)
    if ft.freeze_embeddings:
        encoder.get_input_embeddings().requires_grad_(False)
    pad_id = int(tokenizer.pad_token_id or 0)
    labeled_rows = encode(tokenizer, labeled.texts, config.seq_len)
    test_rows = encode(tokenizer, test.texts, config.seq_len)
    start = time.perf_counter()
    train_classifier(teacher, labeled_rows, list(labeled.labels), pad_id=pad_id, config=ft, seed=config.seed,
                     bar=_bar(config, math.ceil(len(labeled_rows) / ft.batch_size) * ft.epochs, "fine-tune teacher"))
    teacher.eval().requires_grad_(False)
    scores = _score(teacher, test_rows, list(test.labels), pad_id, task.num_labels)
    entry = {"stage": "teacher-finetune", "seconds": round(time.perf_counter() - start, 2), **scores}
    return teacher, tokenizer, labeled_rows, test_rows, entry


def _check_student(ref, config: "TransferConfig") -> None:
    """The representation stage's method (XtremeDistil: the teacher's head count) refused before the
    minutes of the teacher's fine-tuning, not after them."""
    if not config.representation.steps:
        return
    from transformers import AutoConfig

    from kdnas.distill.methods import build_method
    from kdnas.distill.teachers import config_dims
    from kdnas.distill.trainer import spec_dims

    try:
        c = AutoConfig.from_pretrained(ref.path)
    except (OSError, ValueError):
        return  # a config that does not load: the teacher's loading names it in one line
    build_method("xtremedistil", config_dims(c), spec_dims(parse_arch(config.arch)))


def _representation_stage(teacher_name: str, task: Task, teacher, tokenizer, data, config: "TransferConfig"):
    """Stage 1: multi-layer hidden + attention transfer with SVD-initialised embeddings, through the
    shared distillation trainer (the fine-tuned teacher's targets cached once in memory). Returns the
    student encoder and the stage's record (None when the stage has no steps)."""
    inner = teacher_from_model(f"{teacher_name}@{task.name}", teacher.encoder, tokenizer)
    spec = parse_arch(config.arch, **inner.student_sizes())
    rep = config.representation
    if not rep.steps:
        from kdnas.distill import build_student
        from kdnas.distill.trainer import _svd_init

        encoder = build_student(spec, seed=config.seed)
        _svd_init(encoder, inner)
        return encoder, None
    start = time.perf_counter()
    result = distill(spec, inner, data, DistillConfig(
        method="xtremedistil", steps=rep.steps, batch_size=config.batch_size, lr=rep.lr, init="svd",
        seed=config.seed, device=config.device, progress=config.progress), cache=TeacherCache(inner, data))
    return result.student, {"stage": "representation", "steps": rep.steps, "lr": rep.lr,
                            "loss_last": result.metrics["train_loss"], "l_hs_norm": result.metrics["l_hs_norm"],
                            "seconds": round(time.perf_counter() - start, 2)}


@torch.inference_mode()
def _teacher_logits(teacher: Classifier, ids: torch.Tensor, mask: torch.Tensor, batch: int = 64) -> torch.Tensor:
    device = next(teacher.parameters()).device
    out = [teacher(ids[i : i + batch].to(device), mask[i : i + batch].to(device)).float().cpu()
           for i in range(0, ids.shape[0], batch)]
    return torch.cat(out)


def _score(model: Classifier, rows, labels, pad_id: int, num_labels: int) -> dict:
    predicted = predict_logits(model, rows, pad_id=pad_id).argmax(-1).tolist()
    acc, f1 = accuracy_and_f1(predicted, labels, num_labels)
    return {"accuracy": acc, "macro_f1": f1, "test_examples": len(labels)}


def _bar(config: TransferConfig, total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not config.progress, dynamic_ncols=True, leave=False)
