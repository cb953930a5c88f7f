"""Run one distillation method for N steps (comparative analysis, App. B recipe).

AdamW (β = 0.9, 0.98), linear warm-up over the first 5 % of steps then linear decay, gradient
clipping at 1.0. The forward passes run under bf16 autocast where the device multiplies bf16
natively (`precision`, distill.loop), in fp32 elsewhere. Teacher
targets come from a `TeacherCache` when one is given (computed once, reused), otherwise the teacher
runs live every step — the benchmark compares the two.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .activations import Activations, ModelDims
from .augment import WORD_SOURCES, substitute_neighbours, substitute_tokens, word_neighbours
from .cache import TeacherCache
from .checkpoint import Checkpoints, load_state, run_identity, save_state
from .data import TransferSet
from kdnas.core.errors import InputError, TrainingError, check_choice
from kdnas.core.files import staged_folder
from kdnas.core.sentence import has_sentence_modules, write_sentence_transformers
from .evaluate import Evaluator
from .inherit import LAYER_RULES, inherit_reason, inherit_student
from .losses import svd_embedding_init
from .methods import build_method, weighted_embed_terms
from .loop import (LossReader, Optimization, StepPlan, check_precision, epoch_batches, resolve_precision,
                   train_steps)
from kdnas.core.spec import StudentSpec, build_student
from .teachers import Teacher, activations, base_model

OnEval = Callable[[int, dict], None]
OnStep = Callable[[int, int], None]  # (steps done, steps planned now): a progress display
Grow = Callable[[int], TeacherCache | None]
INITS: tuple[str, ...] = ("inherit", "svd", "random")


@dataclass(frozen=True)
class DistillConfig:
    """Everything that decides a distillation run besides the shapes and the data."""

    method: str = "minilmv2"
    steps: int = 200
    batch_size: int = 32
    lr: float = 5e-4
    warmup: float = 0.05
    weight_decay: float = 0.01
    eval_every: int = 0  # 0: evaluate once, at the end
    interim_eval_rows: int | None = None  # held-out rows for the evaluations before the last (None: all)
    # Method options; None takes the method's default (distill.methods.method_options).
    layer_map: str | None = None
    relation_heads: int | None = None
    teacher_layer: str | None = None
    ckd_overlap: str | None = None
    alp_scope: str | None = None
    temperature: float | None = None
    embed_terms: str | None = None
    mask_prob: float = 0.15
    # Share of the batches whose tokens are perturbed, the teacher labelling them live (distill.augment):
    # for a transfer set seen many times over. 0: every batch as the corpus has it.
    augment: float = 0.0
    # Where a perturbed row's new words come from (distill.augment.WORD_SOURCES): "batch", other words
    # of the same batch; "neighbours", the replaced word's nearest words in the teacher's embeddings.
    augment_words: str = "batch"
    eval_layer_map: str = "uniform"
    # "inherit": the teacher's own layers, heads, neurons and channels (distill.inherit); "svd":
    # XtremeDistil's SVD-factorised teacher word embeddings, the rest random; "random".
    init: str = "inherit"
    layer_rule: str = "even"  # which teacher layers an inherited student keeps (distill.inherit)
    # Dropout in the student while it distills; None keeps the model's own (BERT: 0.1). Matching a
    # deterministic teacher, dropout only adds noise to the targets' imitation.
    dropout: float | None = 0.0
    # Word embeddings fixed during distillation; None: fixed for an inherited student (they are the
    # teacher's already, and rows the transfer set never touches would drift from those it does).
    freeze_embeddings: bool | None = None
    seed: int = 0
    device: str = "auto"
    # "auto": bf16 autocast where the device multiplies bf16 natively (CUDA; CPUs with AVX512-BF16
    # or AMX), fp32 elsewhere. Same fidelity, fewer seconds (docs/design/final-recipe.md).
    precision: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise InputError(f"steps={self.steps} is invalid: must be >= 1")
        if self.batch_size < 1:
            raise InputError(f"batch size {self.batch_size} is invalid: must be >= 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"learning rate {self.lr} is invalid: must be a positive number")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):  # AdamW's own refusal comes mid-run
            raise InputError(f"weight decay {self.weight_decay} is invalid: must be a number >= 0")
        if not 0 <= self.warmup < 1:
            raise InputError(f"warm-up fraction {self.warmup} is invalid: allowed 0 <= warmup < 1")
        check_choice("init", self.init, INITS)
        if isinstance(self.augment, bool) or not isinstance(self.augment, (int, float)) or not 0 <= self.augment <= 1:
            raise InputError(f"augment {self.augment!r} is invalid: the share of batches perturbed, 0 <= augment <= 1")
        check_choice("augment words", self.augment_words, WORD_SOURCES)
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise InputError(f"dropout {self.dropout} is invalid: allowed 0 <= dropout < 1")
        check_choice("layer rule", self.layer_rule, LAYER_RULES)
        check_device(self.device)
        check_precision(self.precision)
        if self.embed_terms is not None:  # malformed terms fail here, not after the teacher and corpus load
            weighted_embed_terms(self.embed_terms)

    def method_options(self) -> dict:
        """The method options that were set; `build_method` rejects any the method does not take."""
        names = ("layer_map", "relation_heads", "teacher_layer", "ckd_overlap", "alp_scope", "temperature",
                 "embed_terms")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def for_method(self, method: str) -> "DistillConfig":
        """This config for another stage's method, keeping only the options that method takes."""
        from .methods import method_options

        keep = method_options(method)
        cleared = {n: None for n in self.method_options() if n not in keep}
        return dataclasses.replace(self, method=method, **cleared)


