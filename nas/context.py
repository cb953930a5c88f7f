"""What every trial of one search shares, and what the final stage is handed: the search's context.

Its own module so that the final stage, the baselines, the plans and the reference shapes type their context
without importing the trial (`nas.trial`), which only uses it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kdnas.distill import DistillConfig, StudentSpec
from kdnas.distill import distill as run_distill

from ._progress import Progress
from .budgets import Budget
from .config import SearchConfig
from .measure import LatencyJudge
from .proxy import FidelityProbe, ProxyMetrics, fidelity_probe, proxy_loss
from .recipe import final_config, final_recipe, proxy_config
from .reward import kdnas_reward
from .schema import Fidelity, LatencyRecord
from .scored import Scored
from .space import SearchSpace
from .time_limit import TimeLimit

if TYPE_CHECKING:
    from kdnas.core.sentence import SentencePipeline


@dataclass
class SearchContext:
    """What every trial of one search shares: loaded once, never changed by a trial."""

    config: SearchConfig
    space: SearchSpace
    sizes: dict[str, int]
    teacher: Any
    texts: Any  # the corpus, for the final run's larger transfer set
    data: Any
    cache: Any
    teacher_latency_ms: float
    budget_ms: float  # the most a graph may read and fit: the budget and its tolerance (`Budget.limit_ms`)
    progress: Progress
    limit: TimeLimit | None = None  # --timeout (nas.time_limit)
    judge: LatencyJudge | None = None  # how latency is read: by default, measured on the config's settings
    # The final stage's budget when the search has several (`for_budget`); None: its only one, `budget_ms`.
    budget_label: str | None = None
    tolerance: float = 0.0  # the budgets' (`--budget-tolerance`), which `budget_ms` includes
    # What the final stage computes once and every budget's copy uses (nas.baselines: the held-out sentences and
    # the teacher's embeddings of them); `for_budget`'s copies share this one dict.
    shared: dict[str, Any] = field(default_factory=dict)
    # The search's smallest budget (None: its only one): a trial over it as fp32 is scored as INT8 too.
    smallest_ms: float | None = None

    def __post_init__(self) -> None:
        if self.judge is None:
            self.judge = LatencyJudge(self.config)

    def for_budget(self, budget: Budget) -> "SearchContext":
        """This context for the final stage of one of the search's budgets (the trials' gate, `budget_ms`, is the
        largest); a shallow copy, so what it loaded once (the probe's teacher embeddings, `shared`) is shared."""
        other = copy.copy(self)
        other.budget_ms, other.budget_label = budget.limit_ms, budget.label
        return other

    @property
    def budget(self) -> Budget:
        # the stated budget, as given (`budget_ms` / (1 + tolerance) up to float rounding, which `round` undoes)
        return Budget(round(self.budget_ms / (1.0 + self.tolerance), 9), self.budget_label, self.tolerance)

    @property
    def budget_named(self) -> str:
        return self.budget.named

    @property
    def smallest_budget_ms(self) -> float:
        return self.budget_ms if self.smallest_ms is None else min(self.smallest_ms, self.budget_ms)

    def int8_fidelity(self, student: Any) -> Fidelity:
        """A trained student's all-INT8 graph scored on the fidelity probe, as the fp32 student is (`measured`)."""
        import tempfile

        from kdnas.evaluation import int8_graph_of

        model = copy.deepcopy(student).float().cpu().eval()  # a GPU run's student is exported on the CPU
        with tempfile.TemporaryDirectory(prefix="kdnas-int8-") as tmp:
            return self.probe.score_graph(int8_graph_of(model, tmp), self.teacher.tokenizer)

    @cached_property
    def teacher_pipeline(self) -> SentencePipeline:
        """The teacher's sentence-transformers pooling and normalization, which every graph shipped computes;
        read and checked once per search, so a pipeline the export cannot match fails before any long run."""
        from kdnas.core.assets import teacher_path
        from kdnas.export import check_pooling, read_sentence_pipeline

        pipeline = read_sentence_pipeline(teacher_path(self.config.teacher))
        check_pooling(pipeline.pooling)
        return pipeline

    @cached_property
    def probe(self) -> FidelityProbe:
        """The fidelity proxy's held-out sentences and the teacher's embeddings of them (once per search)."""
        return fidelity_probe(self.config, self.teacher, self.texts)

    def distill_config(self, steps: int, eval_every: int | None = None) -> DistillConfig:
        """The proxy's recipe (every trial, and the reference shapes): `nas.recipe.proxy_config`."""
        return proxy_config(self.config, steps, eval_every)

    def final_config(self) -> DistillConfig:
        """The winner's recipe (`final_config`)."""
        return final_config(self.config)

    def final_recipe(self, steps: int, eval_every: int, *, lr: float) -> DistillConfig:
        return final_recipe(self.config, steps, eval_every, lr=lr)

    def proxy(self, spec: StudentSpec, on_eval: Any = None) -> tuple[Any, ProxyMetrics]:
        """The search's proxy distillation of one shape: what every trial, the reference shapes and
        the proxy benchmarks run, so a benchmark figure is a statement about the search. Returns the
        distillation's result (its student, steps, seconds) and what it is scored by."""
        result = run_distill(spec, self.teacher, self.data, self.distill_config(self.config.proxy.steps),
                             cache=self.cache, on_eval=on_eval)
        return result, self.measured(result)

    def measured(self, result: Any) -> ProxyMetrics:
        """A distillation's metrics, with the fidelity proxy's ρ of its student when that is the proxy."""
        metrics = ProxyMetrics.of_distill(result.metrics)
        if self.config.proxy.kind != "fidelity":
            return metrics
        return metrics.with_fidelity(self.probe.score(result.student, self.teacher.tokenizer))

    def score(self, spec: StudentSpec, metrics: ProxyMetrics, latency: LatencyRecord,
              within: bool | None = None) -> Scored:
        """A distilled shape's record: the proxy's loss (with standard error), its held-out L_HS and
        fidelity, latency and reward; `within`: the budget's verdict where another reading made it (a
        finalist's, before its training), else its latency against the budget."""
        (loss, loss_se), median = proxy_loss(self.config, metrics), float(latency.median_ms)
        return Scored(arch=spec.arch, params=spec.num_parameters(), latency=latency, loss=loss, loss_se=loss_se,
                      fidelity=metrics.fidelity, l_hs_norm=metrics.l_hs_norm, l_hs_raw=metrics.l_hs_raw,
                      l_hs_se=metrics.l_hs_se, reward=self.reward(loss, median),
                      within_budget=median <= self.budget_ms if within is None else within)

    def reward(self, loss: float, latency_ms: float) -> float:
        return kdnas_reward(loss, latency_ms, self.teacher_latency_ms, self.config.reward.target_ratio,
                            self.config.reward.exponent)
