"""CPU latency of an encoder at one shape, measured in a pinned subprocess, cached.

    from latency import profile
    res = profile("4x12x192x768", batch=1, seq=128, threads=2)   # or a StudentSpec, folder, .onnx
    res.median_ms, res.p90_ms, res.cv, res.noisy, res.cached
"""

from core.quiet import LATENCY_CORES_ENV

from ._profile import LatencyResult, cpu_model, default_cache_dir, library_versions, profile
from ._worker import latency_cores

__all__ = ["profile", "LatencyResult", "cpu_model", "default_cache_dir", "library_versions", "LATENCY_CORES_ENV", "latency_cores"]
