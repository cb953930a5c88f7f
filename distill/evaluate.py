"""Held-out hidden-state loss L_HS, raw and normalized (docs/methods.md, "Reward normalization").

The reward needs one number per student that is comparable across methods and shapes. A student
trained with MiniLMv2 has no HS projection, so the map `W` of Eq. 6 is fitted here, in closed form
(ridge least squares with bias), cross-fitted: fitted on one half of the held-out rows and scored
on the other, both ways round, and averaged. A map fitted and scored on the same rows would reward
wide students for over-fitting (a 385×384 map on a few hundred tokens); one split alone is noisy.
Each pair's MSE is divided by the variance of that teacher layer over the scored rows, so
predicting the teacher's mean scores 1.0 and a perfect student 0.0. `rows` scores only the first
rows (a cheaper interim estimate while training; the final one uses every row).
  raw        = Σ_pairs MSE                (Eq. 6, the paper's scale)
  normalized = mean_pairs MSE / Var(H^T)  (the value the KD-NAS reward uses)
  se         = standard error of `normalized` over the scored sequences (tokens of one sequence
               are not independent, so it is the ratio estimator's clustered error): the error bar
               of one held-out estimate, not of the proxy's seed (both measured: docs/benchmarks/proxy-fidelity.md)
"""

from __future__ import annotations

import torch
from torch import nn

from .activations import Needs
from .cache import TeacherCache
from .losses import layer_map
from .teachers import activations, model_dims

_RIDGE = 1e-2


class Evaluator:
    """Scores any student against one teacher's cached held-out activations."""

    def __init__(self, cache: TeacherCache, *, strategy: str = "uniform", batch_size: int = 32) -> None:
        self.cache = cache
        self.strategy = strategy
        self.batch_size = batch_size

    def pairs(self, n_student: int) -> list[tuple[int, int]]:
        mapping = layer_map(self.strategy, self.cache.teacher.dims.layers, n_student)
        return [(i + 1, j) for i, targets in enumerate(mapping) for j in targets]

    @torch.no_grad()
    def __call__(self, student: nn.Module, rows: int | None = None) -> dict[str, float]:
        pairs = self.pairs(model_dims(student).layers)
        teacher_needs = Needs(hidden=frozenset(j for _, j in pairs))
        student_needs = Needs(hidden=frozenset(i for i, _ in pairs))
        ids, mask = self.cache.data.split("eval")
        if rows is not None and rows < ids.shape[0]:
            ids, mask = ids[: max(rows, 2)], mask[: max(rows, 2)]
        device = next(student.parameters()).device
        was_training = student.training
        student.eval()
        s_states: dict[int, list[torch.Tensor]] = {i: [] for i in student_needs.hidden}
        for start in range(0, ids.shape[0], self.batch_size):
            acts = activations(student, ids[start : start + self.batch_size].to(device),
                               mask[start : start + self.batch_size].to(device), student_needs)
            for i in s_states:
                s_states[i].append(acts.hidden[i].float().cpu())
        student.train(was_training)
        teacher = self.cache.batch("eval", torch.arange(ids.shape[0]), teacher_needs)

        half = ids.shape[0] // 2
        first, second = torch.arange(ids.shape[0]) < half, torch.arange(ids.shape[0]) >= half
        real = mask.bool()
        raw, normalized = 0.0, []
        row_error = torch.zeros(ids.shape[0], dtype=torch.float64)  # Σ over pairs of normalized error per row
        for i, j in pairs:
            x = torch.cat(s_states[i]).double()
            y = teacher.hidden[j].double()
            mse, var, per_row = 0.0, 0.0, torch.zeros_like(row_error)
            for fit, score in ((first, second), (second, first)):
                w = _ridge_fit(x[fit][real[fit]], y[fit][real[fit]])
                xs, ys = x[score][real[score]], y[score][real[score]]
                squared = ((_with_bias(xs) @ w - ys) ** 2).mean(dim=1)  # per real token
                mse += squared.mean().item() / 2
                var += ys.var(dim=0, unbiased=False).mean().item() / 2
                rows_of = torch.arange(ids.shape[0])[score].repeat_interleave(real[score].sum(1))
                per_row.index_add_(0, rows_of, squared)
            raw += mse
            normalized.append(mse / max(var, 1e-12))
            row_error += per_row / max(var, 1e-12) / len(pairs)
        return {"l_hs_raw": raw, "l_hs_norm": sum(normalized) / len(normalized),
                "l_hs_se": _clustered_se(row_error, real.sum(1).double())}


def _clustered_se(totals: torch.Tensor, counts: torch.Tensor) -> float:
    """Standard error of the ratio Σ totals / Σ counts over n clusters (rows): the linearised
    (delta-method) estimator, sqrt(n/(n−1) · Σ (t_r − μ c_r)²) / Σ c_r."""
    n = totals.numel()
    if n < 2:
        return float("nan")
    mu = totals.sum() / counts.sum()
    return float(((totals - mu * counts).pow(2).sum() * n / (n - 1)).sqrt() / counts.sum())


def _with_bias(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)


def _ridge_fit(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    xb = _with_bias(x)
    gram = xb.T @ xb
    # Ridge scaled to the data so the fit is stable for nearly collinear (e.g. untrained) students.
    gram += _RIDGE * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    return torch.linalg.solve(gram, xb.T @ y)
