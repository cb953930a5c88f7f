"""CPU latency of an encoder at one shape, measured in a pinned subprocess, cached.

    from latency import profile
    res = profile("4x12x192x768", batch=1, seq=128, threads=2)   # or a StudentSpec, folder, .onnx
    res.median_ms, res.p90_ms, res.cv, res.noisy, res.cached
"""

from ._profile import LatencyResult, default_cache_dir, profile

__all__ = ["profile", "LatencyResult", "default_cache_dir"]
