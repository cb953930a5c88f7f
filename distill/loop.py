"""The training loop every trainer in kdnas runs — distillation, fine-tuning and task transfer:
AdamW with linear warm-up then linear decay to zero, bf16 autocast where the hardware has it, one
update step with gradient clipping, shuffled batches, and losses read back from the device in
groups with a check that they stay finite. Written once so the three trainers cannot drift apart;
each one only says what a batch is and what its loss is (`train_steps`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from kdnas.core.errors import TrainingError, check_choice
from kdnas.core.quiet import wait_while_measuring

Batch = TypeVar("Batch")
_END = object()


@dataclass(frozen=True)
class Optimization:
    """AdamW over `steps` updates: warm-up for `warmup_steps`, then linear decay to zero."""

    lr: float
    steps: int
    warmup_steps: int
    weight_decay: float
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    # One fused kernel for the whole update instead of a loop of small ops per tensor: the same
    # AdamW (weights within 1.5e-6 after 20 fp32 steps) in a fifth of the optimizer's time. On the
    # 2-core CPU that makes a fine-tuning step of the 22.7M-parameter teacher 0.88x as long; a
    # distillation step of the demo's student (4.5M trainable) is unchanged within the noise
    # (measured with a one-off benchmark, in git history; docs/distill.md).
    fused: bool = True


def warmup_linear_decay(steps: int | Callable[[], int], warmup_steps: int):
    """LR factor at step s: (s+1)/warm up to `warmup_steps`, then linear decay to 0 at `steps`.
    `steps` may be a callable read at every step (a run fitted to a deadline, `StepPlan`); the
    warm-up of a run cut that short is held to half of its steps, so it still decays to zero."""
    if not callable(steps):
        warm = max(1, warmup_steps)
        return lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm)))

    def factor(s: int) -> float:
        n = steps()
        warm = max(1, min(warmup_steps, n // 2))
        return min((s + 1) / warm, max(0.0, (n - s) / max(1, n - warm)))

    return factor


# A run fitted to a deadline measures its pace over this many updates before it first decides how
# many it can make (inside the usual warm-up of 5 % of 1,200), then again every REFIT_EVERY updates.
FIT_AFTER = 20
REFIT_EVERY = 50


class StepPlan:
    """How many updates a run makes: `planned`; with a deadline `until` (a `time.monotonic()` value),
    fewer when they would not all end by then, and — when `most` is above `planned` — more, up to
    `most`, while the time allows: a time limit is a budget to spend, not only a cap. The pace is
    measured on the run itself, so a host that slows down mid-run gets a shorter run, and the LR
    schedule (`warmup_linear_decay`) still decays to zero at the last update. Without `until` it is
    just `planned`."""

    def __init__(self, planned: int, until: float | None = None, most: int | None = None) -> None:
        self.planned, self.until, self.total = planned, until, planned
        self.most = planned if most is None else max(planned, most)
        self.started = time.monotonic()

    @property
    def fitted(self) -> bool:
        """Whether the deadline cut the run short."""
        return self.total < self.planned

    @property
    def extended(self) -> bool:
        """Whether the time left let the run go past `planned`."""
        return self.total > self.planned

    def paused(self, seconds: float) -> None:
        """Leave `seconds` of other work done mid-run (a grown transfer set's teacher targets) out of
        the measured pace; the time they took is still gone from what is left."""
        self.started += seconds

    def after(self, step: int, now: float | None = None) -> None:
        """Called after update `step`: refit the total when it is time to."""
        if self.until is None or step < FIT_AFTER or (step - FIT_AFTER) % REFIT_EVERY:
            return
        now = time.monotonic() if now is None else now
        pace = (now - self.started) / step
        self.total = fit_steps(step, pace, self.until - now, self.most)


def fit_steps(done: int, pace_s: float, left_s: float, most: int) -> int:
    """The updates a run can make in all: `done` so far plus those that fit in `left_s` seconds at
    `pace_s` each, at most `most`; never fewer than `done` (a deadline already past stops now)."""
    more = math.floor(left_s / pace_s) if pace_s > 0 and left_s > 0 else 0
    return max(done, min(most, done + more))


def adamw(params: list[nn.Parameter], optim: Optimization, plan: StepPlan | None = None
          ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW and its warm-up/decay schedule (over `plan`'s total when given, else `optim.steps`)."""
    fused = optim.fused and all(p.device.type in ("cpu", "cuda") and p.dtype == torch.float32 for p in params)
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
                                  fused=fused or None)
    steps = optim.steps if plan is None else (lambda: plan.total)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(steps, optim.warmup_steps))


# "auto": bf16 where the hardware multiplies bf16 natively, fp32 elsewhere; "bf16" or "fp32" forces one.
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp32")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matrix products in hardware: CUDA, or a CPU with AVX512-BF16
    or AMX. Elsewhere bf16 products are emulated, which buys no speed."""
    if device.type == "cuda":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own feature checks
    return device.type == "cpu" and any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def check_precision(precision: object) -> None:
    """A user's `--precision`: one of PRECISIONS, else one clear error."""
    check_choice("precision", precision, PRECISIONS)


