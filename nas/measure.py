"""CPU latency with one fixed set of settings for the teacher, every candidate and the winner.

The KD-NAS reward compares student and teacher latencies, so both must come from the same runtime,
threads, batch and sequence length (docs/methods.md); this is the one place that calls
`latency.profile` for the search.
"""

from __future__ import annotations

from typing import Any

from .config import SearchConfig


def measure(target: Any, config: SearchConfig) -> Any:
    """Profile a StudentSpec (random weights) or a model folder; returns a `latency.LatencyResult`."""
    from latency import profile

    return profile(target, batch=config.latency_batch, seq=config.latency_seq, threads=config.threads,
                   runtime=config.runtime)


def latency_record(result: Any) -> dict[str, Any]:
    """The latency facts a trial keeps (JSON-safe)."""
    return {
        "median_ms": float(result.median_ms),
        "p90_ms": float(result.p90_ms),
        "min_ms": float(result.min_ms),
        "cv": float(result.cv),
        "noisy": bool(result.noisy),
        "cached": bool(result.cached),
        "cores": list(result.cores),
        "window": list(result.window),
    }
