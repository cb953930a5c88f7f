"""What one search is: nested frozen settings, and which of them define the study.

`SearchConfig` names what the study is of (teacher, corpus, budgets, space, sampler, how students start) and holds
five groups, each its own dataclass:

- `proxy`   (`ProxyRecipe`): how every trial is distilled and scored;
- `latency` (`LatencySettings`): how every latency is read, the teacher's and the students';
- `reward`  (`RewardSettings`): the objective and the KD-NAS reward's parameters;
- `final`   (`FinalRecipe`): how the winner is trained and shipped;
- `run`     (`RunSettings`): how much this run does, where it goes and how it is shown.

The study is defined by the top-level fields, the *resolved* proxy recipe (`resolved_proxy`: the fidelity proxy
trains with part of the final recipe, which it then stores as its own), `latency` and `reward`; they are stored
when the study is created and compared on every resume (`study_settings`). What a later run of the same study may
change is `run` and `final`, and nothing else.

The command line's flags are flat names (`--final-steps`, `--proxy-lr`, `--threads`); `FLAGS` maps each to its
place, and `SearchConfig.from_flags(...)` / `cfg.with_flags(...)` build a config in those names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdnas.core.errors import InputError, check_choice
from kdnas.distill.checkpoint import SAVE_EVERY
from kdnas.distill.data import UNITS
from kdnas.distill.inherit import LAYER_RULES
from kdnas.distill.loop import PRECISIONS
from kdnas.distill.losses import LAYER_MAPS
from kdnas.distill.methods import METHODS, method_options, weighted_embed_terms
from kdnas.distill.trainer import INITS
from kdnas.latency import check_settings

from .proxy import MIN_PROXY_SENTENCES
from .schema import migrate_settings
from .space import SearchSpace, default_space, override_space

OBJECTIVES = ("reward", "pareto")
PROXIES = ("fidelity", "hs")
SAMPLERS = ("tpe", "nsga2", "random")
# The ProxyRecipe fields only the hs proxy reads (the fidelity proxy runs the final recipe shortened: nas.trial).
HS_PROXY_ONLY = ("method", "train", "batch_size", "lr")
# The fidelity proxy's peak learning rate: the one its ranking of shapes was measured with (Kendall's
# tau +0.91, docs/benchmarks/proxy-fidelity.md). The final run's own (`FinalRecipe.lr`) is higher since a
# 1,200-step run gains from it (docs/design/final-recipe.md); 30 steps were not measured at it.
PROXY_FINAL_LR = 3e-4
# The final run sees each transfer sentence at most this often (MiniLM, 3x12x384x1536, ρ at step
# 1,200 of a 3,000-step run: 0.883 after 9.4 passes over 4,096 sentences, 0.903 over 32,768; at
# 4.7 passes, 600 steps, 4,096 and 16,384 sentences score alike: 0.883 and 0.878).
FINAL_MAX_PASSES = 5
# 8: 5 random start-up trials, then 3 guided by TPE. With the fidelity proxy a trial costs about
# 15 s of latency measurement and 10 s of distillation on 2 cores; the demo took 5.8 min with 6
# trials and 7.5 min with 10 on a quiet machine, and a busy one adds half again.
DEFAULT_TRIALS = 8
# Under a `timeout` without a trial count the time decides how many trials run (nas.time_limit's
# TIMED_TRIAL_SHARE); this count, asked of the study, is never reached.
TIMED_TRIALS_CAP = 10_000
# Under a --timeout the final run may train up to this many times `final.steps` when the time allows
# (`SearchConfig.final_most`), on a set grown to keep FINAL_MAX_PASSES: the demo's student in bf16,
# 2,400 steps on 15,360 sentences reach rho 0.919 against 0.904 for 1,200 on 7,680, and 0.908 for
# 2,400 on the same 7,680 (one-off benchmark, in git history). Ten times is the longest run whose
# set the news corpus holds at five passes (12,000 steps on 76,800 of its 79,148 sentences), each such
# run a whole schedule of its own length measured up to there: rho 0.922 / 0.931 / 0.940 at 3,000 /
# 6,000 / 12,000 fp32 steps (one-off benchmark, in git history; docs/design/final-recipe.md). A fast host (a GPU
# trains the demo's 1,200 steps in 18 s) spends its minutes on them instead of ending early.
FINAL_EXTEND = 10
# Share of a final run's batches perturbed (distill.augment) when its corpus is too small for
# FINAL_MAX_PASSES: the sentences it has are then seen more often, and perturbed copies stand in for
# part of the text that is missing. The demo's student, 2,400 fp32 steps on 7,680 news sentences seen
# ten times: rho 0.908 plain, 0.915 with half the batches perturbed, 0.919 on 15,360 sentences
# (one-off benchmark, in git history; docs/design/final-recipe.md).
AUGMENT_SHARE = 0.5


@dataclass(frozen=True)
class ProxyRecipe:
    """How every trial (and every reference shape) is distilled and scored (nas/proxy.py). Defines the study.

    "fidelity": the final recipe, shortened to `steps`, on the final transfer set, scored by the embedding
    fidelity rho on `sentences` held-out sentences; the reward's loss is 1 - rho. "hs": the paper's KD-NAS proxy,
    `method` (hs) on `train` windows, scored by held-out L_HS. Measured on MiniLM, 12 shapes
    (benchmarks/results/proxy_fidelity.json): Kendall's tau against the final student's fidelity +0.91 for
    "fidelity" at 30 steps, +0.67 for "hs" at 60."""

    kind: str = "fidelity"
    sentences: int = 300
    # None: 30 for "fidelity" (tau +0.91 at 30 steps, +0.94 at 60: inside each other's intervals, at
    # half the cost), 60 for "hs" (60, not 20: tau vs a 10x longer run +0.86 at 60 vs +0.36 at 20 on
    # random starts; on inherited starts, tau vs the final student's fidelity +0.67 at 60, +0.61 at
    # 20, +0.58 at 150).
    steps: int | None = None
    # Held-out rows for L_HS (both proxies, and the final run's): the ridge map (up to 385x384 per layer pair)
    # is cross-fitted on halves, and 16 rows (~1k tokens) per half let wide students over-fit it (a 1-layer
    # student scored L_HS > 1); 128 rows per half give ~8k tokens. Interim (pruner) scores use the first 32 rows.
    eval: int = 256
    seq_len: int = 64  # training tokens per row, of the proxy's transfer set and the final run's
    # The hs proxy's own recipe (HS_PROXY_ONLY, and its pruner's interval).
    method: str = "hs"
    train: int = 96
    batch_size: int = 8
    # Short runs learn more at a higher peak rate than the long-run default (5e-4, App. B); measured
    # on MiniLM: held-out L_HS after 40 steps 0.928 at 2e-3 vs 0.946 at 5e-4 (3x6x384x1024).
    lr: float | None = 2e-3
    eval_every: int = 5
    prune: bool = True

    def __post_init__(self) -> None:
        check_choice("proxy", self.kind, PROXIES)
        few = isinstance(self.sentences, int) and self.sentences < MIN_PROXY_SENTENCES
        if self.kind == "fidelity" and few:
            raise InputError(f"proxy_sentences={self.sentences!r}: the fidelity proxy's rho needs at least "
                             f"{MIN_PROXY_SENTENCES} held-out sentences")
        if self.steps is None:
            object.__setattr__(self, "steps", 30 if self.kind == "fidelity" else 60)
        self._check_hs_only()
        for name in ("steps", "train", "sentences", "eval", "seq_len", "batch_size", "eval_every"):
            _positive_int(self, name, _flag_of("proxy", name), "must be a positive integer")
        _check_rate("proxy_lr", self.lr)
        # od needs the teacher's masked-LM head, which the bundled sentence-embedding teachers lack.
        check_choice("proxy method", self.method, tuple(m for m in METHODS if m != "od"))

    def _check_hs_only(self) -> None:
        """A field only the hs proxy reads, set while the fidelity proxy scores the trials, is refused rather
        than ignored: that proxy trains with the final recipe (its method, batch and set, its own rate)."""
        if self.kind != "fidelity":
            return
        for name in HS_PROXY_ONLY:
            if getattr(self, name) != _PROXY_DEFAULTS[name]:
                flag = "--" + _flag_of("proxy", name).replace("_", "-")
                raise InputError(f"{flag} {getattr(self, name)!r} shapes the hs proxy only; the fidelity proxy (the "
                                 "default) trains every trial with the final recipe: add --proxy hs, or leave it out")


@dataclass(frozen=True)
class FinalRecipe:
    """How the winner is distilled, checked and shipped. A later run of the study may change it, except the parts
    the fidelity proxy trains with (`SearchConfig.resolved_proxy` stores those as the proxy's own)."""

    # Embedding fidelity of the MiniLM 3x12x384x1536 student (one run each): 0.881 after 600 steps
    # (fp32, 3.1 min on 2 CPU cores), 0.899 after 1,200 in bf16 (3.4 min on a CPU with native bf16).
    steps: int = 1200
    # With a `timeout`: the final run goes on past `steps`, up to this many, while the time allows (a host with
    # time to spare ships a better student; a slow one still trains fewer). None: FINAL_EXTEND x steps.
    max_steps: int | None = None
    # At least this many sentences, more for a long run (`rows_for`): at most FINAL_MAX_PASSES passes
    # over them. Repeating the same 4,096 sentences is what flattened a 3,000-step run.
    # 7,680 = 1,200 steps x 32 / 5: the demo's final run and its fidelity proxy share one set.
    train: int = 7680
    top_k: int = 1
    # The final recipe keeps what a sentence-embedding teacher is for: token states, the pooled
    # embedding and the in-batch similarities of the last layer (distill method "embed").
    method: str = "embed"
    batch_size: int = 32
    # Not the 3e-4 chosen on 300-step runs: over the demo's 1,200 steps on 3x12x384x1280 6e-4 reached
    # fidelity rho 0.896 where 3e-4 reached 0.890, and with token states by plain
    # MSE 1e-3 ends ahead of 6e-4 in all three paired runs, two batch orders and a run cut to 806
    # steps (+0.001 to +0.002; one-off benchmarks, in git history). The fidelity proxy keeps the
    # rate its ranking was measured at (PROXY_FINAL_LR).
    lr: float = 1e-3
    # Share of the batches perturbed (distill.augment); None: AUGMENT_SHARE where the corpus holds too few
    # rows for FINAL_MAX_PASSES over `steps`, else none (`augment_for`).
    augment: float | None = None
    # The `embed` terms (distill.methods.weighted_embed_terms); None: the method's own. Not for the
    # fidelity proxy's runs, which keep the terms their ranking was measured with.
    embed_terms: str | None = None
    # A run of a fixed step count (no `timeout`) saves its state every this many steps; a rerun
    # of a search stopped during it goes on from the last save (distill.checkpoint). 0: never.
    save_every: int = SAVE_EVERY
    # One sentence per training row, the unit the embedding is used on (windows of running text are
    # the proxy's). Measured on MiniLM, 3x12x384x1536, 300 steps: fidelity rho 0.853 vs 0.829.
    unit: str = "sentence"
    # Held-out sentences for the shipped student's embedding fidelity (0: not measured).
    quality_sentences: int = 1000

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 0:
            raise InputError(f"final_steps={self.steps!r} must be 0 (no final training) or more")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int)
                                           or self.max_steps < self.steps):
            raise InputError(f"final_max_steps={self.max_steps!r} must be a whole number of steps, at "
                             f"least final_steps ({self.steps})")
        _positive_int(self, "train", "final_train", "must be a positive integer (training sequences of the final run)")
        for name in ("top_k", "batch_size"):
            _positive_int(self, name, _flag_of("final", name), "must be a positive integer")
        if self.augment is not None and not (_number(self.augment) and 0 <= self.augment <= 1):
            raise InputError(f"final augment {self.augment!r} must be the share of batches perturbed, 0 to 1")
        if self.embed_terms is not None:
            if self.method != "embed":
                raise InputError(f"final embed terms {self.embed_terms!r} apply to the final method 'embed' "
                                 f"only; the final method is {self.method!r}")
            try:
                weighted_embed_terms(self.embed_terms)
            except InputError as err:
                raise InputError(f"final {err}") from None
        every = self.save_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise InputError(f"final save every {every!r} steps is invalid: a whole number >= 0 (0: never)")
        _check_rate("final_lr", self.lr)
        check_choice("final unit", self.unit, UNITS)
        check_choice("final method", self.method, tuple(m for m in METHODS if m != "od"))
        if not isinstance(self.quality_sentences, int) or self.quality_sentences < 0:
            raise InputError(f"quality_sentences={self.quality_sentences!r} must be 0 (not measured) or more")

    @property
    def rows(self) -> int:
        """Training rows of a run of `steps` (`rows_for`)."""
        return self.rows_for(self.steps)

    def rows_for(self, steps: int) -> int:
        """Training rows for a final run of `steps`: at least `train`, and no row seen more than
        FINAL_MAX_PASSES times (a run that `--timeout` lets go on grows its set to this)."""
        return max(self.train, math.ceil(steps * self.batch_size / FINAL_MAX_PASSES))

    def augment_for(self, rows: int) -> float:
        """The share of perturbed batches on a transfer set of `rows` training rows: `augment`, or AUGMENT_SHARE
        when `steps` would see them more than FINAL_MAX_PASSES times (the corpus held no more than `rows`), else 0."""
        if self.augment is not None:
            return float(self.augment)
        return AUGMENT_SHARE if self.steps * self.batch_size > FINAL_MAX_PASSES * rows else 0.0