def resolve_precision(precision: str, device: torch.device) -> str:
    """"bf16" or "fp32": what `precision` means on `device`."""
    check_precision(precision)
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def emulation_notice(precision: str, device: torch.device) -> str | None:
    """One line for a user who asks for bf16 where `device` has no bf16 arithmetic, else None.

    There torch emulates every bf16 product in software: 30 distillation steps of the demo's student
    (and their evaluation) took 22x as long as in fp32 on a 2-core AMD EPYC without AVX512
    (a one-off benchmark, in git history). Not refused — the numerics may be wanted — but never silent."""
    if precision != "bf16" or native_bf16(device):
        return None
    return (f"--precision bf16 on this {device.type.upper()} (no AVX512-BF16 or AMX) is emulated in software, "
            "many times slower than fp32; --precision auto trains in fp32 here")


def autocast(device: torch.device, precision: str = "auto") -> AbstractContextManager:
    """bf16 autocast (weights, gradients and optimizer state stay fp32; bf16 needs no loss scaling)
    where `precision` resolves to bf16; plain fp32 otherwise. On a 2-core AMD EPYC with AVX512-BF16,
    600 distillation steps of a 3-layer MiniLM student take 0.61x the fp32 time for the same
    fidelity (a one-off benchmark, in git history; docs/design/final-recipe.md)."""
    if resolve_precision(precision, device) == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def train_steps(params: list[nn.Parameter], batches: Iterable[Batch], loss_of: Callable[[Batch], torch.Tensor],
                optim: Optimization, device: torch.device, precision: str = "auto",
                plan: StepPlan | None = None, start: dict | None = None,
                save: Callable[[int, Callable[[], dict]], None] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Run `optim.steps` updates (or `plan.total`, which a deadline may change as the run goes), one
    per batch: the loss under autocast (`precision`), backward, gradient clipping, the optimizer and
    LR-schedule steps. Yields (step from 1, the loss still on the device) after each update, so the
    caller logs, evaluates or stops without the loop knowing how; the last update is the one where
    `step == plan.total`.

    `start` ({"step", "optimizer", "schedule"}, as `save` gets them) goes on from a saved run
    (distill.checkpoint); `save(step, state)` is called once the caller is done with each update, with
    `state()` building that dict only for the updates it saves."""
    plan = plan if plan is not None else StepPlan(optim.steps)
    optimizer, schedule = adamw(params, optim, plan)
    precision = resolve_precision(precision, device)  # the CPU's features probed once, not every step
    step, batches = 0, iter(batches)
    if start is not None:
        optimizer.load_state_dict(start["optimizer"])
        schedule.load_state_dict(start["schedule"])
        step = start["step"]
    while step < plan.total:
        batch = next(batches, _END)  # no batch is drawn past the last update (the shuffle's RNG stays put)
        if batch is _END:
            return
        step += 1
        wait_while_measuring()  # a latency measurement on cores this run shares (core.quiet)
        with autocast(device, precision):
            loss = loss_of(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, optim.max_grad_norm)
        optimizer.step()
        plan.after(step)  # before the schedule reads the total for the next update
        schedule.step()
        yield step, loss.detach()
        if save is not None:  # after the caller's evaluation of this update, which the save records
            save(step, lambda: {"step": step, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict()})


class LossReader:
    """Losses kept on the device and read back in groups — one host sync per group, since reading
    one every step makes the host wait for the GPU each step. A non-finite loss stops the run,
    naming the step it appeared at, `context` (method, lr) and `advice`."""

    def __init__(self, context: str, advice: str) -> None:
        self.context, self.advice = context, advice
        self.pending: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)

    def read(self, step: int) -> list[float]:
        """The losses added since the last read (the last one is `step`'s), as floats."""
        values = torch.stack(self.pending).float().cpu().tolist() if self.pending else []
        self.pending = []
        for offset, value in enumerate(values):
            if not math.isfinite(value):
                at = step - len(values) + 1 + offset
                raise TrainingError(f"loss became {value} at step {at} ({self.context}); the run stopped — {self.advice}")
        return values


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator, *,
                     drop_last: bool) -> Iterator[torch.Tensor]:
    """Row indices in batches, reshuffled every pass over the `n` rows, without end. With `drop_last`
    a pass ends when fewer than `batch_size` rows are left (a set smaller than one batch is one batch)."""
    while True:
        order = torch.randperm(n, generator=generator)
        full = n - n % batch_size if drop_last and n >= batch_size else n
        for start in range(0, full, batch_size):
            yield order[start : start + batch_size]


def epoch_batches(lengths: torch.Tensor, batch_size: int, generator: torch.Generator,
                  pool_batches: int = 16) -> list[torch.Tensor]:
    """One epoch of row indices, one tensor per batch.

    Rows are shuffled, then sorted by length within pools of `pool_batches` batches, so a batch holds
    rows of similar length and costs little padding (about half the compute on sentence rows);
    the batches are shuffled again. A set smaller than one batch is one batch.
    """
    order = torch.randperm(len(lengths), generator=generator)
    if len(order) < batch_size:
        return [order]
    batches: list[torch.Tensor] = []
    pool = batch_size * pool_batches
    for start in range(0, len(order) - batch_size + 1, pool):
        chunk = order[start : start + pool]
        chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk) - batch_size + 1, batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator)]