@dataclass
class DistillResult:
    student: nn.Module
    spec: StudentSpec
    config: DistillConfig
    metrics: dict
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    train_seconds: float = 0.0  # `seconds` less the held-out evaluations: the pace of the updates alone
    tokens_per_second: float = 0.0
    init: dict = field(default_factory=dict)  # how the student started (distill.trainer.initial_student)
    precision: str = "fp32"  # what config.precision resolved to on the run's device
    # updates made: config.steps, fewer when a deadline (`until`) cut the run short, more when it
    # left time for them (`up_to`)
    steps: int = 0
    rows: int = 0  # training rows it drew from: the transfer set's, more when the run grew it (`grow`)
    resumed_from: int = 0  # the step a saved run went on from (distill.checkpoint); 0: run from the start

    @property
    def cut_short(self) -> bool:
        return self.steps < self.config.steps

    @property
    def extended(self) -> bool:
        return self.steps > self.config.steps

    def summary(self) -> dict:
        return {
            "arch": self.spec.arch,
            "spec": asdict(self.spec),
            "config": asdict(self.config),
            "metrics": self.metrics,
            "history": self.history,
            "seconds": round(self.seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 1),
            "init": self.init,
            "precision": self.precision,
            "steps": self.steps,
            "resumed_from": self.resumed_from,
        }

    def save(self, out_dir: str | os.PathLike, tokenizer, extra: dict | None = None,
             sentence_from: str | os.PathLike | None = None) -> Path:
        """Write a folder loadable with `AutoModel.from_pretrained`, plus its tokenizer and
        `distill.json` (losses, config). When `sentence_from` (the teacher's folder or hub name) is a
        sentence-transformers model, its modules too (core.sentence): without them
        `SentenceTransformer(folder)` pools without the teacher's normalization. Built beside the
        target and renamed into place (core.files.staged_folder); what is there is replaced."""
        out = Path(out_dir)
        with staged_folder(out) as stage:
            self.student.save_pretrained(stage)
            tokenizer.save_pretrained(stage)
            (stage / "distill.json").write_text(json.dumps({**self.summary(), **(extra or {})}, indent=2))
            if has_sentence_modules(sentence_from):
                write_sentence_transformers(stage, sentence_from, hidden_size=self.student.config.hidden_size)
        return out


# Losses are read back from the device (and checked finite) every this many steps and at evaluations.
FINITE_CHECK_EVERY = 10


