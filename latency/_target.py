"""A target profile: the deployment CPU measured once, then every graph's latency predicted from it.

Hardware-aware NAS measures the target device once and searches with a predictor (HAT's latency predictor,
nn-Meter's per-device kernels, Once-for-All's latency tables). `make_profile` reads a designed set of graphs —
shapes across the teacher family's space, fp32, all-INT8 and precision plans — each timed in alternation with
the teacher's fp32 graph (`profile_pair`), so every reading is a ratio to the teacher taken in the same minute and
a host whose speed drifts during the readings moves both sides alike. Each ratio times the teacher's median over
all the pairs is one reading in milliseconds; the costs of `Composition.features` are fitted on the design
readings (non-negative least squares on the relative error, as `latency.fit_latency_model`) and the fit is
judged on held-out readings of graphs it never saw.

The profile is one small JSON file (`save` / `load_profile`) holding the host's fingerprint, the settings and
versions it was read with, the readings, the fit and its held-out error: a search on any host judges
latency by it (`kdnas search --target FILE`), and `kdnas profile GRAPH --target FILE` checks it against a reading.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from kdnas.core.errors import InputError
from kdnas.core.files import atomic_write_text
from kdnas.core.host import cpu_info, int8_extensions

from ._composition import FEATURES, Composition
from ._model import Prediction, Shape, _nnls

FORMAT = "kdnas-target-profile"
VERSION = 1
# A prediction's interval: this many leave-one-out relative errors either side, never tighter than FLOOR. A search
# on the profile's own host reads a graph whose interval holds the budget; elsewhere the interval is reported.
Z = 2.0
FLOOR = 0.03
# Side-by-side rounds per reading: fewer runs a round than `profile_pair`'s default (12 x 15), since the fit averages over
# some thirty readings; MPNet's pair then takes about 20 s on 2 cores.
ROUNDS, RUNS = 12, 10
# A reading whose rounds' ratios spread over this share of their median (their interquartile range) was disturbed by
# other work on the host: it is read again, up to READS times in all, and the least disturbed one kept. Measured:
# one MiniLM-L6 profile's unseen graphs read with spreads of 2-17 %, and the few over 8 % held most of its error.
SPREAD, READS = 0.08, 3


@dataclass(frozen=True)
class Settings:
    """What a reading depends on besides the graph and the host: a search on other settings cannot use it."""

    batch: int = 1
    seq: int = 128
    threads: int = 2
    runtime: str = "onnxruntime"


@dataclass(frozen=True)
class Host:
    """The host a profile was read on: its CPU model and the flags that decide INT8 speed, its core count and
    the library versions that time the graphs."""

    cpu: str
    flags: tuple[str, ...]
    cores: int
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def here(cls) -> "Host":
        from ._profile import library_versions

        return cls(cpu=cpu_info()[0], flags=tuple(int8_extensions()), cores=os.cpu_count() or 0,
                   versions=library_versions("onnxruntime"))

    def same_machine(self, other: "Host") -> bool:
        """Whether `other` is this kind of CPU with this runtime: where a reading would check the profile."""
        return (self.cpu, self.flags, self.versions.get("onnxruntime")) == \
            (other.cpu, other.flags, other.versions.get("onnxruntime"))


@dataclass(frozen=True)
class DesignGraph:
    """One graph of the design: a shape, all-INT8 or not, the groups a plan keeps fp32 (roles for every layer, or
    LAYER.ROLE), and whether the fit leaves it out to judge itself."""

    arch: str
    int8: bool = False
    fp32_groups: tuple[str, ...] = ()
    held_out: bool = False

    @property
    def label(self) -> str:
        if not self.int8:
            return f"{self.arch} fp32"
        return f"{self.arch} " + ("int8" if not self.fp32_groups else "plan fp32:" + "+".join(self.fp32_groups))

    def composition(self) -> Composition:
        from kdnas.core.spec import parse_arch

        return Composition.of_arch(Shape.of(parse_arch(self.arch)), int8=self.int8, fp32_groups=self.fp32_groups)


@dataclass(frozen=True)
class TargetReading:
    """A design graph read beside the teacher: the round ratios' median and quartiles, the teacher's median in
    that pair, and the graph's milliseconds on the profile's scale (ratio x `TargetProfile.teacher_ms`)."""

    graph: DesignGraph
    ratio: float
    ratio_low: float
    ratio_high: float
    teacher_ms: float
    ms: float = 0.0


@dataclass(frozen=True)
class HeldOut:
    """The fit judged on readings it did not see: each graph's relative error, their median absolute value and
    the share within ±5 %."""

    errors: dict[str, float]
    median_abs_error: float
    within_5pct: float


@dataclass(frozen=True)
class TargetProfile:
    """One deployment target: host, settings, the teacher it was read beside, the readings and the fit."""

    teacher: str
    teacher_arch: str
    settings: Settings
    host: Host
    teacher_ms: float  # the teacher's fp32 graph, the median over every pair's teacher median
    coef: tuple[float, ...]
    rel_error: float  # root mean square of the design readings' leave-one-out relative errors
    readings: tuple[TargetReading, ...]
    held_out: HeldOut | None
    seconds: float = 0.0
    made_at: float = 0.0
    format: str = FORMAT
    version: int = VERSION

    def predict(self, what: Composition) -> Prediction:
        ms = float(what.features(batch=self.settings.batch, seq=self.settings.seq) @ np.array(self.coef))
        half = max(FLOOR, Z * self.rel_error)
        return Prediction(ms=ms, low=ms * (1 - half), high=ms * (1 + half))

    def predict_graph(self, graph: str | os.PathLike) -> Prediction:
        """An exported graph (fp32, INT8 or a plan), read as `Composition.of_graph`."""
        return self.predict(Composition.of_graph(graph, head_size=self.head_size))

    @property
    def head_size(self) -> int:
        from kdnas.core.spec import parse_arch

        spec = parse_arch(self.teacher_arch)
        return spec.hidden // spec.heads

    def mismatch(self, settings: Settings, teacher: str | None = None) -> str | None:
        """Why this profile cannot judge a search on `settings` (and `teacher`), in words; None where it can."""
        for name in ("batch", "seq", "threads"):
            if getattr(settings, name) != getattr(self.settings, name):
                return f"it was read at {name} {getattr(self.settings, name)}, not {name} {getattr(settings, name)}"
        if not settings.runtime.startswith("onnxruntime"):
            return f"it prices onnxruntime graphs, not {settings.runtime}"
        if teacher is not None and teacher != self.teacher:
            return f"it was read beside teacher {self.teacher}, not {teacher}"
        return None

    def version_note(self, here: Host) -> str | None:
        """A line where the profile was read with other library versions than this host has (its readings may
        not hold for the graphs this host's versions export); None where they agree."""
        differ = [f"{k} {v} (here {here.versions.get(k, 'none')})" for k, v in self.host.versions.items()
                  if k != "python" and here.versions.get(k) != v]
        return None if not differ else "the profile was read with " + ", ".join(differ)

    def to_json(self) -> dict:
        return asdict(self)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_json(), indent=1))
        return path


