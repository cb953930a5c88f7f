"""`profile`: resolve a target, look it up in the cache, else measure it in a pinned subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kdnas.core.errors import InputError, LatencyError, check_choice
from kdnas.core.files import atomic_write_text, ensure_writable_dir, staged_folder
from kdnas.core.host import cpu_info, int8_extensions
from kdnas.core.quiet import quiet_host, reserved_latency_cores
from kdnas.core.sentence import usable_positions
from kdnas.core.spec import StudentSpec, parse_arch

# onnxruntime-int8: the graph users deploy on CPU, `kdnas export --int8`'s recipe (export.int8_recipe),
# timed by onnxruntime; an .onnx file given is timed as it is.
RUNTIMES = ("onnxruntime", "onnxruntime-int8", "torch")


def onnx_runtime(runtime: str) -> bool:
    """Whether `runtime` times an ONNX graph in onnxruntime (the worker's "onnxruntime")."""
    return runtime.startswith("onnxruntime")


def _worker_runtime(runtime: str) -> str:
    return "onnxruntime" if onnx_runtime(runtime) else runtime
MAX_CV = 0.10  # above this spread a measurement is retried, then flagged noisy
RETRIES = 2
BLOCKS = 3  # timed blocks per measurement; the least disturbed one is reported
# Bumped when the way a figure is measured changes, so cached figures from the old way are not mixed in.
PROTOCOL = 4  # 4: every session of a measuring process on one onnxruntime thread pool


@dataclass(frozen=True)
class LatencyResult:
    """One latency measurement (milliseconds per forward pass of one batch)."""

    median_ms: float
    p90_ms: float
    min_ms: float
    mean_ms: float
    cv: float
    runs: int
    noisy: bool
    batch: int
    seq: int
    threads: int
    runtime: str
    cpu: str
    versions: dict[str, str]
    cached: bool
    key: str
    target: str = ""
    optimized: bool = False
    int8: bool = False
    stable: bool = True
    attempts: int = 1
    fused: dict[str, int] = field(default_factory=dict)
    block_medians: list[float] = field(default_factory=list)
    cores: list[int] = field(default_factory=list)  # the cores the timed runs were pinned to
    window: list[float] = field(default_factory=list)  # [start, end] of the timed runs, seconds since the epoch
    # Not read but predicted by a target profile (`latency.TargetProfile`): its interval, and nothing was timed.
    predicted: bool = False
    interval_ms: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def scaled(self, factor: float) -> "LatencyResult":
        """These timings multiplied by `factor` (this result itself for 1.0): a reading put on the
        scale of another moment's host speed."""
        if factor == 1.0:
            return self
        timings = ("median_ms", "p90_ms", "min_ms", "mean_ms")
        return replace(self, **{name: getattr(self, name) * factor for name in timings},
                       interval_ms=[v * factor for v in self.interval_ms])

    def summary(self) -> str:
        flavour = self.runtime
        if self.runtime == "onnxruntime":
            flavour += " int8" if self.int8 else (" optimized" if self.optimized else " fp32")
        flags = (" NOISY" if self.noisy else "") + (" (cached)" if self.cached else "")
        return (f"{self.target}  {flavour}  batch={self.batch} seq={self.seq} threads={self.threads}: "
                f"median {self.median_ms:.2f} ms, p90 {self.p90_ms:.2f}, min {self.min_ms:.2f}, "
                f"cv {100 * self.cv:.1f}% over {self.runs} runs{self._blocks()}{flags}")

    def _blocks(self) -> str:
        if len(self.block_medians) < 2:
            return ""
        medians = ", ".join(f"{m:.2f}" for m in self.block_medians)
        return f"; best of {len(self.block_medians)} blocks (medians {medians} ms)"


def profile(
    target,
    *,
    batch: int = 1,
    seq: int = 128,
    threads: int = 2,
    runtime: str = "onnxruntime",
    optimized: bool = True,
    int8: bool = False,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    timeout: float = 900.0,
) -> LatencyResult:
    """CPU latency of `target` at one shape, measured in a separate process pinned to `threads` cores.

    `target`: a `StudentSpec`, an architecture string ("4x12x192x768"), a model folder, a bundled
    teacher name, or an .onnx file (measured as is). Folders and specs are built with random weights
    and exported (optimized/int8 as asked), since weights do not change latency. Results are cached
    by (architecture or file hash, runtime and flavour, batch, seq, threads, CPU, library versions).
    """
    check_settings(batch, seq, threads, runtime)
    resolved = _resolve(target)
    _check_target(resolved, runtime, seq, "the model's")
    onnx_flavour = onnx_runtime(runtime)
    int8 = int8 or runtime == "onnxruntime-int8"
    cpu, versions = cpu_name(), library_versions(runtime)
    identity = {
        "target": resolved["identity"], "runtime": runtime, "batch": batch, "seq": seq, "threads": threads,
        "optimized": bool(optimized) and onnx_flavour and resolved["kind"] != "onnx",
        "int8": bool(int8) and onnx_flavour and resolved["kind"] != "onnx", "cpu": cpu, "versions": versions,
        "protocol": PROTOCOL,
    }
    if identity["int8"]:  # an INT8 reading is of one quantization recipe: a new recipe is a new reading
        from kdnas.export import int8_recipe

        identity["int8_recipe"] = int8_recipe()
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    cache_file = _cache_file(cache_dir, key, use_cache)
    cached = _read_cache(cache_file) if use_cache else None
    if cached is not None:
        return cached
    request = {
        "target": resolved["worker"], "runtime": _worker_runtime(runtime), "batch": batch, "seq": seq,
        "threads": threads, "vocab_size": resolved["vocab_size"], "max_cv": MAX_CV, "retries": RETRIES, "blocks": BLOCKS,
    }
    cached, stats, fused = _measure(request, resolved, identity, cache_file if use_cache else None, timeout)
    if cached is not None:
        return cached
    result = LatencyResult(
        median_ms=stats["median_ms"], p90_ms=stats["p90_ms"], min_ms=stats["min_ms"], mean_ms=stats["mean_ms"],
        cv=stats["cv"], runs=stats["runs"], noisy=not stats["quiet"], batch=batch, seq=seq,
        threads=threads, runtime=runtime, cpu=cpu, versions=versions, cached=False, key=key,
        target=resolved["label"], optimized=identity["optimized"], int8=identity["int8"], stable=stats["stable"],
        attempts=stats["attempts"], fused=fused, block_medians=stats["block_medians"],
        cores=stats["cores"], window=stats["window"],
    )
    if use_cache and not result.noisy:  # a busy machine's figure must not outlive the load that made it
        atomic_write_text(cache_file, json.dumps(result.to_dict(), indent=1))
    return result


def _cache_file(cache_dir: str | os.PathLike | None, key: str, use_cache: bool) -> Path:
    """Where a reading is cached; checked before measuring, so a cache that cannot be written is one
    line up front, not a traceback after the measurement."""
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if use_cache:
        hint = "; give another --cache-dir, or --no-cache" if cache_dir is not None else \
            "; set KDNAS_CACHE to a folder you can write"
        ensure_writable_dir(folder, "latency cache folder", hint)
    return folder / f"{key}.json"


@dataclass(frozen=True)
class PairResult:
    """`target` timed beside `reference` in one process, in alternating rounds (`profile_pair`)."""

    ratio: float  # target / reference: the median over rounds of each round's ratio of medians
    ratio_low: float  # the round ratios' quartiles
    ratio_high: float
    rounds: int
    target: LatencyResult  # each one's runs over all the rounds
    reference: LatencyResult

    @property
    def target_ms(self) -> float:
        return self.target.median_ms

    @property
    def reference_ms(self) -> float:
        return self.reference.median_ms

    def to_dict(self) -> dict:
        return asdict(self)

    def on_scale(self, reference_ms: float) -> LatencyResult:
        """The target's timings as they stand beside a reference that reads `reference_ms`: its median
        is `ratio × reference_ms`, its other figures move with it."""
        return self.target.scaled(self.ratio * reference_ms / self.target.median_ms)

    def summary(self) -> str:
        t = self.target
        return (f"{t.target} beside {self.reference.target}  {t.runtime}  batch={t.batch} seq={t.seq} "
                f"threads={t.threads}: {self.ratio:.3f}x (rounds' quartiles {self.ratio_low:.3f}-"
                f"{self.ratio_high:.3f}; medians {self.target_ms:.2f} and {self.reference_ms:.2f} ms, "
                f"{self.rounds} alternating rounds)")


def profile_pair(target, reference, *, batch: int = 1, seq: int = 128, threads: int = 2,
                 runtime: str = "onnxruntime", optimized: bool = True, rounds: int = 12, runs: int = 15,
                 timeout: float = 900.0) -> PairResult:
    """`target`'s latency relative to `reference`'s, the two timed in alternation in one pinned
    process (`_stats.measure_pair`): what a budget set as a share of a teacher's latency needs on a
    host whose speed drifts between two separate measurements. Targets as for `profile`; never cached."""
    check_settings(batch, seq, threads, runtime)
    resolved = {"target": _resolve(target), "reference": _resolve(reference)}
    for r in resolved.values():
        _check_target(r, runtime, seq, f"{r['label']}'s")
    vocabs = [r["vocab_size"] for r in resolved.values() if r["vocab_size"]]
    request = {"target": resolved["target"]["worker"], "reference": resolved["reference"]["worker"],
               "runtime": _worker_runtime(runtime), "batch": batch, "seq": seq, "threads": threads,
               "vocab_size": min(vocabs) if vocabs else None, "pair": {"rounds": rounds, "runs": runs}}
    if onnx_runtime(runtime):
        for key, r in resolved.items():
            if r["kind"] != "onnx":
                graph = _exported_graph(r, optimized, int8=runtime == "onnxruntime-int8")
                request[key] = {"kind": "onnx", "path": str(graph)}
    with quiet_host():
        reply = _run_worker(request, threads, timeout)
    common = {"batch": batch, "seq": seq, "threads": threads, "runtime": runtime, "cpu": cpu_name(),
              "versions": library_versions(runtime), "cached": False, "key": "", "cores": reply["cores"],
              "window": reply["window"], "noisy": False}
    timed = {key: LatencyResult(**{k: reply[key][k] for k in ("median_ms", "p90_ms", "min_ms", "mean_ms", "cv",
                                                             "runs")}, target=resolved[key]["label"], **common)
             for key in ("target", "reference")}
    return PairResult(ratio=reply["ratio"], ratio_low=reply["ratio_low"], ratio_high=reply["ratio_high"],
                      rounds=reply["rounds"], **timed)


def random_weight_graph(target, *, int8: bool = False, optimized: bool = True) -> Path:
    """The ONNX graph `profile` times for a shape or model folder (random weights; INT8 with `int8`), built once
    per cache: what a caller times beside another graph of its own choosing (`profile_pair` with two files)."""
    resolved = _resolve(target)
    return Path(resolved["worker"]["path"]) if resolved["kind"] == "onnx" else _exported_graph(resolved, optimized, int8)


def _exported_graph(resolved: dict, optimized: bool, int8: bool = False) -> Path:
    """The random-weight ONNX graph of a shape or model folder (INT8 with `int8`), exported once per
    cache: a teacher timed beside each finalist costs its export (about 5 s for MiniLM) only the first time."""
    identity = {"target": resolved["identity"], "optimized": optimized, "versions": library_versions("onnxruntime")}
    if int8:
        from kdnas.export import int8_recipe

        identity["int8_recipe"] = int8_recipe()
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    graph = default_cache_dir() / "graphs" / key / ("model.int8.onnx" if int8 else "model.onnx")
    if graph.is_file():
        return graph
    # The optimizer may write the weights beside the graph, so the folder is built whole and renamed in;
    # another process that moved the same graph in first keeps its own.
    with staged_folder(graph.parent, keep_existing=True) as stage:
        _graph_to_time(resolved["worker"], optimized, int8, stage)
    if not graph.is_file():
        raise LatencyError(f"the graph cache folder {graph.parent} has no {graph.name}; remove the folder and run again")
    return graph


def _measure(request: dict, resolved: dict, identity: dict, cache_file: Path | None,
             timeout: float) -> tuple[LatencyResult | None, dict, dict[str, int]]:
    """One at a time per host, training on its cores paused: the cache re-read after the wait (another
    worker may have measured the same graph), else the graph built and timed by the pinned worker.
    Returns (the cached result or None, the worker's figures, what the optimizer fused)."""
    with quiet_host(), tempfile.TemporaryDirectory(prefix="kdnas-latency-") as tmp:
        cached = _read_cache(cache_file) if cache_file is not None else None
        if cached is not None:
            return cached, {}, {}
        fused: dict[str, int] = {}
        if onnx_runtime(request["runtime"]) and resolved["kind"] != "onnx":
            request["target"], fused = _graph_to_time(resolved["worker"], identity["optimized"], identity["int8"],
                                                      Path(tmp))
        return None, _run_worker(request, request["threads"], timeout), fused


def _graph_to_time(target: dict, optimized: bool, int8: bool, folder: Path) -> tuple[dict, dict[str, int]]:
    """Export a shape or model folder with random weights (they do not change latency) to the ONNX
    graph the worker times, and say what the optimizer fused. Built here, not in the pinned worker:
    the worker then loads onnxruntime alone, not torch and transformers, which saves about half of
    a reading's wall time (12.9 s → 6.5 s for 3x12x384x1024 on a 2-core EPYC); the timed runs are
    the same."""
    from kdnas.core.errors import KdnasError
    from kdnas.export import export_onnx, quantize_int8

    from ._worker import random_model

    try:
        graph = export_onnx(random_model(target), folder / "model.onnx", optimize=optimized)
        path = Path(graph.path)
        if int8:
            quantize_int8(path, folder / "model.int8.onnx")
            path = folder / "model.int8.onnx"
    except KdnasError:
        raise
    except Exception as err:  # torch.onnx / the ORT optimizer raise their own types
        raise LatencyError(f"could not build the graph to time: {type(err).__name__}: {_one_line(err)}") from None
    return {"kind": "onnx", "path": str(path)}, graph.fused


def _read_cache(cache_file: Path) -> LatencyResult | None:
    """A cached quiet measurement; None for none, a damaged or stale entry, or a noisy one (an older
    version cached those), which are measured again and overwritten."""
    try:
        cached = LatencyResult(**{**json.loads(cache_file.read_text()), "cached": True})
    except (OSError, ValueError, TypeError):
        return None
    return None if cached.noisy else cached


def check_settings(batch: int, seq: int, threads: int, runtime: str, flags: dict[str, str] | None = None) -> None:
    """Settings any reading needs, whatever the model: refused before anything is built or timed.
    `flags` names a setting by the command-line flag that set it (e.g. {"seq": "--latency-seq"})."""
    def named(name: str, value: object) -> str:
        return f"{flags[name]} {value!r}" if flags and name in flags else f"{name}={value!r}"

    for name, value in (("batch", batch), ("seq", seq), ("threads", threads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{named(name, value)} is invalid: must be a positive integer")
    # A `--workers` child trains pinned to fewer cores; its measurements run on the ones kept for them.
    available = len(set(os.sched_getaffinity(0)) | set(reserved_latency_cores() or ()))
    if threads > available:
        raise InputError(f"{named('threads', threads)} exceeds the {available} CPU cores available to this process")
    check_choice("runtime", runtime, RUNTIMES)


def max_tokens(target) -> int | None:
    """The longest sequence `target` (as for `profile`) can be timed at: its usable positions, or None
    where its graph does not say. Reads only its description (a config, a graph's inputs), builds nothing."""
    return _resolve(target)["max_seq"]


def _check_target(resolved: dict, runtime: str, seq: int, whose: str) -> None:
    """A resolved target the runtime can time at `seq` tokens, else one clear error (`whose` positions)."""
    if runtime == "torch" and resolved["kind"] == "onnx":
        raise InputError("runtime torch needs a model folder or an architecture, not an .onnx file")
    if resolved["max_seq"] is not None and seq > resolved["max_seq"]:
        raise InputError(f"seq={seq} exceeds {whose} {resolved['max_seq']} positions")


def default_cache_dir() -> Path:
    from kdnas.core.assets import cache_root

    return cache_root() / "latency"


def cpu_model() -> str:
    """The CPU model's name: latencies measured on two different models do not compare."""
    return cpu_info()[0]


def cpu_name() -> str:
    """CPU model, core count and the int8 dot-product extensions that decide INT8 speed."""
    extensions = int8_extensions()
    return f"{cpu_model()} ({os.cpu_count()} cpus{', ' + ', '.join(extensions) if extensions else ''})"


def library_versions(runtime: str) -> dict[str, str]:
    import onnxruntime
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__.split("+")[0]}
    if onnx_runtime(runtime):
        versions["onnxruntime"] = onnxruntime.__version__
    return versions


def _resolve(target) -> dict:
    """-> kind, a cache identity, a label, what the worker needs, the usable positions and vocab."""
    if isinstance(target, StudentSpec):
        return _from_spec(target)
    text = str(target)
    path = Path(text).expanduser()
    if text.endswith(".onnx") or path.is_file():
        return _from_onnx(path)
    from kdnas.core.assets import TEACHERS, teacher_path

    if text in TEACHERS:
        path = Path(teacher_path(text))
    if path.is_dir():
        return _from_folder(path, text)
    if text.startswith((".", "/", "~")) or os.sep in text:
        raise InputError(f"model {text!r} does not exist")
    if not any(c.isdigit() for c in text):
        raise InputError(
            f"{text!r} is not an existing .onnx file or model folder, a bundled teacher ({', '.join(TEACHERS)}), "
            "or an architecture LAYERSxHEADSxHIDDENxFFN such as 4x12x192x768"
        )
    return _from_spec(parse_arch(text))  # raises a KdnasError naming what is wrong with the shape


def _from_spec(spec: StudentSpec) -> dict:
    sizes = asdict(spec)
    return {"kind": "spec", "identity": {"spec": sizes}, "label": spec.arch, "worker": {"kind": "spec", "spec": sizes},
            "max_seq": spec.max_position, "vocab_size": spec.vocab_size}


def _from_onnx(path: Path) -> dict:
    import onnx

    if not path.is_file():
        raise InputError(f"ONNX file {path} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError/ValueError/... for a damaged file
        raise InputError(f"ONNX file {path} cannot be read (corrupt or not ONNX): {_one_line(err)}") from None
    if not model.graph.node:
        raise InputError(f"ONNX file {path} has an empty graph (corrupt or not a model)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"kind": "onnx", "identity": {"onnx_sha256": digest}, "label": path.name,
            "worker": {"kind": "onnx", "path": str(path.resolve())},
            "max_seq": _embedding_rows(model, "position_embeddings"),
            "vocab_size": _embedding_rows(model, "word_embeddings")}


def _from_folder(path: Path, label: str) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InputError(f"model folder {path} has no config.json (not a transformers model folder)")
    try:
        config = json.loads(config_file.read_text())
        positions = usable_positions(config)
    except (ValueError, TypeError, AttributeError) as err:  # not JSON, not an object, a field not a number
        raise InputError(f"{config_file} is not a transformers config: {_one_line(err)}") from None
    # Weights do not change latency, the config does: key on its content, not on the weights file.
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return {"kind": "folder", "identity": {"config_sha256": digest}, "label": label,
            "worker": {"kind": "folder", "path": str(path.resolve())}, "max_seq": positions,
            "vocab_size": config.get("vocab_size")}


def _embedding_rows(model, name: str) -> int | None:
    """Rows of an embedding table found by its exported name; None for a graph that names it otherwise."""
    for init in model.graph.initializer:
        if name in init.name and len(init.dims) == 2:
            return int(init.dims[0])
    return None


def _run_worker(request: dict, threads: int, timeout: float) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kdnas.latency._worker"], input=json.dumps(request), capture_output=True,
            text=True, env=env, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise LatencyError(f"latency measurement did not finish within {timeout:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    reply = None
    if lines:
        try:
            reply = json.loads(lines[-1])
        except ValueError:
            pass
    if reply is not None and reply.get("user_error"):
        raise InputError(reply["error"])
    if proc.returncode != 0 or reply is None:
        raise LatencyError(f"latency worker failed (exit {proc.returncode}): {_last_line(proc.stderr)}")
    return reply


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _last_line(stderr: str) -> str:
    """A crashed worker's traceback ends with the exception itself: the one line worth showing."""
    return (stderr.strip().splitlines() or ["no output"])[-1]
