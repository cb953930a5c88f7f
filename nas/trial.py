"""One trial: propose a shape, measure its latency first, distill it briefly, score it.

Order matters for cost: a shape that is invalid or over the hard budget is settled before any
training (its latency is recorded as an Optuna constraint, so samplers and plots see it). The
proxy distillation reports its held-out score at intervals so the pruner can stop a hopeless
candidate early.

Everything a report needs is stored in the trial's user attributes, so pages can be rebuilt from
the storage alone (`kdnas report`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import optuna

from kdnas.distill import StudentSpec
from kdnas.core.errors import first_line

from .measure import latency_prediction, model_check, predicted_latency, reused, study_readings, trial_latency
from .context import SearchContext
from .proxy import ProxyMetrics
from .resume import RESAMPLES, failed_shapes, is_surplus, resampled_trials, worker_identity
from .schema import UNTRAINED_LOSS, LatencyRecord, TrialSeconds, TrialStatus, enqueue, recorded, store
from .scored import Scored

# The scores a trained trial stores: Scored's fields but the shape, size, latency and budget
# verdict, which the trial stored before training.
SCORE_ATTRS = tuple(f.name for f in fields(Scored) if f.name not in ("arch", "params", "latency", "within_budget"))
# Under --runtime onnxruntime-auto: the all-INT8 graph's latency record, which graph the trial is judged by
# ("int8" where its fp32 graph is over the budget), and the probe's ρ of each graph.
INT8_LATENCY = "latency_int8"
PRECISION_ATTRS = (INT8_LATENCY, "precision", "fidelity_fp32", "fidelity_int8")


def _earlier_result(trial: optuna.Trial, arch: str) -> optuna.trial.FrozenTrial | None:
    """A finished (COMPLETE) trial of the same shape, if any."""
    for other in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if recorded(other).arch == arch and other.number != trial.number:
            return other
    return None


def _running_elsewhere(trial: optuna.Trial, arch: str) -> int | None:
    """The number of an earlier trial of the same shape that is still running (another worker's), if any."""
    for other in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if other.number < trial.number and recorded(other).arch == arch:
            return other.number
    return None


def _stored_latency(trial: optuna.Trial, arch: str, attr: str = "latency") -> LatencyRecord | None:
    """A quiet latency of the same shape (its fp32 graph's, or with `attr` INT8_LATENCY its all-INT8 graph's)
    that any worker of the study measured (pruned, failed or running trials included): measured once per
    study, not once per worker."""
    for other in trial.study.get_trials(deepcopy=False):
        record = recorded(other)
        latency = getattr(record, attr)
        if other.number != trial.number and record.arch == arch and latency is not None and not latency.noisy:
            return reused(latency, other.number)
    return None


@dataclass
class _Clock:
    """A trial's seconds as its phases go, stored as its `TrialSeconds` however it ends."""

    start: float = field(default_factory=time.perf_counter)
    latency: float = 0.0
    distill: float = 0.0
    teacher: float | None = None  # set once it has trained: the one-time teacher work it did first

    def record(self) -> TrialSeconds:
        teacher = None if self.teacher is None else round(self.teacher, 3)
        return TrialSeconds(latency=round(self.latency, 3), distill=round(self.distill, 3), teacher=teacher,
                            total=round(time.perf_counter() - self.start, 3))


class Objective:
    """The callable handed to `study.optimize`."""

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx
        self.last_number: int | None = None  # the trial last started (nas.search.failed_meanwhile)

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        clock = _Clock()
        self.last_number = trial.number
        store(trial, "worker", worker_identity())
        if is_surplus(trial.study, trial.number, self.ctx.config.trial_count):
            store(trial, "status", TrialStatus.SURPLUS)
            store(trial, "reason", "surplus: another worker started the last trial at the same moment; not run")
            raise optuna.TrialPruned()
        try:
            return self._run(trial, clock)
        except optuna.TrialPruned:
            if recorded(trial).status != TrialStatus.REPEAT:  # a shape another worker trains: not the pruner's
                store(trial, "status", TrialStatus.PRUNED)
            raise
        except KeyboardInterrupt:
            store(trial, "status", TrialStatus.FAILED)
            store(trial, "fail_kind", "interrupted")
            store(trial, "reason", f"interrupted during {recorded(trial).phase!r}; retried on resume")
            raise
        except Exception as err:
            store(trial, "status", TrialStatus.FAILED)
            store(trial, "fail_kind", "error")
            message = first_line(err)
            store(trial, "reason", f"{type(err).__name__}: {message}"[:500])
            raise
        finally:
            store(trial, "seconds", clock.record())

    def _phase(self, trial: optuna.Trial, phase: str, shown: str | None = None) -> None:
        # `alive_at` lets a later run tell a slow trial from one whose worker died (nas/resume.py).
        store(trial, "phase", phase)
        store(trial, "alive_at", time.time())
        self.ctx.progress.phase(f"trial {trial.number}: {shown or phase}")

    def _run(self, trial: optuna.Trial, clock: _Clock) -> float | tuple[float, float]:
        ctx, cfg = self.ctx, self.ctx.config
        self._phase(trial, "propose")
        layers, heads, hidden, ffn = ctx.space.suggest(trial)
        arch = f"{layers}x{heads}x{hidden}x{ffn}"
        store(trial, "arch", arch)
        earlier = _earlier_result(trial, arch)
        if earlier is not None:
            return self._repeat(trial, earlier)
        if (running := _running_elsewhere(trial, arch)) is not None:
            # Workers proposing at once may propose one shape: the first trains it, the others are proposed again.
            store(trial, "status", TrialStatus.REPEAT)
            store(trial, "reason", f"same shape as trial {running}, which another worker is running: not trained "
                                   "twice; proposed again (not counted)")
            raise optuna.TrialPruned()
        reason = ctx.space.reject_reason(layers, heads, hidden, ffn)
        if reason is not None:
            return self._reject(trial, f"invalid shape: {reason}")
        failed = failed_shapes(trial.study).get(arch)
        if failed is not None:
            return self._reject(trial, f"failed twice, not tried again: {failed}")

        spec = StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **ctx.sizes)
        store(trial, "params", spec.num_parameters())
        store(trial, "flops", spec.flops(cfg.latency.seq))

        self._phase(trial, "latency")
        t0 = time.perf_counter()
        latency = self._latency(trial, spec, "latency")
        median = latency.median_ms
        # Under --runtime onnxruntime-auto a shape whose fp32 graph is over the budget is a candidate as INT8
        # (a precision plan grows from it at the final stage): its all-INT8 graph is then the one judged.
        judged = latency
        if median > ctx.budget_ms and cfg.latency.plans:
            judged = self._latency(trial, spec, INT8_LATENCY)
            store(trial, "precision", "int8")
        clock.latency = time.perf_counter() - t0
        trial.set_constraint("shape", 0.0)
        trial.set_constraint("latency", judged.median_ms - ctx.budget_ms)
        if recorded(trial).origin == "rule":
            self._rule_fallback(trial, median)
        if judged.median_ms > ctx.budget_ms:
            return self._over_budget(trial, judged)
        return self._train(trial, spec, judged, clock)

    def _latency(self, trial: optuna.Trial, spec: StudentSpec, attr: str) -> LatencyRecord:
        """The trial's latency record of one graph (`attr`: "latency", its fp32 graph; INT8_LATENCY, its all-INT8
        graph), stored as that attribute: another trial's reading of the shape, the latency model's prediction
        (fitted on the study's readings of the same graph) where it is sure of the verdict, else measured."""
        ctx, cfg = self.ctx, self.ctx.config
        judge = ctx.judge if attr == "latency" else ctx.judge.int8_twin()
        latency, fitted = _stored_latency(trial, spec.arch, attr), None
        if latency is None and cfg.run.latency_model and not judge.predicts:  # a profile needs no study model
            fitted = latency_prediction(spec, cfg, study_readings(trial.study.get_trials(deepcopy=False), attr))
            latency = predicted_latency(fitted, ctx.budget_ms)
        if latency is None:
            latency = model_check(trial_latency(spec, judge, ctx.budget_ms, ctx.teacher_latency_ms), fitted)
        store(trial, attr, latency)
        return latency

    def _rule_fallback(self, trial: optuna.Trial, median_ms: float) -> None:
        """The rule as a user with a stopwatch applies it: where the rule's shape reads over the budget it
        stands for, the next shallower full-width shape is queued, so the rule's student is always among a
        budget's candidates. (Measured: MPNet at 0.25x, a 30-minute search of three budgets — the rule's 3
        layers read 21.9 ms against 21.7, none of the search's five trials was full width within the budget,
        and the 2-layer full-width student, trained alike, beat the one it shipped.)"""
        rule_ms = recorded(trial).rule_budget_ms
        budget = self.ctx.budget_ms if rule_ms is None else rule_ms * (1.0 + self.ctx.tolerance)
        shallower = [n for n in self.ctx.space.layers if n < trial.params["layers"]]
        if median_ms <= budget or not shallower:
            return
        enqueue(trial.study, {**trial.params, "layers": max(shallower)}, {"origin": "rule", "rule_budget_ms": budget},
                skip_if_exists=True)

    def _train(self, trial: optuna.Trial, spec: StudentSpec, latency: LatencyRecord,
               clock: _Clock) -> float | tuple[float, float]:
        """Proxy-distil a shape within the budget, reporting interim rewards to the pruner; its score."""
        ctx, cfg = self.ctx, self.ctx.config
        self._phase(trial, "distill")
        median = latency.median_ms
        t0, passes, probe_s = time.perf_counter(), ctx.cache.pass_seconds, 0.0
        if cfg.proxy.kind == "fidelity" and "probe" not in vars(ctx):  # the teacher's embeddings of the probe
            _ = ctx.probe                                           # sentences: made once per search
            probe_s = time.perf_counter() - t0

        def on_eval(step: int, metrics: dict) -> None:
            held = ProxyMetrics.of_distill(metrics)
            loss = held.l_hs_norm
            self._phase(trial, "distill", f"distill {step}/{cfg.proxy.steps} L_HS {loss:.3f}")
            store(trial, "last_eval", {"step": step, "l_hs_norm": loss, "l_hs_raw": held.l_hs_raw,
                                       "l_hs_se": held.l_hs_se})
            if cfg.reward.objective != "reward" or cfg.proxy.kind != "hs":
                return  # Optuna reports/pruning are single-objective only; the fidelity proxy is scored at its end
            interim = ctx.reward(loss, median)
            trial.report(interim, step)
            if cfg.pruning and step < cfg.proxy.steps and trial.should_prune():
                clock.distill = time.perf_counter() - t0
                store(trial, "reason", f"pruned at step {step}/{cfg.proxy.steps}: reward {interim:.4f} "
                                              "below the median of earlier trials at this step")
                raise optuna.TrialPruned(f"step {step}")

        result, metrics = ctx.proxy(spec, on_eval=on_eval)
        clock.distill = time.perf_counter() - t0
        # The one-time teacher work this trial happened to do first: not the pace of a trial (nas.search).
        clock.teacher = ctx.cache.pass_seconds - passes + probe_s
        # The shape's pace under the proxy's recipe: with the fidelity proxy, the final run's (nas.time_limit).
        store(trial, "step_s", round(result.train_seconds / max(1, result.steps), 4))
        metrics = self._int8_scores(trial, spec, result.student, metrics)
        scored = ctx.score(spec, metrics, latency)
        for key in SCORE_ATTRS:  # shape and latency are stored already
            store(trial, key, getattr(scored, key))
        store(trial, "train_loss", metrics.train_loss)
        store(trial, "status", TrialStatus.FEASIBLE)
        self._phase(trial, "done")
        return scored.reward if cfg.reward.objective == "reward" else (scored.loss, median)

    def _int8_scores(self, trial: optuna.Trial, spec: StudentSpec, student: Any, metrics: ProxyMetrics) -> ProxyMetrics:
        """The proxy's metrics of the graph the trial is judged by. Under --runtime onnxruntime-auto with the
        fidelity proxy, the trained student's all-INT8 graph is scored on the probe too wherever a budget of the
        search needs it (its fp32 graph over the smallest budget; its INT8 latency is read then, if not yet):
        where the INT8 graph is the one judged, its ρ is the trial's fidelity. The fp32 ρ is kept beside it."""
        ctx, cfg = self.ctx, self.ctx.config
        if not (cfg.latency.plans and cfg.proxy.kind == "fidelity"):
            return metrics
        fp32_ms = recorded(trial).latency.median_ms
        store(trial, "fidelity_fp32", metrics.fidelity)
        if fp32_ms <= ctx.smallest_budget_ms:
            return metrics
        if recorded(trial).latency_int8 is None:
            self._latency(trial, spec, INT8_LATENCY)
        self._phase(trial, "int8", "its INT8 graph on the probe")
        int8 = ctx.int8_fidelity(student)
        store(trial, "fidelity_int8", float(int8.spearman))
        return metrics.with_fidelity(int8) if recorded(trial).precision == "int8" else metrics

    def _repeat(self, trial: optuna.Trial, earlier: optuna.trial.FrozenTrial) -> float | tuple[float, float]:
        # Same shape, same data, same seed: training again would give the same numbers (and cost
        # minutes). Copy the result, say so, and let the sampler move on.
        for key, value in earlier.constraints.items():
            trial.set_constraint(key, value)
        for key in ("status", "reason", "params", "flops", "latency", *SCORE_ATTRS, "train_loss", "last_eval", "step_s",
                    *PRECISION_ATTRS):
            if (value := getattr(recorded(earlier), key)) is not None:
                store(trial, key, value)
        note = f"same shape as trial {earlier.number}: result copied, not retrained"
        reason = recorded(earlier).reason
        store(trial, "duplicate_of", earlier.number)
        tried = {recorded(t).arch for t in trial.study.get_trials(deepcopy=False)} - {None}
        if len(tried) < self.ctx.space.size and resampled_trials(trial.study) < RESAMPLES * self.ctx.config.trial_count:
            # one trial per shape: the sampler learns its value and proposes again; --trials buys distinct shapes
            # (counted once every shape of the space was tried, or after RESAMPLES x --trials proposals again)
            store(trial, "status", TrialStatus.REPEAT)
            note += ", proposed again (not counted)"
        store(trial, "reason", f"{note}; {reason}" if reason else note)
        values = earlier.values
        return values[0] if len(values) == 1 else tuple(values)

    def _reject(self, trial: optuna.Trial, reason: str) -> float | tuple[float, float]:
        # Settled at once; recorded as infeasible so the sampler learns to avoid the shape.
        trial.set_constraint("shape", 1.0)
        trial.set_constraint("latency", 0.0)
        store(trial, "status", TrialStatus.REJECTED)
        store(trial, "reason", reason)
        return self._untrained(2.0 * self.ctx.budget_ms)

    def _over_budget(self, trial: optuna.Trial, latency: LatencyRecord) -> float | tuple[float, float]:
        """A shape over the budget is not trained. One the latency model puts over it, unmeasured, is
        proposed again: it does not count towards `--trials` (up to RESAMPLES x `--trials` of them), so the
        trials a study counts are shapes within or near the budget."""
        median, budget = float(latency.median_ms), self.ctx.budget_ms
        if latency.predicted and resampled_trials(trial.study) < RESAMPLES * self.ctx.config.trial_count:
            store(trial, "status", TrialStatus.RESAMPLED)
            store(trial, "reason", f"predicted {median:.2f} ms > budget {budget:.2f} ms; not measured, "
                                          "proposed again (not counted)")
        else:
            store(trial, "status", TrialStatus.INFEASIBLE)
            how = "predicted" if latency.predicted else "latency"
            store(trial, "reason", f"{how} {median:.2f} ms > budget {budget:.2f} ms; not trained")
        return self._untrained(median)

    def _untrained(self, latency_ms: float) -> float | tuple[float, float]:
        if self.ctx.config.reward.objective == "reward":
            return self.ctx.reward(UNTRAINED_LOSS, latency_ms)  # = 0.0
        return (UNTRAINED_LOSS, latency_ms)