def check_device(name: object) -> None:
    """A user's `--device`: auto, cpu, cuda or cuda:N, else one clear error."""
    if not (isinstance(name, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", name)):
        raise InputError(f"device {name!r} is invalid: allowed auto, cpu, cuda, cuda:N")


def resolve_device(name: str) -> torch.device:
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {name!r} was asked for but no CUDA device is available; use --device cpu")
    return torch.device(name)


def distill(
    spec: StudentSpec,
    teacher: Teacher,
    data: TransferSet,
    config: DistillConfig,
    *,
    cache: TeacherCache | None = None,
    evaluator: Evaluator | None = None,
    on_eval: OnEval | None = None,
    student: nn.Module | None = None,
    until: float | None = None,
    up_to: int | None = None,
    grow: Grow | None = None,
    checkpoints: Checkpoints | None = None,
    on_step: OnStep | None = None,
) -> DistillResult:
    """Distill `teacher` into a student of shape `spec` on `data` with `config.method`.

    `cache` supplies teacher targets (the teacher then never runs during training); without it
    the teacher runs every step. `evaluator` scores held-out L_HS (defaults to this teacher's);
    `on_eval(step, metrics)` is called at each evaluation and may raise to stop the run (pruning).
    `student` continues from an existing model (multi-stage recipes) instead of a fresh one.
    `until` (a `time.monotonic()` value) fits the run to a deadline: fewer than `config.steps`
    updates when the measured pace says they would not all end by then, and more, up to `up_to`,
    when it says they would (`distill.loop.StepPlan`). `grow(total)` is then asked, each time the
    total rises, for a cache over a larger transfer set that starts with this one
    (`TeacherCache.grown`), or None when the rows at hand are enough: a longer run draws from more
    text instead of repeating it (its rows join from the next pass over the set; the teacher's
    time on them is left out of the pace, not out of the time left). `checkpoints` saves the run's
    state and goes on from a save of the same run (distill.checkpoint); not with `until`. `on_step(step,
    total)` is called after every update (a caller's progress display)."""
    if checkpoints is not None and until is not None:
        raise ValueError("checkpoints are for runs of a fixed step count; this one is fitted to a deadline")
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    method = build_method(config.method, teacher.dims, spec_dims(spec), **config.method_options())
    if method.student_needs().logits and not teacher.has_mlm_head:
        raise InputError(f"method {config.method!r} needs a teacher with a masked-LM head; {teacher.name!r} has none")
    # Importance (inherit) and held-out targets (evaluator) come from a cache even when the teacher runs live.
    targets = cache if cache is not None else TeacherCache(teacher, data)
    student, init = _prepare_student(spec, teacher, targets, config, method, student)
    student.to(device).train()
    method.to(device).train()
    teacher.model.to(device)
    # Logits are never cached (see TeacherCache), so OD always runs the teacher.
    if cache is not None and not method.teacher_needs().logits:
        cache.ensure("train", method.teacher_needs())
        cache.place("train", device)  # on a GPU, targets resident there when they fit
    else:
        cache = None
    loop = _Loop(student, method, teacher, data, config, device, cache,
                 evaluator or Evaluator(targets, strategy=config.eval_layer_map), on_eval, spec.arch,
                 grow if cache is not None else None, checkpoints, on_step)
    metrics, history, seconds, train_seconds = loop.run(until, up_to)
    return DistillResult(student=student.cpu() if device.type != "cpu" else student, spec=spec, config=config,
                         metrics=metrics, history=history, seconds=seconds, train_seconds=train_seconds,
                         tokens_per_second=loop.tokens / max(train_seconds, 1e-9),
                         init=init, precision=resolve_precision(config.precision, device),
                         steps=history[-1]["step"] if history else 0, rows=int(loop.ids.shape[0]),
                         resumed_from=loop.resumed_from)


def _prepare_student(spec: StudentSpec, teacher: Teacher, targets: TeacherCache, config: DistillConfig,
                     method: nn.Module, student: nn.Module | None) -> tuple[nn.Module, dict]:
    """The student to train (fresh by `config.init`, or the one given), with an MLM head when the
    method needs logits, its projection aligned to an inherited selection, embeddings frozen and
    dropout set as the config asks."""
    init = {"init": "continued"}
    if student is None:
        student, init = initial_student(spec, teacher, targets, config)
    if method.student_needs().logits and not hasattr(student, "cls"):
        student = _with_mlm_head(student, spec, config.seed)
    plan = init.pop("plan", None)
    if plan is not None and hasattr(method, "align_to"):
        # A pruned student's channels are a subset of the teacher's: its projection starts as that
        # selection, not at random (a random map first pulls the inherited states apart).
        method.align_to(plan.selection(teacher.dims.hidden))
    frozen = config.freeze_embeddings if config.freeze_embeddings is not None else init.get("init") == "inherit"
    if frozen:
        base_model(student).embeddings.word_embeddings.requires_grad_(False)
    if config.dropout is not None:
        for module in student.modules():
            if isinstance(module, nn.Dropout):
                module.p = config.dropout
    return student, init


class _Loop:
    """One run's steps: length-bucketed batches, teacher targets (cached or live), the shared
    training loop (distill.loop), loss checks every FINITE_CHECK_EVERY steps, evaluations every
    `eval_every`, saves of the whole state every `checkpoints.every` (distill.checkpoint)."""

    def __init__(self, student: nn.Module, method: nn.Module, teacher: Teacher, data: TransferSet,
                 config: DistillConfig, device: torch.device, cache: TeacherCache | None, evaluator: Evaluator,
                 on_eval: OnEval | None, arch: str, grow: Grow | None = None,
                 checkpoints: Checkpoints | None = None, on_step: OnStep | None = None) -> None:
        self.student, self.method, self.teacher, self.config = student, method, teacher, config
        self.device, self.cache, self.evaluator, self.on_eval, self.arch = device, cache, evaluator, on_eval, arch
        self.grow, self.checkpoints, self.on_step = grow, checkpoints, on_step
        self.ids, self.mask = data.split("train")
        self.mlm = method.student_needs().logits
        self.generator = torch.Generator().manual_seed(config.seed)
        self.special = _special_ids(teacher.tokenizer)
        self.neighbours = self._neighbours()
        self.tokens = 0
        # The record so far, kept here so that a save holds it and a resumed run starts from it.
        self.epoch: list[torch.Tensor] = []  # the batches left of the current pass, the next one last
        self.history: list[dict] = []
        self.running: list[float] = []  # losses since the last evaluation
        self.seconds_before, self.eval_seconds, self.resumed_from = 0.0, 0.0, 0
        self.reader = LossReader(f"method {config.method}, lr {config.lr}", "try a lower --lr")

    def run(self, until: float | None = None, up_to: int | None = None) -> tuple[dict, list[dict], float, float]:
        """Train for `config.steps` (fewer to end by `until`, or up to `up_to` when it leaves time);
        returns (last metrics, history, seconds, seconds less the held-out evaluations)."""
        from tqdm.auto import tqdm

        config = self.config
        params = [p for p in list(self.student.parameters()) + list(self.method.parameters()) if p.requires_grad]
        optim = Optimization(lr=config.lr, steps=config.steps, warmup_steps=int(config.warmup * config.steps),
                             weight_decay=config.weight_decay, betas=(0.9, 0.98))
        start = self._resume()
        metrics: dict = self.history[-1] if self.history else {}
        self.started = time.perf_counter()
        plan = self.plan = StepPlan(config.steps, until, up_to)
        grown_for = config.steps
        save = self._save if self.checkpoints is not None else None
        with tqdm(total=config.steps, initial=self.resumed_from, desc=f"distill {config.method} {self.arch}",
                  disable=not config.progress, dynamic_ncols=True, leave=False) as bar:
            for step, loss in train_steps(params, self._passes(), self.loss, optim, self.device, config.precision,
                                          plan, start, save):
                if self.grow is not None and plan.total > grown_for:
                    grown_for = plan.total
                    self._grow(plan)
                self.reader.add(loss)
                bar.total = plan.total
                bar.update(1)
                if self.on_step is not None:
                    self.on_step(step, plan.total)
                last = step == plan.total
                evaluate = (config.eval_every and step % config.eval_every == 0) or last
                if evaluate or step % FINITE_CHECK_EVERY == 0:
                    self.running += self.reader.read(step)
                    bar.set_postfix(loss=f"{self.running[-1]:.4f}")
                if evaluate:
                    metrics = self._evaluate(step, last)
                    bar.set_postfix(loss=f"{metrics['train_loss']:.4f}", l_hs=f"{metrics['l_hs_norm']:.3f}")
        seconds = self._seconds()
        # throughput and pace count training steps, not evaluations
        return metrics, self.history, seconds, seconds - self.eval_seconds

    def _evaluate(self, step: int, last: bool) -> dict:
        eval_start = time.perf_counter()
        metrics = self.evaluate(step, self.running, last)
        self.history.append(metrics)
        self.running = []
        self.eval_seconds += time.perf_counter() - eval_start
        if self.on_eval is not None:
            self.on_eval(step, metrics)
        return metrics

    def _seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started

    def _passes(self) -> Iterator[torch.Tensor]:
        """Length-bucketed batches of row indices, pass after pass over the training rows; a pass
        that starts after the set grew covers the new rows too."""
        while True:
            if not self.epoch:
                self.epoch = epoch_batches(self.mask.sum(1), self.config.batch_size, self.generator)
            yield self.epoch.pop()

    def _resume(self) -> dict | None:
        """Go on from the saved state of this run, if there is one: weights, RNGs, the pass under way
        and the record; returns what the training loop needs (distill.loop.train_steps's `start`)."""
        if self.checkpoints is None:
            return None
        self.identity = run_identity(self.arch, self.teacher.name, self.ids, self.config)
        state = load_state(self.checkpoints.path, self.identity)
        if state is None:
            return None
        self.student.load_state_dict(state["student"])
        self.method.load_state_dict(state["method"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["rng"])  # student dropout, where a config keeps it
        self.epoch, self.history, self.running = state["epoch"], state["history"], state["running"]
        self.tokens, self.seconds_before, self.eval_seconds = state["tokens"], state["seconds"], state["eval_seconds"]
        self.resumed_from = state["step"]
        print(f"kdnas: going on from {self.checkpoints.path}, saved after step {self.resumed_from} of "
              f"{self.config.steps}", file=sys.stderr)
        return {key: state[key] for key in ("step", "optimizer", "schedule")}

    def _save(self, step: int, loop_state: Callable[[], dict]) -> None:
        """Save the whole state after update `step` when it is due (`distill.loop.train_steps`'s `save`)."""
        if not self.checkpoints.due(step, step == self.plan.total):
            return
        self.running += self.reader.read(step)
        save_state(self.checkpoints.path, {
            "identity": self.identity, **loop_state(), "student": self.student.state_dict(),
            "method": self.method.state_dict(), "generator": self.generator.get_state(), "rng": torch.get_rng_state(),
            "epoch": self.epoch, "history": self.history, "running": self.running, "tokens": self.tokens,
            "seconds": self._seconds(), "eval_seconds": self.eval_seconds})

    def _neighbours(self) -> torch.Tensor | None:
        """The replacement table for `augment_words="neighbours"` over the training rows' words, else None."""
        if not (self.config.augment > 0 and self.config.augment_words == "neighbours"):
            return None
        words = base_model(self.teacher.model).embeddings.word_embeddings.weight
        tokens = self.teacher.tokenizer.convert_ids_to_tokens(list(range(words.shape[0])))
        return word_neighbours(words.cpu(), self.ids, self.special, tokens)

    def _grow(self, plan: StepPlan) -> None:
        """Ask for more training rows for the `plan.total` updates the run will now make."""
        start = time.monotonic()
        cache = self.grow(plan.total)
        if cache is not None:
            cache.ensure("train", self.method.teacher_needs())
            cache.place("train", self.device)  # as at the start: on a GPU, resident there when they fit
            self.cache, (self.ids, self.mask) = cache, cache.data.split("train")
            self.neighbours = self._neighbours()  # the new rows' words join the candidates
        plan.paused(time.monotonic() - start)

    def evaluate(self, step: int, running: list[float], last: bool) -> dict:
        rows = None if last else self.config.interim_eval_rows
        return {"step": step, "train_loss": sum(running) / len(running), **self.evaluator(self.student, rows)}

    def loss(self, index: torch.Tensor) -> torch.Tensor:
        """The method's loss on the rows `index` (under the loop's autocast); counts their real tokens."""
        # Rows are left-aligned, so the batch is cut to its longest row: short rows (sentences) cost less.
        width = int(self.mask[index].sum(1).max())
        ids, mask = self.ids[index, :width].to(self.device), self.mask[index, :width].to(self.device)
        loss_mask = mask
        # A perturbed batch has no cached targets: the teacher labels it live (distill.augment).
        perturbed = self.config.augment > 0 and float(torch.rand((), generator=self.generator)) < self.config.augment
        if perturbed and self.neighbours is not None:
            ids = substitute_neighbours(ids, mask, self.special, self.neighbours, self.generator)
        elif perturbed:
            ids = substitute_tokens(ids, mask, self.special, self.generator)
        if self.mlm:
            ids, loss_mask = _mask_tokens(ids, mask, self.teacher.tokenizer, self.config.mask_prob, self.generator)
        needs = self.method.teacher_needs()
        if self.cache is None or perturbed:
            with torch.no_grad():
                t_acts = self.teacher.activations(ids, mask, needs)
        else:
            t_acts = self.cache.batch("train", index, needs, width=width).to(self.device)
        s_acts = activations(self.student, ids, mask, self.method.student_needs())
        self.tokens += int(self.mask[index, :width].sum())  # host-side mask: no device sync
        return self.method(s_acts, _as_float(t_acts), loss_mask)


def initial_student(spec: StudentSpec, teacher: Teacher, targets: TeacherCache,
                    config: DistillConfig) -> tuple[nn.Module, dict]:
    """The student before training, as `config.init` says, and what was done (for distill.json).

    `inherit` falls back to `svd` where the weights cannot map (e.g. a student deeper than its
    teacher), or to `random` for a student wider than its teacher, with a one-line notice on stderr
    and the reason in the returned record.
    """
    if config.init == "inherit":
        reason = inherit_reason(teacher, spec)
        if reason is None:
            student, plan = inherit_student(teacher, spec, targets.importance(), config.layer_rule)
            return student, {"init": "inherit", **plan.describe(), "plan": plan}
        fallback = "svd" if spec.hidden <= teacher.dims.hidden else "random"  # SVD keeps at most d_T components
        note = f"init inherit is not possible for {spec.arch} ({reason}); using {fallback}"
        print(f"kdnas: {note}", file=sys.stderr)
        info = {"init": fallback, "note": note}
    else:
        info = {"init": config.init}
    student = build_student(spec, seed=config.seed)
    if info["init"] == "svd":
        _svd_init(student, teacher)
    return student, info


def spec_dims(spec: StudentSpec) -> ModelDims:
    """The shape facts a method needs about a student (`distill.methods.build_method`)."""
    return ModelDims(layers=spec.layers, hidden=spec.hidden, heads=spec.heads, ffn=spec.ffn)


def _as_float(acts: Activations) -> Activations:
    """Cached targets are half precision; losses compare in fp32."""
    return acts.to(_device_of(acts), torch.float32)


def _device_of(acts: Activations) -> torch.device:
    for group in (acts.hidden, acts.query, acts.key, acts.value):
        for tensor in group.values():
            return tensor.device
    return acts.logits.device if acts.logits is not None else torch.device("cpu")


def _svd_init(student: nn.Module, teacher: Teacher) -> None:
    t_emb = base_model(teacher.model).embeddings.word_embeddings.weight
    s_emb = base_model(student).embeddings.word_embeddings.weight
    if t_emb.shape[0] != s_emb.shape[0]:
        raise InputError(f"SVD init needs equal vocabularies: teacher {t_emb.shape[0]}, student {s_emb.shape[0]}")
    with torch.no_grad():
        s_emb.copy_(svd_embedding_init(t_emb.detach().float().cpu(), s_emb.shape[1]).to(s_emb))


def _with_mlm_head(encoder: nn.Module, spec: StudentSpec, seed: int) -> nn.Module:
    """Put a fresh masked-LM head on a trained encoder (OD after HS)."""
    model = build_student(spec, seed=seed, mlm=True)
    missing = base_model(model).load_state_dict(base_model(encoder).state_dict(), strict=False)
    if missing.missing_keys:
        raise TrainingError(f"cannot continue from the given student: missing weights {missing.missing_keys[:3]}")
    model.tie_weights()
    return model


def _mask_tokens(ids: torch.Tensor, mask: torch.Tensor, tokenizer, prob: float, generator: torch.Generator):
    """BERT masking: `prob` of real tokens chosen; 80 % [MASK], 10 % random, 10 % kept."""
    special = torch.isin(ids, _special_ids(tokenizer).to(ids.device))
    rand = torch.rand(ids.shape, generator=generator).to(ids.device)
    chosen = (rand < prob) & mask.bool() & ~special
    action = torch.rand(ids.shape, generator=generator).to(ids.device)
    masked = ids.clone()
    masked[chosen & (action < 0.8)] = tokenizer.mask_token_id
    random_ids = torch.randint(len(tokenizer), ids.shape, generator=generator).to(ids.device)
    swap = chosen & (action >= 0.8) & (action < 0.9)
    masked[swap] = random_ids[swap]
    return masked, chosen.long()


def _special_ids(tokenizer) -> torch.Tensor:
    """[CLS], [SEP] and padding: tokens that masking and perturbation never touch."""
    return torch.tensor([t for t in (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
                         if t is not None])