def load_profile(path: str | os.PathLike) -> TargetProfile:
    """A profile file as `TargetProfile.save` wrote it; anything else (missing, truncated, another tool's JSON,
    a newer format) is one line naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise InputError(f"--target {path}: cannot be read ({err.strerror or err})") from None
    except ValueError:
        raise InputError(f"--target {path}: not a kdnas target profile (not JSON, or truncated)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"--target {path}: not a kdnas target profile (made by `kdnas target --out FILE`)")
    if data.get("version") != VERSION:
        raise InputError(f"--target {path}: profile version {data.get('version')!r}; this kdnas reads version "
                         f"{VERSION}: make it again with `kdnas target`")
    try:
        return _from_json(data)
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"--target {path}: a damaged profile ({type(err).__name__}: {err}); make it again") from None


def _from_json(data: dict) -> TargetProfile:
    readings = tuple(TargetReading(**{**r, "graph": DesignGraph(**{**r["graph"], "fp32_groups": tuple(
        r["graph"]["fp32_groups"])})}) for r in data["readings"])
    held = data["held_out"]
    host = data["host"]
    profile = TargetProfile(
        teacher=str(data["teacher"]), teacher_arch=str(data["teacher_arch"]), settings=Settings(**data["settings"]),
        host=Host(**{**host, "flags": tuple(host["flags"])}), teacher_ms=float(data["teacher_ms"]),
        coef=tuple(float(c) for c in data["coef"]), rel_error=float(data["rel_error"]), readings=readings,
        held_out=None if held is None else HeldOut(**held), seconds=float(data.get("seconds", 0.0)),
        made_at=float(data.get("made_at", 0.0)))
    if len(profile.coef) != len(FEATURES) or not profile.teacher_ms > 0:
        raise ValueError(f"{len(profile.coef)} costs for {len(FEATURES)} features, teacher {profile.teacher_ms} ms")
    return profile


# -- reading and fitting --------------------------------------------------------------------------------------


def fit(readings: Sequence[TargetReading], settings: Settings) -> tuple[tuple[float, ...], float]:
    """The costs fitted on `readings` (the design, not the held-out ones) and the leave-one-out relative error."""
    rows = np.stack([r.graph.composition().features(batch=settings.batch, seq=settings.seq) for r in readings])
    ms = np.array([r.ms for r in readings])
    scaled = rows / ms[:, None]  # dividing each row by its reading makes the residual relative
    errors = []
    for i in range(len(readings)):
        keep = np.arange(len(readings)) != i
        coef = _nnls(scaled[keep], np.ones(int(keep.sum())))
        errors.append((rows[i] @ coef - ms[i]) / ms[i])
    coef = _nnls(scaled, np.ones(len(readings)))
    return tuple(float(c) for c in coef), float(np.sqrt(np.mean(np.square(errors))))


def fitted_profile(teacher: str, teacher_arch: str, settings: Settings, host: Host,
                   readings: Sequence[TargetReading], seconds: float = 0.0) -> TargetProfile:
    """The profile of `readings` (ratios to the teacher): milliseconds on the scale of the teacher's median over
    every pair, the fit on the design readings, its error on the held-out ones."""
    teacher_ms = statistics.median(r.teacher_ms for r in readings)
    scaled = tuple(replace(r, ms=r.ratio * teacher_ms) for r in readings)
    design = [r for r in scaled if not r.graph.held_out]
    if len(design) <= len(FEATURES):
        raise InputError(f"a target profile needs more than {len(FEATURES)} design graphs; {len(design)} given")
    coef, rel = fit(design, settings)
    profile = TargetProfile(teacher=teacher, teacher_arch=teacher_arch, settings=settings, host=host,
                            teacher_ms=teacher_ms, coef=coef, rel_error=rel, readings=scaled, held_out=None,
                            seconds=round(seconds, 1), made_at=time.time())
    held = [r for r in scaled if r.graph.held_out]
    if not held:
        return profile
    errors = {r.graph.label: round((profile.predict(r.graph.composition()).ms - r.ms) / r.ms, 4) for r in held}
    absolute = [abs(e) for e in errors.values()]
    return replace(profile, held_out=HeldOut(errors, round(statistics.median(absolute), 4),
                                             round(sum(a <= 0.05 for a in absolute) / len(absolute), 4)))


def read_design(design: Sequence[DesignGraph], teacher: str, sizes: dict, settings: Settings,
                on_reading: Callable[[int, TargetReading], None] | None = None) -> list[TargetReading]:
    """Each design graph built with random weights and timed beside the teacher's fp32 graph."""
    from ._profile import profile_pair, random_weight_graph

    teacher_graph = random_weight_graph(teacher)
    out = []
    for i, graph in enumerate(design):
        path = _design_graph(graph, sizes)
        pairs = [profile_pair(path, teacher_graph, batch=settings.batch, seq=settings.seq, threads=settings.threads,
                              rounds=ROUNDS, runs=RUNS)]
        while len(pairs) < READS and min(_spread(p) for p in pairs) > SPREAD:  # disturbed: read again
            pairs.append(profile_pair(path, teacher_graph, batch=settings.batch, seq=settings.seq,
                                      threads=settings.threads, rounds=ROUNDS, runs=RUNS))
        pair = min(pairs, key=_spread)
        reading = TargetReading(graph, round(pair.ratio, 5), round(pair.ratio_low, 5), round(pair.ratio_high, 5),
                                round(pair.reference_ms, 4))
        out.append(reading)
        if on_reading is not None:
            on_reading(i, reading)
    return out


def _spread(pair) -> float:
    """A side-by-side reading's rounds' interquartile range, as a share of its ratio."""
    return (pair.ratio_high - pair.ratio_low) / pair.ratio


def _design_graph(graph: DesignGraph, sizes: dict) -> Path:
    """The random-weight ONNX graph of a design graph: the shape's fp32 or all-INT8 graph (cached with every
    reading's graphs), or a plan's, written beside the all-INT8 one."""
    from kdnas.core.spec import parse_arch
    from kdnas.export import Plan, plan_graph, weight_groups

    from ._profile import random_weight_graph

    spec = parse_arch(graph.arch, **sizes)
    if not graph.fp32_groups:
        return random_weight_graph(spec, int8=graph.int8)
    fp32, int8 = random_weight_graph(spec), random_weight_graph(spec, int8=True)
    groups = weight_groups(fp32)
    kept = tuple(g.name for g in groups if g.name in graph.fp32_groups or g.role in graph.fp32_groups)
    out = int8.parent / ("plan-" + "+".join(sorted(graph.fp32_groups)) + ".onnx")
    if not out.is_file():
        plan_graph(fp32, int8, out, Plan(kept), groups)
    return out
