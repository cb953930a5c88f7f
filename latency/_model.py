"""A latency model: an encoder's latency predicted from its shape, fitted on readings of the same host.

A search measures every shape it proposes, and a measurement (export, warm-up, pinned timing) is the slow
part of a trial. Latency on one runtime, host, batch and sequence length is close to a sum of costs that
scale with the shape: the dense products (L·T·(4h² + 2hf) multiply-adds over T = batch × seq tokens),
attention's score and mix products (L·batch·seq²·h), the element-wise work of LayerNorm, GELU and softmax
(L·T·(h + f) and L·batch·heads·seq²), a fixed cost per layer (kernel launches) and one per call (embedding
lookup, pooling, the session). Each cost's coefficient is fitted, non-negative, by least squares on the
*relative* error (a 2 ms and a 200 ms reading count alike), so a fit never predicts that more work is faster.

Its uncertainty is read from the fit itself: the leave-one-out relative errors of the readings it was fitted
on. `Prediction.low` / `.high` bound the latency at `z` of those errors (and never tighter than `floor`);
a caller measures where that interval holds the budget and trusts the prediction where it does not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Below this many readings a fit of five costs has too few degrees of freedom to judge its own error.
MIN_READINGS = 6
FEATURES = ("call", "layer", "dense", "attention", "elementwise")


@dataclass(frozen=True)
class Shape:
    """What the model reads of an encoder: layers, heads, hidden, FFN (the `LxAxHxF` of a student)."""

    layers: int
    heads: int
    hidden: int
    ffn: int

    @classmethod
    def of(cls, spec) -> "Shape":
        return cls(int(spec.layers), int(spec.heads), int(spec.hidden), int(spec.ffn))

    @classmethod
    def of_config(cls, config: dict) -> "Shape":
        """The shape a transformers `config.json` (as a dict) describes."""
        return cls(int(config["num_hidden_layers"]), int(config["num_attention_heads"]), int(config["hidden_size"]),
                   int(config["intermediate_size"]))


@dataclass(frozen=True)
class Reading:
    """One measured latency of a shape (milliseconds, the median of a `latency.profile`)."""

    shape: Shape
    ms: float


@dataclass(frozen=True)
class Prediction:
    ms: float
    low: float
    high: float

    def straddles(self, budget_ms: float) -> bool:
        return self.low <= budget_ms < self.high


def features(shape: Shape, *, batch: int = 1, seq: int = 128) -> np.ndarray:
    """The five costs of `FEATURES` for one call, in units that keep their coefficients near one."""
    L, a, h, f = shape.layers, shape.heads, shape.hidden, shape.ffn
    tokens = batch * seq
    return np.array([
        1.0,
        L,
        L * tokens * (4 * h * h + 2 * h * f) / 1e9,
        L * batch * seq * seq * h * 2 / 1e9,
        L * (tokens * (h + f) + batch * a * seq * seq) / 1e6,
    ])


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns: the best unconstrained fit over every subset
    of columns whose coefficients come out non-negative (exact, as the optimum is one of them)."""
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y * y))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((x[:, cols] @ coef - y) ** 2))
            if err < best_err - 1e-15:
                best, best_err = np.zeros(x.shape[1]), err
                best[list(cols)] = coef
    return best


def _fit(rows: np.ndarray, ms: np.ndarray) -> np.ndarray:
    # Dividing each row by its reading makes the residual relative: (pred - y) / y.
    return _nnls(rows / ms[:, None], np.ones_like(ms))


@dataclass(frozen=True)
class LatencyModel:
    """A fitted model for one host, runtime, batch and sequence length."""

    coef: tuple[float, ...]
    batch: int
    seq: int
    readings: int
    rel_error: float  # root mean square of the leave-one-out relative errors
    z: float = 2.0
    floor: float = 0.05

    def predict(self, shape: Shape) -> Prediction:
        ms = float(features(shape, batch=self.batch, seq=self.seq) @ np.array(self.coef))
        half = max(self.floor, self.z * self.rel_error)
        return Prediction(ms=ms, low=ms * (1 - half), high=ms * (1 + half))


def fit_latency_model(readings: Sequence[Reading], *, batch: int = 1, seq: int = 128, z: float = 2.0,
                      floor: float = 0.05) -> LatencyModel | None:
    """The model of `readings` (one per distinct shape: repeated shapes are averaged), or None below
    `MIN_READINGS` distinct shapes."""
    by_shape: dict[Shape, list[float]] = {}
    for r in readings:
        if r.ms > 0 and math.isfinite(r.ms):
            by_shape.setdefault(r.shape, []).append(float(r.ms))
    if len(by_shape) < MIN_READINGS:
        return None
    shapes = list(by_shape)
    rows = np.stack([features(s, batch=batch, seq=seq) for s in shapes])
    ms = np.array([float(np.mean(by_shape[s])) for s in shapes])
    errors = []
    for i in range(len(shapes)):
        keep = np.arange(len(shapes)) != i
        coef = _fit(rows[keep], ms[keep])
        errors.append((rows[i] @ coef - ms[i]) / ms[i])
    coef = _fit(rows, ms)
    rel = float(np.sqrt(np.mean(np.square(errors))))
    return LatencyModel(tuple(float(c) for c in coef), batch, seq, len(shapes), rel, z, floor)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's τ-a of two equally long sequences (ties count as neither concordant nor discordant)."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    if not pairs:
        return float("nan")
    score = sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) for i, j in pairs)
    return float(score / len(pairs))


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    return float(np.mean([abs(p - m) / m for p, m in zip(predicted, measured)]))