# What a search ships on onnxruntime: by default the best graph within the budget, fp32, all-INT8 or a per-group
# precision plan (AUTO: the budget stays a share of the teacher's fp32 graph); `onnxruntime` restricts it to fp32,
# `onnxruntime-int8` to all-INT8 (the budget then a share of the teacher's INT8 graph); `torch` times PyTorch.
AUTO = "onnxruntime-auto"
MAX_TOLERANCE = 0.1  # a budget's tolerance beyond a tenth would be another budget
# The least --timeout that works: the bundled MiniLM teacher's readings (fp32, INT8, the fastest shape) and its
# precision plans, its targets of the transfer set from an empty cache, one trial and the final stage's fixed
# work (baselines, export, readings, the teacher's plan beside the student): 188 s under --timeout 120 on a quiet
# 2-core host, more on a busy one (at 300, 264-328 s) (docs/design/search-decisions.md, "The least --timeout").
MIN_TIMEOUT_S = 300
# The least --timeout for another teacher (`least_timeout_s`) grows with its weight multiply-adds per token, as a
# search's fixed work does (its readings and plans, its targets, the readings of students shaped after it), along
# the power law through two measured teachers: the bundled MiniLM-L6 (6 layers, 384 wide, FFN 1536) at
# MIN_TIMEOUT_S, and MPNet-base (12 x 768, FFN 3072; 8 times the multiply-adds) at 1,800 s, under which a whole
# one-budget search of it ended in 1,606 s (docs/benchmarks/precision.md); one at --timeout 400 had not ended at
# 540 s (docs/benchmarks/gpu.md).
BUNDLED_MACS = 6 * (4 * 384 * 384 + 2 * 384 * 1536)
MPNET_MACS, MPNET_TIMEOUT_S = 12 * (4 * 768 * 768 + 2 * 768 * 3072), 1800
TIMEOUT_EXPONENT = math.log(MPNET_TIMEOUT_S / MIN_TIMEOUT_S) / math.log(MPNET_MACS / BUNDLED_MACS)


