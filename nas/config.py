"""What one search is: a frozen set of settings, and which of them define the study.

Settings that change what a trial measures (teacher, corpus, space, budget, proxy budget,
objective, sampler, latency settings, training device and dtype...) are stored in the study's user attributes when it is
created; a later run with the same study name must ask for the same ones (`study_settings`).
Settings that only change how much is done or where it goes (trial count, final steps, output
folder) may differ between runs of one study.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from kdnas.distill.data import UNITS
from kdnas.core.errors import InputError, check_choice
from kdnas.distill.inherit import LAYER_RULES
from kdnas.distill.loop import PRECISIONS
from kdnas.distill.losses import LAYER_MAPS
from kdnas.distill.methods import METHODS, method_options, weighted_embed_terms
from kdnas.latency import check_settings
from kdnas.distill.checkpoint import SAVE_EVERY
from kdnas.distill.trainer import INITS

from .proxy import MIN_PROXY_SENTENCES
from .space import SearchSpace, default_space, override_space

OBJECTIVES = ("reward", "pareto")
PROXIES = ("fidelity", "hs")
# Fields that may differ between runs of one study (how much is done, where it goes, how it is
# shown); every other field defines the study. `space` and `device` enter the settings resolved.
RUN_ONLY = frozenset({"out", "trials", "storage", "study_name", "space", "space_overrides", "final_steps",
                      "final_train", "final_top_k", "final_method", "final_batch_size", "final_lr", "final_augment",
                      "final_embed_terms", "final_unit", "final_save_every",
                      "quality_sentences", "reference", "device", "progress", "stale_after_s",
                      "timeout", "final_max_steps", "cache_dir", "latency_model"})
SAMPLERS = ("tpe", "nsga2", "random")
# Fields only the hs proxy reads (the fidelity proxy runs the final recipe shortened: nas.trial).
HS_PROXY_ONLY = ("proxy_method", "proxy_train", "proxy_batch_size", "proxy_lr")
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
# Under a --timeout the final run may train up to this many times `final_steps` when the time allows
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
class SearchConfig:
    """Everything `nas.search` needs. Defaults keep the bundled-default search under 10 minutes
    on a quiet 2-core CPU (the README's "Student quality" section has the measured time); the demo
    adds `timeout=570` so that a busy one keeps it too (nas.time_limit)."""

    teacher: str = "minilm-l6"
    corpus: str = "news"
    out: str = "runs/search"
    # None: DEFAULT_TRIALS, or under a `timeout` as many as its time allows (`trials_follow_time`).
    trials: int | None = None
    # Hard latency budget; None means `budget_ratio` x the teacher's measured latency. Several budgets
    # (a tuple, largest first: `budgets`) are searched in one study, a student shipped for each.
    budget_ms: float | tuple[float, ...] | None = None
    budget_ratio: float | tuple[float, ...] = 0.5
    objective: str = "reward"
    sampler: str = "tpe"
    seed: int = 0
    storage: str | None = None  # None: sqlite:///<out>/study.db
    study_name: str = "kdnas"
    space: SearchSpace | None = None  # None: derived from the teacher (nas.space.default_space)
    # Per-dimension overrides applied on top of `space` (values as nas.space.parse_choices reads them).
    space_overrides: Mapping[str, Any] | tuple = ()
    # The proxy every trial (and every reference shape) is scored by (nas/proxy.py):
    # "fidelity": the final recipe, shortened to `proxy_steps`, on the final transfer set, scored by
    #   the embedding fidelity rho on `proxy_sentences` held-out sentences; the reward's loss is 1 - rho.
    # "hs": the paper's KD-NAS proxy: `proxy_method` (hs) on `proxy_train` windows, scored by held-out L_HS.
    # Measured on MiniLM, 12 shapes (benchmarks/results/proxy_fidelity.json): Kendall's tau against
    # the final student's fidelity +0.91 for "fidelity" at 30 steps, +0.67 for "hs" at 60.
    proxy: str = "fidelity"
    proxy_sentences: int = 300
    # The options below, to `proxy_train`, shape the "hs" proxy only.
    proxy_method: str = "hs"
    layer_map: str = "uniform"
    # None: 30 for "fidelity" (tau +0.91 at 30 steps, +0.94 at 60: inside each other's intervals, at
    # half the cost), 60 for "hs" (60, not 20: tau vs a 10x longer run +0.86 at 60 vs +0.36 at 20 on
    # random starts; on inherited starts, tau vs the final student's fidelity +0.67 at 60, +0.61 at
    # 20, +0.58 at 150).
    proxy_steps: int | None = None
    proxy_train: int = 96
    # Held-out rows for L_HS: the ridge map (up to 385x384 per layer pair) is cross-fitted on halves,
    # and 16 rows (~1k tokens) per half let wide students over-fit it (a 1-layer student scored
    # L_HS > 1); 128 rows per half give ~8k tokens. Interim (pruner) scores use the first 32 rows.
    proxy_eval: int = 256
    seq_len: int = 64
    proxy_batch_size: int = 8
    # Short runs learn more at a higher peak rate than the long-run default (5e-4, App. B); measured
    # on MiniLM: held-out L_HS after 40 steps 0.928 at 2e-3 vs 0.946 at 5e-4 (3x6x384x1024).
    proxy_lr: float | None = 2e-3
    # Students start from the teacher's own weights (distill.inherit): layers by `layer_rule`, heads,
    # neurons and channels by activation importance. Shapes that cannot inherit fall back to "svd".
    # Measured on MiniLM, 3x12x384x1536 before any training: embedding fidelity rho 0.61 inherited
    # (even) vs 0.08 random (one-off benchmark, in git history; docs/distill.md).
    init: str = "inherit"
    layer_rule: str = "even"
    eval_every: int = 5
    prune: bool = True
    # KD-NAS reward parameters (docs/methods.md).
    target_ratio: float = 0.6
    exponent: float = -0.06
    # Latency measurement, identical for the teacher and every student.
    latency_batch: int = 1
    latency_seq: int = 128
    threads: int = 2
    runtime: str = "onnxruntime"
    # Trials read their latency from a model fitted on the study's own readings (latency.fit_latency_model)
    # where its interval lies wholly on one side of the budget, and are measured where it holds the budget
    # (benchmarks/results/latency_model.json); finalists are always measured.
    latency_model: bool = True
    # After the search.
    # The winner is distilled on a larger transfer set (same held-out rows, so its L_HS is comparable
    # with the proxy's): the 96 proxy rows would be seen dozens of times over a long final run.
    # Embedding fidelity of the MiniLM 3x12x384x1536 student (one run each): 0.881 after 600 steps
    # (fp32, 3.1 min on 2 CPU cores), 0.899 after 1,200 in bf16 (3.4 min on a CPU with native bf16).
    final_steps: int = 1200
    # At least this many sentences, more for a long run (`final_rows`): at most FINAL_MAX_PASSES
    # passes over them. Repeating the same 4,096 sentences is what flattened a 3,000-step run.
    # 7,680 = 1,200 steps x 32 / 5: the demo's final run and its fidelity proxy share one set.
    final_train: int = 7680
    final_top_k: int = 1
    # The final recipe keeps what a sentence-embedding teacher is for: token states, the pooled
    # embedding and the in-batch similarities of the last layer (distill method "embed").
    final_method: str = "embed"
    final_batch_size: int = 32
    # Not the 3e-4 chosen on 300-step runs: over the demo's 1,200 steps on 3x12x384x1280 6e-4 reached
    # fidelity rho 0.896 where 3e-4 reached 0.890, and with token states by plain
    # MSE 1e-3 ends ahead of 6e-4 in all three paired runs, two batch orders and a run cut to 806
    # steps (+0.001 to +0.002; one-off benchmarks, in git history). The fidelity proxy keeps the
    # rate its ranking was measured at (nas.trial.PROXY_FINAL_LR).
    final_lr: float = 1e-3
    # Share of the final run's batches perturbed (distill.augment); None: AUGMENT_SHARE where the corpus
    # holds too few rows for FINAL_MAX_PASSES over `final_steps`, else none (`augment_for`).
    final_augment: float | None = None
    # The final run's `embed` terms (distill.methods.weighted_embed_terms); None: the method's own. Not
    # for the fidelity proxy's runs, which keep the terms their ranking was measured with.
    final_embed_terms: str | None = None
    # A final run of a fixed step count (no `timeout`) saves its state every this many steps; a rerun
    # of a search stopped during it goes on from the last save (distill.checkpoint). 0: never.
    final_save_every: int = SAVE_EVERY
    # One sentence per training row, the unit the embedding is used on (windows of running text are
    # the proxy's). Measured on MiniLM, 3x12x384x1536, 300 steps: fidelity rho 0.853 vs 0.829.
    final_unit: str = "sentence"
    # Held-out sentences for the shipped student's embedding fidelity (0: not measured).
    quality_sentences: int = 1000
    reference: bool = False
    device: str = "auto"
    # Training precision of every proxy and final run (distill.loop.PRECISIONS): "auto" is bf16 where
    # the device multiplies bf16 natively. Measured on MiniLM: same fidelity, 0.61x the seconds on a
    # 2-core AMD EPYC with AVX512-BF16 (docs/design/final-recipe.md).
    precision: str = "auto"
    progress: bool = True
    # Wall-clock seconds for the whole command (nas.time_limit); None: no limit, and a run does the
    # same work on every host.
    timeout: float | None = None
    # With `timeout`: the final run goes on past `final_steps`, up to this many steps, while the time
    # allows (a host with time to spare ships a better student; a slow one still trains fewer).
    # None: FINAL_EXTEND x final_steps; final_steps itself: never more.
    final_max_steps: int | None = None
    # A RUNNING trial whose worker is on another host and silent this long is presumed dead.
    stale_after_s: float = 1800.0
    # Teacher targets on disk (distill.targets_dir): None is $KDNAS_CACHE/targets, "none" memory only.
    # A rerun, a resumed study or a second worker on this machine then skips the teacher's pass over
    # the transfer set (the demo's: 7,680 sentences, about 40 s of its 10 minutes on 2 cores).
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        overrides = dict(self.space_overrides or ())
        object.__setattr__(self, "space_overrides", tuple(sorted(overrides.items())))
        if self.trials is not None:
            _positive_int(self, "trials", "must be at least 1")
        check_choice("proxy", self.proxy, PROXIES)
        few = isinstance(self.proxy_sentences, int) and self.proxy_sentences < MIN_PROXY_SENTENCES
        if self.proxy == "fidelity" and few:
            raise InputError(f"proxy_sentences={self.proxy_sentences!r}: the fidelity proxy's rho needs at least "
                             f"{MIN_PROXY_SENTENCES} held-out sentences")
        if self.proxy_steps is None:
            object.__setattr__(self, "proxy_steps", 30 if self.proxy == "fidelity" else 60)
        self._check_proxy_fields()
        for name in ("proxy_steps", "proxy_train", "proxy_sentences", "proxy_eval", "seq_len", "proxy_batch_size", "eval_every",
                     "latency_batch", "latency_seq", "threads", "final_top_k", "final_batch_size"):
            _positive_int(self, name, "must be a positive integer")
        self._check_final()
        self._check_budgets()
        if self.timeout is not None and not (_number(self.timeout) and math.isfinite(self.timeout) and self.timeout > 0):
            raise InputError(f"timeout {self.timeout!r} s must be a positive number of seconds")
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective {self.objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
        if self.sampler not in SAMPLERS:
            raise InputError(f"sampler {self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}")
        if not (math.isfinite(self.target_ratio) and self.target_ratio > 0):
            raise InputError(f"target ratio {self.target_ratio!r} must be a positive number")
        for name in ("proxy_lr", "final_lr"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InputError(f"learning rate {name}={value!r} must be a positive number")
        check_choice("init", self.init, INITS)
        check_choice("layer rule", self.layer_rule, LAYER_RULES)
        check_choice("final unit", self.final_unit, UNITS)
        check_choice("precision", self.precision, PRECISIONS)
        # od needs the teacher's masked-LM head, which the bundled sentence-embedding teachers lack.
        check_choice("proxy method", self.proxy_method, tuple(m for m in METHODS if m != "od"))
        check_choice("final method", self.final_method, tuple(m for m in METHODS if m != "od"))
        if self.layer_map != SearchConfig.layer_map and not any("layer_map" in method_options(m)
                                                                for m in (self.proxy_method, self.final_method)):
            takers = ", ".join(m for m in METHODS if "layer_map" in method_options(m))
            raise InputError(f"layer map {self.layer_map!r} applies to the methods {takers}; "
                             f"proxy method {self.proxy_method!r} and final method {self.final_method!r} have none")
        if not isinstance(self.quality_sentences, int) or self.quality_sentences < 0:
            raise InputError(f"quality_sentences={self.quality_sentences!r} must be 0 (not measured) or more")
        if not self.study_name or not str(self.study_name).strip():
            raise InputError("study name must not be empty")
        self._check_late_refusals()

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

    def _check_late_refusals(self) -> None:
        """Values refused otherwise only once the study is made (the seed: by the sampler; the latency
        settings: by the first reading) or once trials ran and failed (the exponent, the layer map)."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise InputError(f"seed {self.seed!r} is invalid: a whole number from 0 to 2**32 - 1")
        if not (_number(self.exponent) and math.isfinite(self.exponent)):
            raise InputError(f"exponent {self.exponent!r} must be a finite number (the paper's: -0.06)")
        check_choice("layer map", self.layer_map, LAYER_MAPS)
        check_settings(self.latency_batch, self.latency_seq, self.threads, self.runtime)

    def _check_final(self) -> None:
        """The final run's own settings: steps, their cap, rows, perturbed share, saves."""
        if not isinstance(self.final_steps, int) or self.final_steps < 0:
            raise InputError(f"final_steps={self.final_steps!r} must be 0 (no final training) or more")
        if self.final_max_steps is not None:
            if isinstance(self.final_max_steps, bool) or not isinstance(self.final_max_steps, int) \
                    or self.final_max_steps < self.final_steps:
                raise InputError(f"final_max_steps={self.final_max_steps!r} must be a whole number of steps, at "
                                 f"least final_steps ({self.final_steps})")
            if self.timeout is None:
                raise InputError(f"final_max_steps={self.final_max_steps} needs a timeout: without one the final "
                                 f"run trains final_steps ({self.final_steps}) exactly")
        _positive_int(self, "final_train", "must be a positive integer (training sequences of the final run)")
        if self.final_augment is not None and not (_number(self.final_augment) and 0 <= self.final_augment <= 1):
            raise InputError(f"final augment {self.final_augment!r} must be the share of batches perturbed, 0 to 1")
        if self.final_embed_terms is not None:
            if self.final_method != "embed":
                raise InputError(f"final embed terms {self.final_embed_terms!r} apply to the final method 'embed' "
                                 f"only; the final method is {self.final_method!r}")
            try:
                weighted_embed_terms(self.final_embed_terms)
            except InputError as err:
                raise InputError(f"final {err}") from None
        every = self.final_save_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise InputError(f"final save every {every!r} steps is invalid: a whole number >= 0 (0: never)")

    @property
    def trials_follow_time(self) -> bool:
        """Whether the trials run while the time allows (a `timeout` and no trial count) rather than to a count."""
        return self.trials is None and self.timeout is not None

    @property
    def trial_count(self) -> int:
        """The counted trials the study is run up to: `trials`, DEFAULT_TRIALS, or, while they follow the
        time, TIMED_TRIALS_CAP (the time stops them first)."""
        if self.trials is not None:
            return self.trials
        return TIMED_TRIALS_CAP if self.timeout is not None else DEFAULT_TRIALS

    @property
    def final_rows(self) -> int:
        """Training rows of the final run: `final_train`, or enough that no row is seen more than
        FINAL_MAX_PASSES times in `final_steps` batches of `final_batch_size`."""
        return self.rows_for(self.final_steps)

    def rows_for(self, steps: int) -> int:
        """Training rows for a final run of `steps`: at least `final_train`, and no row seen more than
        FINAL_MAX_PASSES times (a run that `--timeout` lets go on grows its set to this)."""
        return max(self.final_train, math.ceil(steps * self.final_batch_size / FINAL_MAX_PASSES))

    def augment_for(self, rows: int) -> float:
        """The final run's share of perturbed batches on a transfer set of `rows` training rows:
        `final_augment`, or AUGMENT_SHARE when `final_steps` would see them more than FINAL_MAX_PASSES
        times (the corpus held no more than `rows`), else 0."""
        if self.final_augment is not None:
            return float(self.final_augment)
        return AUGMENT_SHARE if self.final_steps * self.final_batch_size > FINAL_MAX_PASSES * rows else 0.0

    @property
    def final_most(self) -> int:
        """The most steps the final run may train: `final_max_steps`, by default FINAL_EXTEND x
        `final_steps` under a `timeout`, else `final_steps`."""
        if self.timeout is None:
            return self.final_steps
        return self.final_max_steps if self.final_max_steps is not None else FINAL_EXTEND * self.final_steps

    def replace(self, **changes: Any) -> "SearchConfig":
        if "proxy" in changes and "proxy_steps" not in changes:
            changes["proxy_steps"] = None  # derived again for the other proxy
        return dataclasses.replace(self, **changes)

    def resolve_space(self, teacher_dims: Any) -> SearchSpace:
        """The space to search: `space` or the teacher-derived default, with the overrides applied."""
        d = teacher_dims
        base = self.space or default_space(d.layers, d.heads, d.hidden, d.ffn, keep_head_size=self.init == "inherit")
        return override_space(base, dict(self.space_overrides)) if self.space_overrides else base

    @property
    def pruning(self) -> bool:
        # Optuna's pruners are single-objective only: the Pareto objective never prunes. The fidelity
        # proxy is scored once, at its end (a rho on the way would cost as much as its steps).
        return self.prune and self.objective == "reward" and self.proxy == "hs"

    def _check_proxy_fields(self) -> None:
        """A field only the hs proxy reads, set while the fidelity proxy scores the trials, is refused rather
        than ignored: that proxy trains with the final recipe (`final_method`, `final_batch_size`, its own rate)."""
        if self.proxy != "fidelity":
            return
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in HS_PROXY_ONLY:
            if getattr(self, name) != defaults[name]:
                flag = "--" + name.replace("_", "-")
                raise InputError(f"{flag} {getattr(self, name)!r} shapes the hs proxy only; the fidelity proxy (the "
                                 "default) trains every trial with the final recipe: add --proxy hs, or leave it out")

    def proxy_recipe(self) -> dict[str, Any]:
        """What the proxy trains every trial with, resolved: the fidelity proxy runs the final recipe shortened
        (its method, batch and transfer set), so those `final_*` fields, run-only for the final run, define the
        study's trials; the hs proxy's own fields (`proxy_method`, `proxy_batch_size`, `proxy_lr`, ...) are settings already."""
        if self.proxy != "fidelity":
            return {}
        return {"method": self.final_method, "batch_size": self.final_batch_size, "train": self.final_train,
                "unit": self.final_unit}

    def study_settings(self, space: SearchSpace, teacher_fingerprint: str, device: str = "cpu", dtype: str = "fp32",
                       latency_machine: dict[str, str] | None = None) -> dict[str, Any]:
        """The settings that define the study; compared on every resume. `device` and `dtype` are the
        resolved training device type and precision: proxy scores from fp32 and bf16 runs must not mix.
        `latency_machine` (CPU model, runtime version) is where the budget and every latency were
        measured: a worker elsewhere would time shapes against another machine's budget."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in RUN_ONLY}
        settings["proxy_recipe"] = self.proxy_recipe()
        settings["prune"] = self.pruning
        settings["teacher_fingerprint"] = teacher_fingerprint
        settings["space"] = space.to_dict()
        settings["device"] = device
        settings["dtype"] = dtype
        if latency_machine is not None:
            settings["latency_machine"] = latency_machine
        return settings


def _positive_int(config: SearchConfig, name: str, why: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        label = "trial count" if name == "trials" else name
        raise InputError(f"{label}={value!r} {why}")


def _number(value: object) -> bool:
    """A real number of seconds or a share: an int or a float, not a bool (which Python counts as an int)."""
    return not isinstance(value, bool) and isinstance(value, (int, float))
