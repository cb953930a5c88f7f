"""The KD-NAS reward (Udagawa et al. 2023, App. C, Eq. 12; docs/methods.md "KD-NAS reward").

    reward(S) = (1 - L_HS) * (lat(S) / (target_ratio * lat(T))) ** exponent

It is a soft, MnasNet-style latency term: with the default exponent -0.06 a student 4.2x faster
than the target earns only ~9 % more. The hard deployment budget is a separate constraint
(see `nas/trial.py`), never folded into this number.
"""

from __future__ import annotations

import math

from kdnas.core.errors import InputError


def kdnas_reward(
    loss: float,
    student_latency: float,
    teacher_latency: float,
    target_ratio: float = 0.6,
    exponent: float = -0.06,
) -> float:
    """KD-NAS reward from the proxy's loss and two measured latencies.

    `loss` is the paper's normalized L_HS (1.0 = predicting the mean) with `--proxy hs`, or 1 − the
    embedding fidelity ρ with the default fidelity proxy (nas/proxy.py); 0 is the teacher itself.
    Latencies are in the same unit and were measured with the same runtime, threads, batch and
    sequence length.
    """
    for name, value in (("student_latency", student_latency), ("teacher_latency", teacher_latency),
                        ("target_ratio", target_ratio)):
        if not math.isfinite(value) or value <= 0:
            raise InputError(f"kdnas_reward: {name}={value!r} must be a positive finite number")
    if not math.isfinite(loss):
        raise InputError(f"kdnas_reward: loss={loss!r} must be finite")
    if not math.isfinite(exponent):
        raise InputError(f"kdnas_reward: exponent={exponent!r} must be finite")
    return (1.0 - loss) * (student_latency / (target_ratio * teacher_latency)) ** exponent