def least_timeout_s(layers: int, hidden: int, ffn: int) -> int:
    """The least --timeout for a search of a teacher of this shape, in whole minutes, never under MIN_TIMEOUT_S:
    MIN_TIMEOUT_S x (its weight multiply-adds per token / the bundled teacher's) ** TIMEOUT_EXPONENT (0.86)."""
    macs = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    least = MIN_TIMEOUT_S * (macs / BUNDLED_MACS) ** TIMEOUT_EXPONENT
    return max(MIN_TIMEOUT_S, math.ceil(round(least, 6) / 60) * 60)


SEARCH_RUNTIMES = (AUTO, "onnxruntime", "onnxruntime-int8", "torch")


@dataclass(frozen=True)
class LatencySettings:
    """How every latency is read, identical for the teacher and every student. Defines the study."""

    batch: int = 1
    seq: int = 128
    threads: int = 2
    runtime: str = AUTO
    # A graph fits its budget when its latency, read as `nas.measure` reads it (again where the budget lies
    # within the reading's spread), is at most this share over it: a shape at the budget's edge is then in or
    # out by this stated rule, not by timing noise a thousand times smaller than the host's own drift (the
    # demo's rule shape read 4.9211 ms against a 4.9188 ms budget and was not trained).
    budget_tolerance: float = 0.01

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "threads"):
            _positive_int(self, name, _flag_of("latency", name), "must be a positive integer")
        check_choice("runtime", self.runtime, SEARCH_RUNTIMES)
        if not (_number(self.budget_tolerance) and 0 <= self.budget_tolerance <= MAX_TOLERANCE):
            raise InputError(f"--budget-tolerance {self.budget_tolerance!r} is invalid: a share of the budget from 0 "
                             f"to {MAX_TOLERANCE} (default 0.01: 1 %)")

    @property
    def plans(self) -> bool:
        """Whether a graph's precision is chosen (AUTO): INT8 and per-group plans are candidates beside fp32."""
        return self.runtime == AUTO

    def reading_runtime(self, int8: bool = False) -> str:
        """The `latency.profile` runtime of a reading: under AUTO the fp32 graph's, or with `int8` the all-INT8
        graph's; else the setting itself."""
        if self.runtime != AUTO:
            return self.runtime
        return "onnxruntime-int8" if int8 else "onnxruntime"


