"""The optimisation pieces every training loop in kdnas shares (distillation, fine-tuning, task
transfer): AdamW with linear warm-up then linear decay to zero, bf16 autocast on CUDA, and one
update step with gradient clipping. Written once so the three loops cannot drift apart."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


def warmup_linear_decay(steps: int, warmup_steps: int):
    """LR factor at step s: (s+1)/warm up to `warmup_steps`, then linear decay to 0 at `steps`."""
    warm = max(1, warmup_steps)
    return lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm)))


def adamw(params: list[nn.Parameter], *, lr: float, steps: int, warmup_steps: int, weight_decay: float,
          betas: tuple[float, float] = (0.9, 0.999)) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW and its warm-up/decay schedule over `steps` updates."""
    optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(steps, warmup_steps))


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA (no loss scaling needed); plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def optimizer_step(loss: torch.Tensor, params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
                   schedule: torch.optim.lr_scheduler.LRScheduler, max_grad_norm: float = 1.0) -> None:
    """One update: backward, clip the gradient norm, step the optimizer and the LR schedule."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    schedule.step()
