"""CPU latency of an encoder at one shape, measured in a pinned subprocess, cached.

    from kdnas.latency import profile
    res = profile("4x12x192x768", batch=1, seq=128, threads=2)   # or a StudentSpec, folder, .onnx
    res.median_ms, res.p90_ms, res.cv, res.noisy, res.cached
    pair = profile_pair("3x12x384x1280", "minilm-l6")   # the two timed in alternation, one process
    pair.ratio, pair.ratio_low, pair.ratio_high
    model = fit_latency_model([Reading(Shape(3, 12, 384, 1280), 9.2), ...])   # six or more shapes
    model.predict(Shape(4, 12, 384, 768)).ms, .low, .high
    target = load_profile("epyc.json")   # `kdnas target`: the deployment CPU read once, then predicted
    target.predict(Composition.of_arch(Shape(3, 12, 384, 1536), int8=True)).ms, target.predict_graph("model.onnx")
"""

from kdnas.core.quiet import LATENCY_CORES_ENV

from ._profile import (LatencyResult, PairResult, check_settings, cpu_model, cpu_name, default_cache_dir,
                       library_versions, max_tokens, profile, profile_pair, random_weight_graph)
from ._model import LatencyModel, Prediction, Reading, Shape, fit_latency_model, kendall_tau, mape
from ._worker import latency_cores
from ._composition import Composition
from ._target import (DesignGraph, HeldOut, Host, Settings, TargetProfile, TargetReading, fitted_profile, load_profile,
                      read_design)

__all__ = ["profile", "profile_pair", "random_weight_graph", "check_settings", "max_tokens", "LatencyResult", "PairResult", "cpu_model", "cpu_name", "default_cache_dir", "library_versions",
           "LATENCY_CORES_ENV", "latency_cores",
           "LatencyModel", "Prediction", "Reading", "Shape", "fit_latency_model", "kendall_tau", "mape",
           "Composition", "DesignGraph", "HeldOut", "Host", "Settings", "TargetProfile", "TargetReading", "fitted_profile",
           "load_profile", "read_design"]