@dataclass(frozen=True)
class RewardSettings:
    """What the search maximises: the KD-NAS reward (docs/methods.md), or the Pareto front. Defines the study."""

    objective: str = "reward"
    target_ratio: float = 0.6
    exponent: float = -0.06

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective {self.objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
        if not (_number(self.target_ratio) and math.isfinite(self.target_ratio) and self.target_ratio > 0):
            raise InputError(f"target ratio {self.target_ratio!r} must be a positive number")


@dataclass(frozen=True)
class RunSettings:
    """How much this run does, where it goes and how it is shown: a later run of the study may change all of it."""

    out: str = "runs/search"
    # None: DEFAULT_TRIALS, or under a `timeout` as many as its time allows (`SearchConfig.trials_follow_time`).
    trials: int | None = None
    # Wall-clock seconds for the whole command (nas.time_limit); None: no limit, and a run does the
    # same work on every host.
    timeout: float | None = None
    storage: str | None = None  # None: sqlite:///<out>/study.db
    study_name: str = "kdnas"
    # Trials read their latency from a model fitted on the study's own readings (latency.fit_latency_model)
    # where its interval lies wholly on one side of the budget, and are measured where it holds the budget
    # (benchmarks/results/latency_model.json); finalists are always measured.
    latency_model: bool = True
    reference: bool = False  # also measure and proxy-distill the paper's Table 1 shapes, as plot references
    progress: bool = True
    # A RUNNING trial whose worker is on another host and silent this long is presumed dead.
    stale_after_s: float = 1800.0
    # Teacher targets on disk (distill.targets_dir): None is $KDNAS_CACHE/targets, "none" memory only.
    # A rerun, a resumed study or a second worker on this machine then skips the teacher's pass over
    # the transfer set (the demo's: 7,680 sentences, about 40 s of its 10 minutes on 2 cores).
    cache_dir: str | None = None
    # A deployment target's profile (`kdnas target`): every latency of the search is predicted by it
    # (nas.measure.ProfileJudge); None: read on this host.
    target: str | None = None

    def __post_init__(self) -> None:
        if self.trials is not None:
            _positive_int(self, "trials", "trial count", "must be at least 1")
        if self.timeout is not None and not (_number(self.timeout) and math.isfinite(self.timeout) and self.timeout > 0):
            raise InputError(f"timeout {self.timeout!r} s must be a positive number of seconds")
        if self.timeout is not None and self.timeout < MIN_TIMEOUT_S:
            raise InputError(f"--timeout {self.timeout:g} s is too short for any search: the teacher's readings and "
                             f"plans, one trial and the final stage's export and readings take about {MIN_TIMEOUT_S} s on two "
                             f"cores; give --timeout {MIN_TIMEOUT_S} or more, or none")
        if not self.study_name or not str(self.study_name).strip():
            raise InputError("study name must not be empty")


@dataclass(frozen=True)
class SearchConfig:
    """Everything `nas.search` needs. Defaults keep the bundled-default search under 10 minutes
    on a quiet 2-core CPU (docs/benchmarks/search-quality.md has the measured time); the demo
    adds `--timeout 480` so that a busy one keeps it too (nas.time_limit)."""

    teacher: str = "minilm-l6"
    corpus: str = "news"
    # Hard latency budget; None means `budget_ratio` x the teacher's measured latency. Several budgets
    # (a tuple, largest first: `budgets`) are searched in one study, a student shipped for each.
    budget_ms: float | tuple[float, ...] | None = None
    budget_ratio: float | tuple[float, ...] = 0.5
    space: SearchSpace | None = None  # None: derived from the teacher (nas.space.default_space)
    # Per-dimension overrides applied on top of `space` (values as nas.space.parse_choices reads them).
    space_overrides: Mapping[str, Any] | tuple = ()
    sampler: str = "tpe"
    seed: int = 0
    # Students start from the teacher's own weights (distill.inherit): layers by `layer_rule`, heads,
    # neurons and channels by activation importance. Shapes that cannot inherit fall back to "svd".
    # Measured on MiniLM, 3x12x384x1536 before any training: embedding fidelity rho 0.61 inherited
    # (even) vs 0.08 random (one-off benchmark, in git history; docs/distill.md).
    init: str = "inherit"
    layer_rule: str = "even"
    layer_map: str = "uniform"  # which teacher layer each student layer learns from, for the methods that map layers
    # Training precision of every proxy and final run (distill.loop.PRECISIONS): "auto" is bf16 where
    # the device multiplies bf16 natively. Measured on MiniLM: same fidelity, 0.61x the seconds on a
    # 2-core AMD EPYC with AVX512-BF16 (docs/design/final-recipe.md).
    precision: str = "auto"
    device: str = "auto"  # the study stores the resolved device type
    proxy: ProxyRecipe = field(default_factory=ProxyRecipe)
    latency: LatencySettings = field(default_factory=LatencySettings)
    reward: RewardSettings = field(default_factory=RewardSettings)
    final: FinalRecipe = field(default_factory=FinalRecipe)
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        overrides = dict(self.space_overrides or ())
        object.__setattr__(self, "space_overrides", tuple(sorted(overrides.items())))
        self._check_budgets()
        if self.sampler not in SAMPLERS:
            raise InputError(f"sampler {self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}")
        check_choice("init", self.init, INITS)
        check_choice("layer rule", self.layer_rule, LAYER_RULES)
        check_choice("precision", self.precision, PRECISIONS)
        if self.final.max_steps is not None and self.run.timeout is None:
            raise InputError(f"final_max_steps={self.final.max_steps} needs a timeout: without one the final "
                             f"run trains final_steps ({self.final.steps}) exactly")
        methods = (self.proxy.method, self.final.method)
        if self.layer_map != SearchConfig.layer_map and not any("layer_map" in method_options(m) for m in methods):
            takers = ", ".join(m for m in METHODS if "layer_map" in method_options(m))
            raise InputError(f"layer map {self.layer_map!r} applies to the methods {takers}; "
                             f"proxy method {methods[0]!r} and final method {methods[1]!r} have none")
        self._check_late_refusals()

    # -- the flags' names ------------------------------------------------------------------------

    @classmethod
    def from_flags(cls, **flags: Any) -> "SearchConfig":
        """A config from the command line's flat names (`final_steps=600, threads=1`; FLAGS), the rest default."""
        return cls().with_flags(**flags)

    def with_flags(self, **flags: Any) -> "SearchConfig":
        """This config with the settings named by their flags changed (`with_flags(proxy="hs", final_steps=0)`);
        a new proxy kind derives its default step count again unless `proxy_steps` is given too."""
        unknown = sorted(set(flags) - set(FLAGS))
        if unknown:
            raise TypeError(f"not a kdnas search setting: {', '.join(unknown)}")
        if "proxy" in flags and "proxy_steps" not in flags:
            flags = {**flags, "proxy_steps": None}
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        for flag, value in flags.items():
            group, name = FLAGS[flag]
            (top if group is None else groups.setdefault(group, {}))[name] = value
        for group, changes in groups.items():
            top[group] = dataclasses.replace(getattr(self, group), **changes)
        return dataclasses.replace(self, **top)

    def flags(self) -> dict[str, Any]:
        """Every setting by its flag's name (FLAGS order), as `from_flags` takes them back."""
        return {flag: getattr(self if group is None else getattr(self, group), name)
                for flag, (group, name) in FLAGS.items()}

    # -- budgets, trials, the final run's length -------------------------------------------------

    def _check_budgets(self) -> None:
        """One budget stays a number; several become a tuple, largest first, each positive and none twice."""
        for name, unit in (("budget_ms", " ms"), ("budget_ratio", "")):
            value = getattr(self, name)
            if value is None:
                continue
            values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            label = name.replace("_", " ").replace(" ms", "")
            for v in values:
                if not (_number(v) and math.isfinite(v) and v > 0):
                    what = "milliseconds" if unit else "a share of the teacher's latency"
                    raise InputError(f"{label} {v!r}{unit} must be a positive number ({what})")
            if len(set(values)) < len(values):
                raise InputError(f"{label}s {', '.join(map(str, values))}: a budget is given twice")
            ordered = tuple(sorted((float(v) for v in values), reverse=True))
            object.__setattr__(self, name, ordered if len(ordered) > 1 else ordered[0])

    @property
    def budgets(self) -> tuple[float, ...]:
        """The budgets asked for, largest first: milliseconds with `budget_ms`, else ratios of the teacher."""
        value = self.budget_ms if self.budget_ms is not None else self.budget_ratio
        return value if isinstance(value, tuple) else (value,)

    @property
    def several_budgets(self) -> bool:
        return len(self.budgets) > 1

    def check_timeout(self, layers: int, hidden: int, ffn: int) -> None:
        """Refuse a --timeout under the least that works for this teacher's shape (`least_timeout_s`): known once
        the teacher is read, before anything is written."""
        least = least_timeout_s(layers, hidden, ffn)
        if self.run.timeout is not None and self.run.timeout < least:
            raise InputError(f"--timeout {self.run.timeout:g} s is too short for a search of teacher {self.teacher} "
                             f"({layers}x{hidden}, FFN {ffn}): about {least} s on two cores, scaled by its "
                             f"multiply-adds per token from the bundled teacher's {MIN_TIMEOUT_S} s; give --timeout "
                             f"{least} or more, or none")

    def _check_late_refusals(self) -> None:
        """Values refused otherwise only once the study is made (the seed: by the sampler; the latency
        settings: by the first reading) or once trials ran and failed (the exponent, the layer map)."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise InputError(f"seed {self.seed!r} is invalid: a whole number from 0 to 2**32 - 1")
        exponent = self.reward.exponent
        if not (_number(exponent) and math.isfinite(exponent)):
            raise InputError(f"exponent {exponent!r} must be a finite number (the paper's: -0.06)")
        check_choice("layer map", self.layer_map, LAYER_MAPS)
        lat = self.latency
        check_settings(lat.batch, lat.seq, lat.threads, lat.reading_runtime())

    @property
    def trials_follow_time(self) -> bool:
        """Whether the trials run while the time allows (a `timeout` and no trial count) rather than to a count."""
        return self.run.trials is None and self.run.timeout is not None

    @property
    def trial_count(self) -> int:
        """The counted trials the study is run up to: `run.trials`, DEFAULT_TRIALS, or, while they follow the
        time, TIMED_TRIALS_CAP (the time stops them first)."""
        if self.run.trials is not None:
            return self.run.trials
        return TIMED_TRIALS_CAP if self.run.timeout is not None else DEFAULT_TRIALS

    @property
    def final_most(self) -> int:
        """The most steps the final run may train: `final.max_steps`, by default FINAL_EXTEND x
        `final.steps` under a `timeout`, else `final.steps`."""
        if self.run.timeout is None:
            return self.final.steps
        return self.final.max_steps if self.final.max_steps is not None else FINAL_EXTEND * self.final.steps

    # -- what defines the study ------------------------------------------------------------------

    def resolve_space(self, teacher_dims: Any) -> SearchSpace:
        """The space to search: `space` or the teacher-derived default, with the overrides applied."""
        d = teacher_dims
        base = self.space or default_space(d.layers, d.heads, d.hidden, d.ffn, keep_head_size=self.init == "inherit")
        return override_space(base, dict(self.space_overrides)) if self.space_overrides else base

    @property
    def pruning(self) -> bool:
        # Optuna's pruners are single-objective only: the Pareto objective never prunes. The fidelity
        # proxy is scored once, at its end (a rho on the way would cost as much as its steps).
        return self.proxy.prune and self.reward.objective == "reward" and self.proxy.kind == "hs"

    def resolved_proxy(self) -> dict[str, Any]:
        """What the proxy trains and scores every trial with, resolved: the fidelity proxy runs the final recipe
        shortened (its method, batch, transfer set and unit) at PROXY_FINAL_LR, so those, run-only for the final
        run, are the proxy's own here; the hs proxy's are its fields. `prune`: whether trials are pruned."""
        recipe = dataclasses.asdict(self.proxy)
        recipe["prune"] = self.pruning
        if self.proxy.kind != "fidelity":
            return recipe
        for name in HS_PROXY_ONLY + ("eval_every",):
            del recipe[name]
        f = self.final
        return {**recipe, "method": f.method, "batch_size": f.batch_size, "train": f.train, "unit": f.unit,
                "lr": PROXY_FINAL_LR}

    def study_settings(self, space: SearchSpace, teacher_fingerprint: str, device: str = "cpu", dtype: str = "fp32",
                       latency_machine: dict[str, str] | None = None) -> dict[str, Any]:
        """The settings that define the study; compared on every resume. `device` and `dtype` are the
        resolved training device type and precision: proxy scores from fp32 and bf16 runs must not mix.
        `latency_machine` (CPU model, runtime version) is where the budget and every latency were
        measured: a worker elsewhere would time shapes against another machine's budget."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name not in ("space", "space_overrides", "device") + GROUPS}
        settings.update(proxy=self.resolved_proxy(), latency=dataclasses.asdict(self.latency),
                        reward=dataclasses.asdict(self.reward), teacher_fingerprint=teacher_fingerprint,
                        space=space.to_dict(), device=device, dtype=dtype)
        if latency_machine is not None:
            settings["latency_machine"] = latency_machine
        return settings


@dataclass(frozen=True)
class ProxyScored:
    """The proxy a study's trials were scored with, as its settings record it (`SearchConfig.resolved_proxy`;
    a study from before the fidelity proxy named none: `hs`)."""

    kind: str = "hs"
    steps: int | None = None
    sentences: int | None = None
    method: str | None = None


@dataclass(frozen=True)
class StoredSettings:
    """What the pages say of a study's settings (`SearchConfig.study_settings`, in this version's form:
    nas.schema.migrate_settings): the teacher, corpus and sampler, the proxy, how latency is read, the reward."""

    teacher: str | None = None
    corpus: str | None = None
    sampler: str | None = None
    proxy: ProxyScored = field(default_factory=ProxyScored)
    latency: LatencySettings = field(default_factory=LatencySettings)
    reward: RewardSettings = field(default_factory=RewardSettings)

    @classmethod
    def of(cls, settings: Mapping[str, Any] | None) -> StoredSettings:
        """A study's settings as stored; a field an earlier version did not store keeps its default."""
        found = migrate_settings(settings or {})

        def group(kind: type, name: str) -> Any:
            names = {f.name for f in dataclasses.fields(kind)}
            return kind(**{k: v for k, v in (found.get(name) or {}).items() if k in names and v is not None})

        top = {name: found.get(name) for name in ("teacher", "corpus", "sampler")}
        return cls(**top, proxy=group(ProxyScored, "proxy"), latency=group(LatencySettings, "latency"),
                   reward=group(RewardSettings, "reward"))


GROUPS = ("proxy", "latency", "reward", "final", "run")
# A group's flags are its prefix and the field's name (`final_steps`: final.steps), but for these.
_PREFIX = {"proxy": "proxy_", "latency": "latency_", "reward": "", "final": "final_", "run": ""}
_OWN_FLAG = {("proxy", "kind"): "proxy", ("proxy", "seq_len"): "seq_len", ("proxy", "eval_every"): "eval_every",
             ("latency", "budget_tolerance"): "budget_tolerance",
             ("proxy", "prune"): "prune", ("latency", "threads"): "threads", ("latency", "runtime"): "runtime",
             ("final", "quality_sentences"): "quality_sentences"}


def _flag_of(group: str, name: str) -> str:
    return _OWN_FLAG.get((group, name), _PREFIX[group] + name)


# Each group's dataclass, read off SearchConfig's own fields (one source for which class a group is).
_GROUP_CLASSES = {f.name: f.default_factory for f in dataclasses.fields(SearchConfig) if f.name in GROUPS}
# Every setting's flag name -> (its group, or None for a top-level field; its field).
FLAGS: dict[str, tuple[str | None, str]] = {
    **{f.name: (None, f.name) for f in dataclasses.fields(SearchConfig) if f.name not in GROUPS},
    **{_flag_of(g, f.name): (g, f.name) for g, cls in _GROUP_CLASSES.items() for f in dataclasses.fields(cls)},
}
_PROXY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ProxyRecipe)}


def _positive_int(config: Any, name: str, label: str, why: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{label}={value!r} {why}")


def _check_rate(flag: str, value: float | None) -> None:
    if value is not None and not (_number(value) and math.isfinite(value) and value > 0):
        raise InputError(f"learning rate {flag}={value!r} must be a positive number")


def _number(value: object) -> bool:
    """A real number of seconds or a share: an int or a float, not a bool (which Python counts as an int)."""
    return not isinstance(value, bool) and isinstance(value, (int, float))
