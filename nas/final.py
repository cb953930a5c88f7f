"""After the search: distill the winner(s) longer, export with checks, profile, write out.

The winner is the feasible trial with the best reward (for the Pareto objective: the front
member with the best KD-NAS reward), or the FFN neighbour of a finalist that the proxy ranks above
it (`nas.neighbours`: the budget's edge often lies between two FFN widths). It is distilled again
from its start (or, after a wider finalist of its shape was refused as shipped, from that one's
trained weights narrowed: `_Stage.trained_wider`)
for `final_steps` on a transfer set of `final_rows` sequences (`final_train`, more
for a long run) with the proxy's held-out rows (so the losses compare), exported (ONNX + fused +
INT8, parity-checked by `export`; model.onnx the fused or the plain graph, whichever runs faster
here: `nas.variant`), made a sentence-transformers drop-in for the teacher (the
teacher's pooling and normalization, also inside model.onnx's `sentence_embedding`), given a model
card, and profiled with the same latency settings as the search. Results are kept in the study
(`final`), so a rerun of a finished search does not redo them.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from kdnas.distill import Checkpoints, DistillResult, Evaluator, StudentSpec, narrowed_from, parse_arch
from kdnas.distill import distill as run_distill
from kdnas.distill.loop import fit_steps, resolve_precision
from kdnas.distill.trainer import resolve_device
from kdnas.core.errors import InputError
from kdnas.core.files import atomic_write_text, make_shared

from .budgets import Budget, within
from .config import FINAL_MAX_PASSES
from .measure import LatencyJudge, beside_teacher, budget_latency, latency_record
from .neighbours import MAX_NEIGHBOURS, NARROWER, WIDER, candidates, ffn_neighbour, on_trial_scale, rank_in
from .records import pareto_front, trial_pace, trial_rows
from .resume import worker_alive, worker_identity
from .time_limit import MARGIN, after_training_s, fallback_s, marginal, settled
from .trial import final_transfer_set
from .variant import PLAIN, VariantChoice, choose_variant, ship_plain


# A finalist over the budget is not shipped; the next one is trained instead, up to this many extra.
MAX_OVER_BUDGET = 2
# A run that continues a refused finalist (`_Stage.trained_wider`) is not made when fewer steps than
# this fit: with per-feature token states 20 steps undid part of what the narrowed student keeps
# (ρ 0.838 → 0.709 at lr 6e-4; 0.835 → 0.788 at 3e-4) where 100 steps added to it (0.870; 0.873).
# Today's recipe (plain MSE, 1e-3) loses nothing in 20 steps (0.850 → 0.856) but gains most in 100
# (0.883); below that it ships as narrowed (measured: a one-off benchmark, in git history).
MIN_CONTINUED_STEPS = 100


def finalists(study: optuna.Study, objective: str, budget: Budget | None = None) -> list[dict[str, Any]]:
    """Every trained candidate for the final phase, best reward first (Pareto: front members only); with
    `budget`, of the trials within it (one of several budgets: `nas.budgets`)."""
    copies = _copies(study)
    rows = [r for r in trial_rows(study) if r["number"] not in copies]
    rows = rows if budget is None else within(rows, budget)
    pool = pareto_front(rows) if objective == "pareto" else [
        r for r in rows if r["status"] == "feasible" and r["reward"] is not None]
    return sorted(pool, key=lambda r: -r["reward"])


def _copies(study: optuna.Study) -> set[int]:
    """Trials that copied an earlier trial's result (the same shape): one candidate per shape, so a shape
    refused as shipped is not tried again under its copy's number (a demo whose first trial, the rule's
    3x12x384x1536, was proposed again as trial 3 measured it twice and trained it 182 steps)."""
    return {t.number for t in study.get_trials(deepcopy=False) if "duplicate_of" in t.user_attrs}


def final_dir(out: Path, rank: int, arch: str, label: str | None = None) -> Path:
    """`best/` and `finalists/RANK-ARCH/`; for one of several budgets `best-LABEL/` and `finalists/LABEL/RANK-ARCH/`."""
    if rank == 1:
        return out / Budget(0.0, label).best
    return out / "finalists" / (f"{rank}-{arch}" if label is None else f"{label}/{rank}-{arch}")


def state_file(dest: Path) -> Path:
    """Where a finalist's run keeps its saved state until the finalist is written (distill.checkpoint)."""
    return dest.parent / f".{dest.name}.state.pt"


def _recipe(cfg: Any, label: str | None = None) -> dict[str, Any]:
    """What decides a final run besides the trial: a rerun with another recipe trains again. One of several
    budgets (`label`) keeps its own finalists, refusals and neighbours."""
    return {**({} if label is None else {"budget": label}),"steps": cfg.final_steps, "train": cfg.final_rows, "unit": cfg.final_unit, "method": cfg.final_method,
            "lr": cfg.final_lr, "batch_size": cfg.final_batch_size, "init": cfg.init, "layer_rule": cfg.layer_rule,
            # only when set: a study resumed from before the option keeps its finalists
            **({} if cfg.final_augment is None else {"augment": cfg.final_augment}),
            **({} if cfg.final_embed_terms is None else {"embed_terms": cfg.final_embed_terms})}


def _over_budget(study: optuna.Study, cfg: Any, label: str | None = None) -> list[dict[str, Any]]:
    """Finalists already trained with this recipe whose shipped model missed the budget."""
    return [s for s in study.user_attrs.get("final_over_budget") or [] if s.get("recipe") == _recipe(cfg, label)]


def _neighbours(study: optuna.Study, cfg: Any, label: str | None = None) -> list[dict[str, Any]]:
    """FFN neighbours of finalists scored with this recipe (nas.neighbours)."""
    return [n for n in study.user_attrs.get("final_neighbours") or [] if n.get("recipe") == _recipe(cfg, label)]


def _shippable(study: optuna.Study, pool: list[dict[str, Any]], cfg: Any,
               label: str | None = None) -> list[dict[str, Any]]:
    return candidates(pool, _over_budget(study, cfg, label), _neighbours(study, cfg, label))[:cfg.final_top_k]


def _of_other_budgets(records: list[dict[str, Any]], label: str | None) -> list[dict[str, Any]]:
    """The records of a study's other budgets, kept when one budget's are written (none for a single budget,
    whose records of an earlier recipe are replaced, as they always were)."""
    return [r for r in records if (r.get("recipe") or {}).get("budget") != label]


def claim_final(study: optuna.Study, stale_after_s: float) -> str | None:
    """Take the final stage for this worker; None when it is ours, else who holds it (one line).

    The claim is a study named `<study>:final` created through the storage: creating a study is
    atomic in every Optuna storage, so of N workers that finish together exactly one gets it. A
    claim whose worker is gone (same host: its process; another host: older than `stale_after_s`)
    is taken over, so a rerun after a crash still ships.
    """
    name = f"{study.study_name}:final"
    me = {**worker_identity(), "claimed_at": time.time()}
    for _ in range(2):
        try:
            claim = optuna.create_study(storage=study._storage, study_name=name)
            claim.set_user_attr("worker", me)
            return None
        except optuna.exceptions.DuplicatedStudyError:
            holder = optuna.load_study(study_name=name, storage=study._storage).user_attrs.get("worker") or {}
            if holder and worker_alive(holder, holder.get("claimed_at"), stale_after_s):
                return (f"the final stage is run by another worker (host {holder.get('host')}, pid {holder.get('pid')}); "
                        "its best/ is in that worker's --out")
            try:
                optuna.delete_study(study_name=name, storage=study._storage)  # a dead worker's claim
            except KeyError:
                pass  # another worker removed it first; try to create it again
    return "the final stage was claimed by another worker a moment ago"


def is_done(study: optuna.Study, out: Path, pool: list[dict[str, Any]], ctx: Any) -> bool:
    """Whether the final stage of `ctx`'s budget has shipped `pool`'s candidates with this recipe already."""
    cfg, label = ctx.config, ctx.budget_label
    done = [f for f in study.user_attrs.get("final") or [] if (f.get("recipe") or {}).get("budget") == label]
    want = [(r["number"], _recipe(cfg, label), str(final_dir(out, i, r["arch"], label)))
            for i, r in enumerate(_shippable(study, pool, cfg, label), 1)]
    have = [(f["trial"], f.get("recipe"), f["dir"]) for f in done]
    return have == want and all((Path(d) / "export.json").is_file() for *_, d in want)


def run_final(study: optuna.Study, ctx: Any, out: Path, pool: list[dict[str, Any]], later: int = 0
              ) -> list[dict[str, Any]]:
    """Distill, ship and profile the best `final_top_k` candidates whose shipped model.onnx is within
    `ctx`'s budget: the trials of `pool`, best reward first, and their FFN neighbours (nas.neighbours).
    A finalist over the budget is moved to `over-budget/` and the next candidate is tried. `later`:
    the finalists of the search's other budgets still to train after these (a --timeout shares the time)."""
    from kdnas.distill import TeacherCache, targets_dir
    from kdnas.core.assets import teacher_path
    from kdnas.export import read_sentence_pipeline
    from kdnas.export import check_pooling

    cfg = ctx.config
    # Read before the long final distillation, so a teacher pipeline the export cannot match fails now.
    teacher_dir = teacher_path(cfg.teacher)
    pipeline = read_sentence_pipeline(teacher_dir)
    check_pooling(pipeline["pooling"])
    if cfg.proxy == "fidelity" and ctx.cache is not None and cfg.final_rows == cfg.final_train:
        cache = ctx.cache  # the fidelity proxy trained on this transfer set: its teacher targets are computed
    else:
        ctx.progress.phase(f"final: transfer set of {cfg.final_rows} {cfg.final_unit}s, teacher targets")
        data = final_transfer_set(cfg, ctx.teacher, ctx.texts)
        cache = TeacherCache(ctx.teacher, data, directory=targets_dir(cfg.cache_dir),
                             on_rows=ctx.progress.counter("final: teacher targets", "rows"),
                             last_layer=getattr(ctx.cache, "last_layer", None))
    cache = _with_stored_rows(ctx, cache)
    stage = _Stage(study, ctx, pool)
    # a proxy run's seconds, for a --timeout's fallback estimate: the trials' median (the first
    # trial's also holds the teacher targets of the transfer set)
    proxy_s = statistics.median([r["seconds_distill"] - (r.get("seconds_teacher") or 0.0)
                                 for r in pool if r.get("seconds_distill")] or [0.0])
    results: list[dict[str, Any]] = []
    while stage.queue and len(results) < cfg.final_top_k and stage.refused_trials() <= MAX_OVER_BUDGET:
        row = stage.queue.pop(0)
        rank = len(results) + 1
        label = f"final {rank}/{cfg.final_top_k} {row['arch']}" + (
            "" if ctx.budget_label is None else f" ({ctx.budget_label})")
        if not _ready(stage, row, pipeline, label):
            continue
        timing = {"step_s": stage.step_s[row["arch"]], "finalists_left": cfg.final_top_k - len(results) + later,
                  "marginal": stage.marginal.get(row["arch"], False), "proxy_s": proxy_s,
                  "train_step_s": trial_pace(study, row["number"]) or 0.0, "variant": stage.variant.get(row["arch"])}
        entry = _finish(ctx, cache, final_dir(out, rank, row["arch"], ctx.budget_label), row, label, teacher_dir,
                        pipeline, timing, stage.trained_wider(row))
        if entry["within_budget"]:
            results.append(entry | {"rank": rank})
            continue
        stage.refuse(_over_record(row, ctx, _set_aside(out, entry, ctx.budget_label), entry["latency_ms"],
                                  entry["latency_readings_ms"]) | _drift_of(entry)
                     | {"steps": entry["steps"], "distill_s": entry["seconds"]["distill"]})
        stage.propose(row, NARROWER)
    study.set_user_attr("final", _of_other_budgets(study.user_attrs.get("final") or [], ctx.budget_label)
                        + _jsonable(results))
    if not results:
        tried = ", ".join(f"{s['arch']} {s['latency_ms']:.2f} ms" for s in stage.over)
        raise InputError(f"no finalist fits {ctx.budget_named} as shipped ({tried}); "
                         f"raise --budget-ms or search again")
    return results


class _Stage:
    """The final stage's bookkeeping: the candidates left, the shapes refused over the budget and the
    neighbours scored (both kept in the study, so a rerun replays them), this run's readings."""

    def __init__(self, study: optuna.Study, ctx: Any, pool: list[dict[str, Any]]) -> None:
        self.study, self.ctx = study, ctx
        self.over = _over_budget(study, ctx.config, ctx.budget_label)
        self.neighbours = _neighbours(study, ctx.config, ctx.budget_label)
        self.queue = candidates(pool, self.over, self.neighbours)
        self.tried = {r["arch"] for r in trial_rows(study) + pool}
        # Each shape's shipped-graph reading in this run; a shape over the budget never returns to
        # the queue, so a shape read here fits.
        self.now: dict[str, float] = {}
        # and the seconds per step of it (the export, each reading of the graph or the teacher) for
        # a --timeout's estimate of what follows the final run (nas.time_limit)
        self.step_s: dict[str, float] = {}
        # and whether that reading was too close to the budget to count on (nas.time_limit.marginal)
        self.marginal: dict[str, bool] = {}
        # and which fp32 graph it ships (nas.variant), where the choice was made
        self.variant: dict[str, VariantChoice | None] = {}
        self.proposed = 0

    def refused_trials(self) -> int:
        """Finalists refused, not counting neighbours (a neighbour's refusal costs seconds)."""
        return sum("neighbour_of" not in s for s in self.over)

    def refuse(self, record: dict[str, Any]) -> None:
        self.over.append(record)
        self.save()

    def scored(self, row: dict[str, Any]) -> None:
        self.neighbours.append(row)
        self.save()

    def propose(self, row: dict[str, Any], direction: int) -> bool:
        """Queue `row`'s FFN neighbour in `direction` to be tried next; False when there is none."""
        taken = self.tried | {r["arch"] for r in self.over + self.neighbours + self.queue}
        neighbour = ffn_neighbour(self.ctx.space, row, direction, taken) if self.proposed < MAX_NEIGHBOURS else None
        if neighbour is None:
            return False
        self.proposed += 1
        rank_in(self.queue, neighbour)
        return True

    def trained_wider(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The finalist refused as shipped whose training `row` continues: the same layers, heads and
        width at the nearest wider FFN, its folder still in over-budget/ (None when there is none).
        Its trained weights, narrowed, are a far better start than the teacher's: 3x12x384x1536 after
        680 steps, cut to 1280 FFN neurons, reaches ρ 0.873 after 100 more steps, the teacher-inherited
        3x12x384x1280 0.803 (docs/design/final-recipe.md, "A refused finalist's training, handed on")."""
        mine = _spec(self.ctx, row)
        trained = [(parse_arch(s["arch"], **self.ctx.sizes), s) for s in self.over
                   if s["stage"] == "as shipped" and s.get("steps") and s.get("dir") and Path(s["dir"]).is_dir()]
        wider = [(spec.ffn, s) for spec, s in trained if replace(spec, ffn=mine.ffn) == mine and spec.ffn > mine.ffn]
        return min(wider, key=lambda pair: pair[0])[1] if wider else None

    def save(self) -> None:
        label, attrs = self.ctx.budget_label, self.study.user_attrs
        for key, records in (("final_over_budget", self.over), ("final_neighbours", self.neighbours)):
            self.study.set_user_attr(key, _of_other_budgets(attrs.get(key) or [], label) + _jsonable(records))


def _ready(stage: _Stage, row: dict[str, Any], pipeline: dict[str, Any], label: str) -> bool:
    """Whether `row` is to be trained now. Its shipped graph (pooling and normalization included) is
    timed first: weights do not change latency, so a finalist that cannot fit costs seconds, not
    minutes, and its narrower FFN neighbour is tried next. A neighbour that fits is scored by the
    proxy and waits its turn when it ranks below the next candidate; a finalist about to be trained
    first lets its wider FFN neighbour go ahead of it."""
    ctx = stage.ctx
    if row["arch"] not in stage.now:
        t0 = time.perf_counter()
        before, readings, drift, steps, stage.variant[row["arch"]] = _shipped_graph_latency(
            ctx, _spec(ctx, row), pipeline, label)
        stage.now[row["arch"]], stage.step_s[row["arch"]] = before, (time.perf_counter() - t0) / steps
        stage.marginal[row["arch"]] = marginal(before, ctx.budget_ms, bool(readings))
        if before > ctx.budget_ms:
            stage.refuse(_over_record(row, ctx, None, before, readings) | drift)
            stage.propose(row, NARROWER)
            return False
        if row["reward"] is None:
            row.update(_score_neighbour(ctx, row, before, stage.now.get(row["neighbour_of"]), label))
            stage.scored(row)
            following = stage.queue[0]["reward"] if stage.queue else None
            if following is not None and following > row["reward"]:
                rank_in(stage.queue, row)
                return False
    if stage.propose(row, WIDER):
        rank_in(stage.queue, row)  # behind its wider neighbour, which is measured and scored first
        return False
    return True


def _score_neighbour(ctx: Any, row: dict[str, Any], read_ms: float, parent_now_ms: float | None,
                     label: str) -> dict[str, Any]:
    """A neighbour's score as a trial's: the search's proxy, and its shipped graph's reading put on
    the scale its parent was scored with (`nas.neighbours.on_trial_scale`)."""
    ctx.progress.phase(f"{label}: the proxy, as for a trial (FFN neighbour of {row['neighbour_of']})")
    spec = _spec(ctx, row)
    latency_ms, factor = on_trial_scale(read_ms, row.get("parent_latency_ms"), parent_now_ms)
    scored = ctx.score(spec, ctx.proxy(spec).metrics, {"median_ms": latency_ms})
    return {"reward": scored.reward, "proxy": _jsonable(scored.record()), "recipe": _recipe(ctx.config, ctx.budget_label),
            "latency_read_ms": read_ms, "parent_read_ms": parent_now_ms, "latency_scaled_by": round(factor, 4)}


def _spec(ctx: Any, row: dict[str, Any]) -> StudentSpec:
    return StudentSpec(layers=row["layers"], heads=row["heads"], hidden=row["hidden"], ffn=row["ffn"], **ctx.sizes)


def _shipped_graph_latency(ctx: Any, spec: StudentSpec, pipeline: dict[str, Any], label: str
                           ) -> tuple[float, list[float], dict[str, Any], int, VariantChoice | None]:
    """Median latency of the graph `best/` will ship, built with random weights, as the budget judges it
    (`_final_latency`) — read twice and averaged when within the margin of the budget
    (`nas.time_limit.settled`); with the readings if an absolute budget's first was over, the
    teacher's re-reading if any, how many steps (each export, reading, pair) it took, and on
    onnxruntime fp32 the fp32 graph chosen (`nas.variant`: fused or plain, the faster here)."""
    from kdnas.export import export_model

    ctx.progress.phase(f"{label}: latency of the shipped graph, before training")
    judged, _ = shipped_graphs(ctx.config.runtime)
    with tempfile.TemporaryDirectory(prefix="kdnas-final-") as tmp:
        def exported(name: str, **options: Any) -> Path:
            export_model(spec, Path(tmp) / name, tokenizer=ctx.teacher.tokenizer, pooling=pipeline["pooling"],
                         normalize=pipeline["normalize"], **options)
            return Path(tmp) / name / judged

        graph, choice = exported(spec.arch, int8=judged == INT8_GRAPH), None
        if ctx.config.runtime == "onnxruntime":
            ctx.progress.phase(f"{label}: fused or plain fp32 graph, timed side by side")
            choice = choose_variant(graph, exported("plain", optimize=False), ctx.judge.pair)
            graph = graph if choice.shipped != PLAIN else Path(tmp) / "plain" / judged
        result, readings, drift = _final_latency(ctx, graph, label)
        before, settling = float(result.median_ms), []
        if not readings:
            before, settling = settled(before, ctx.budget_ms,
                                       lambda: float(_final_latency(ctx, graph, label)[0].median_ms))
    steps = 1 + max(1, len(readings)) + bool(drift) + (2 if choice else 0)
    if settling:
        ctx.progress.phase(f"{label}: read again, within {MARGIN:.0%} of the budget: {settling[0]:.2f} and "
                           f"{settling[1]:.2f} ms, {before:.2f} ms counted")
        drift, steps = drift | {"settled_from_ms": settling}, steps + 1 + bool(drift)
    return before, readings, drift, steps, choice


def _final_latency(ctx: Any, graph: Path, label: str) -> tuple[Any, list[float], dict[str, Any]]:
    """A finalist's graph as the budget judges it. A ratio budget: timed side by side with the teacher
    (`beside_teacher`; read alone, one graph moved from 12.39 to 9.09 ms within a minute, and a
    finalist that fitted before its training was refused after it). An absolute budget (--budget-ms):
    `budget_latency`, read again when over. Returns the result, the graph's readings when there were
    two, and the side-by-side facts (empty for an absolute budget)."""
    if ctx.config.budget_ms is None:
        result, facts = beside_teacher(graph, ctx.judge, ctx.teacher_latency_ms)
        ctx.progress.phase(f"{label}: {facts['ratio_to_teacher']:.3f}x the teacher side by side "
                           f"({result.median_ms:.2f} ms against the budget's {ctx.budget_ms:.2f} ms)")
        return result, [], facts
    result, readings = budget_latency(graph, ctx.judge, ctx.budget_ms)
    _say_readings(ctx, label, readings)
    return result, readings, {}


SIDE_BY_SIDE = ("ratio_to_teacher", "ratio_quartiles", "teacher_latency_now_ms", "read_ms", "latency_scaled_by")


def _drift_of(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: entry[key] for key in SIDE_BY_SIDE if key in entry}


def _say_readings(ctx: Any, label: str, readings: list[float]) -> None:
    if readings:
        ctx.progress.phase(f"{label}: {readings[0]:.2f} ms is over the budget of {ctx.budget_ms:.2f} ms; "
                           f"measured again: {readings[1]:.2f} ms")


def _over_record(row: dict[str, Any], ctx: Any, moved_to: Path | None, latency_ms: float,
                 readings: list[float]) -> dict[str, Any]:
    return {"trial": row["number"], "arch": row["arch"], "recipe": _recipe(ctx.config, ctx.budget_label),
            "stage": "before training" if moved_to is None else "as shipped",
            "dir": None if moved_to is None else str(moved_to), "latency_ms": latency_ms, "budget_ms": ctx.budget_ms,
            "latency_readings_ms": readings, **_origin_of(row)}


def _origin_of(row: dict[str, Any]) -> dict[str, str]:
    return {"neighbour_of": row["neighbour_of"]} if "neighbour_of" in row else {}


def _set_aside(out: Path, entry: dict[str, Any], label: str | None = None) -> Path:
    """Move an over-budget finalist out of `best/` (kept for inspection); returns where it went."""
    dest = out / "over-budget" / ("" if label is None else label) / f"{entry['trial']}-{entry['arch']}"
    if dest.exists():
        shutil.rmtree(dest)  # an earlier run's copy of the same finalist
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(entry["dir"], dest)
    return dest


def _finish(ctx: Any, cache: Any, dest: Path, row: dict[str, Any], label: str, teacher_dir: str,
            pipeline: dict[str, Any], timing: dict[str, Any], start: dict[str, Any] | None) -> dict[str, Any]:
    """Distill one finalist with the final recipe, measure it against the baselines, ship it.
    `timing`: the seconds per step of its shipped graph's pre-training export and reading, whether
    that reading was marginal, a proxy run's seconds, its trial's pace per update and the finalists
    still to train, from which a `--timeout` fits the run (nas.time_limit); `start`: the refused
    wider finalist whose training it continues (`_Stage.trained_wider`), if any."""
    from .baselines import baseline_fidelity, fidelity_table, int8_fidelity
    from .card import write_model_card

    cfg, data = ctx.config, cache.data
    spec = _spec(ctx, row)
    ctx.progress.phase(f"{label}: untrained baselines' fidelity")
    t0 = time.perf_counter()
    prepared = baseline_fidelity(ctx, spec, cache)
    baselines_s = time.perf_counter() - t0
    after_s = after_training_s(timing["step_s"], baselines_s)  # what a --timeout leaves for after the run
    variant = timing.get("variant")
    after_s += timing["step_s"] if variant is not None and variant.shipped == PLAIN else 0.0  # its second export
    if timing["marginal"]:  # and for the next candidate, should this one read over the budget as shipped
        after_s += fallback_s(after_s, timing["step_s"], baselines_s, timing["proxy_s"],
                              MIN_CONTINUED_STEPS * timing["train_step_s"])
    t0 = time.perf_counter()
    res = _distill_in_time(ctx, cache, spec, label, None if ctx.limit is None else
                           ctx.limit.final_until(after_s, timing["finalists_left"]), start, state_file(dest))
    student = res.student.eval()
    t1 = time.perf_counter()
    ctx.progress.phase(f"{label}: fidelity")
    passes = res.steps * res.config.batch_size / (res.rows or data.num_train)
    quality = fidelity_table(ctx, spec, student, cache, prepared, passes=round(passes, 2))
    t2 = time.perf_counter()
    ctx.progress.phase(f"{label}: export")
    shipped = _ship(ctx, student, dest, teacher_dir, pipeline, variant,
                     {**res.summary(), "search_trial": row["number"], "teacher": cfg.teacher, "corpus": cfg.corpus,
                      "transfer_set": {"train": res.rows or data.num_train, "eval": data.num_eval,
                                       "seq_len": data.seq_len, "unit": cfg.final_unit}})
    if quality and "fidelity" in quality:  # the INT8 graph as shipped, on the same sentences
        quality["int8"] = int8_fidelity(ctx, prepared, dest / "model.int8.onnx")
    t3 = time.perf_counter()
    ctx.progress.phase(f"{label}: latency")
    latency, readings, drift, graphs = _shipped_latencies(ctx, dest, label)
    judged = shipped_graphs(cfg.runtime)[0]
    entry = {
        "trial": row["number"], **ctx.score(spec, ctx.measured(res), latency).record(), "dir": str(dest),
        "recipe": _recipe(cfg, ctx.budget_label), "steps": res.steps, "steps_planned": cfg.final_steps,
        "steps_most": cfg.final_most, "timeout_s": cfg.timeout, "budget_ms": ctx.budget_ms, "budget": ctx.budget_label,
        "train": cfg.final_rows, "train_rows": res.rows or data.num_train,
        "init": res.init, "precision": res.precision, "augment": res.config.augment if res.steps else 0.0,
        "embed_terms": res.config.embed_terms if res.steps else None,
        "latency_readings_ms": readings, "latency_int8_onnx": graphs[INT8_GRAPH], "latency_fp32_onnx": graphs[FP32_GRAPH],
        "budget_graph": judged,
        "proxy_reward": row["reward"], **_origin_of(row), "quality": quality, **shipped, **drift,
        "seconds": {"baselines": round(baselines_s, 3), "distill": round(t1 - t0, 3), "quality": round(t2 - t1, 3),
                    "export": round(t3 - t2, 3), "latency": round(time.perf_counter() - t3, 3),
                    "set_aside_after_distill": round(after_s, 3)},
    }
    atomic_write_text(dest / "search.json", json.dumps(entry, indent=2, default=str) + "\n")
    write_model_card(dest, entry, cfg)
    state_file(dest).unlink(missing_ok=True)  # the finalist is written: nothing left to go on from
    return entry


FP32_GRAPH, INT8_GRAPH = "model.onnx", "model.int8.onnx"


def shipped_graphs(runtime: str) -> tuple[str, str]:
    """(the graph of a shipped folder the budget judges, the other one): the INT8 graph on
    `--runtime onnxruntime-int8`, what CPU users deploy; the fused fp32 one otherwise."""
    return (INT8_GRAPH, FP32_GRAPH) if runtime == "onnxruntime-int8" else (FP32_GRAPH, INT8_GRAPH)


def _shipped_latencies(ctx: Any, dest: Path, label: str) -> tuple[dict, list[float], dict, dict[str, dict]]:
    """The graphs as shipped (fused fp32, INT8), not a rebuild from config.json: the one the runtime's budget
    judges (`shipped_graphs`) as the budget judges it, the other read right after; (the judged graph's
    latency record, its readings, the side-by-side facts, both records by file name)."""
    judged, other = shipped_graphs(ctx.config.runtime)
    shipped, readings, drift = _final_latency(ctx, dest / judged, label)
    latency = latency_record(shipped)
    return latency, readings, drift, {judged: latency, other: _other_latency(ctx.judge, dest / other, drift)}


def _other_latency(judge: LatencyJudge, graph: Path, drift: dict[str, float]) -> dict[str, Any]:
    """The latency record of the shipped graph the budget does not judge, read right after the judged one
    beside the teacher and so scaled by the teacher's drift in that pair (with the reading itself where it
    was scaled)."""
    other = judge.alone(graph)
    factor = drift.get("latency_scaled_by", 1.0)
    return latency_record(other.scaled(factor)) | ({"read_ms": float(other.median_ms)} if factor != 1.0 else {})


def _distill_in_time(ctx: Any, cache: Any, spec: StudentSpec, label: str, until: float | None,
                     start: dict[str, Any] | None, state: Path) -> Any:
    """The final recipe's run, fitted to end by `until` when a --timeout set one; from the inherited
    student, or from `start`'s trained weights narrowed to `spec` (`distill.narrowed`). A run of a
    fixed step count (no --timeout) saves its state in `state` every `final_save_every` steps, so a
    rerun of a search stopped during it goes on from there."""
    cfg, config, student = ctx.config, ctx.final_config(), None
    config = replace(config, augment=cfg.augment_for(cache.data.num_train))
    if config.augment and cfg.final_augment is None:
        ctx.progress.note(f"{label}: the corpus gave {cache.data.num_train} {cfg.final_unit}s, too few for "
                          f"{cfg.final_steps} steps to see each at most {FINAL_MAX_PASSES} times: {config.augment:.0%} "
                          "of the batches are perturbed, the teacher labelling them (--final-augment 0: none)")
    if start is not None:
        student = _narrowed_start(ctx, cache, spec, start, label)
        config = replace(config, freeze_embeddings=True)  # frozen in the run it continues
        if _continued_steps(cfg, start, until) < MIN_CONTINUED_STEPS:
            ctx.progress.note(f"{label}: ships as narrowed from {start['arch']}: fewer than "
                              f"{MIN_CONTINUED_STEPS} steps would fit, and so few take fidelity away")
            return DistillResult(student=student, spec=spec, config=config, init=_continued(start),
                                 metrics={"step": 0, **Evaluator(cache, strategy=config.eval_layer_map)(student)},
                                 precision=resolve_precision(config.precision, resolve_device(config.device)))
    ctx.progress.phase(f"{label}: distill {cfg.final_steps} steps ({cfg.final_method})" + (
        "" if until is None else _fitted_to(cfg)))
    res = run_distill(spec, ctx.teacher, cache.data, config, cache=cache, until=until, student=student,
                      up_to=cfg.final_most, grow=_grower(ctx, cache, label),
                      checkpoints=None if until is not None or not cfg.final_save_every
                      else Checkpoints(state, cfg.final_save_every),
                      on_step=ctx.progress.counter(f"{label}: distill ({cfg.final_method})"))
    if start is not None:
        res.init = _continued(start)
    if res.cut_short:
        ctx.progress.note(f"{label}: {res.steps} of {cfg.final_steps} steps fitted in the time --timeout "
                          f"{cfg.timeout:g} s left")
    elif res.extended:
        ctx.progress.note(f"{label}: {res.steps} steps, {res.steps - cfg.final_steps} more than --final-steps "
                          f"{cfg.final_steps}: the time --timeout {cfg.timeout:g} s left (at most {cfg.final_most})")
    return res


def _grower(ctx: Any, cache: Any, label: str) -> Callable[[int], Any]:
    """More transfer sentences for a final run that the time lets go past `final_steps`: none seen more
    than FINAL_MAX_PASSES times over the steps it will now make (`SearchConfig.rows_for`), with a tenth
    to spare so that a run which speeds up a little does not grow again at once. On the demo's student
    (bf16, 2,400 steps) 15,360 sentences reach ρ 0.919 where the 7,680 seen ten times reach 0.908 and
    1,200 steps on them 0.904 (one-off benchmark, in git history): more steps pay with more text."""
    cfg, latest = ctx.config, cache

    def grow(total: int) -> Any:
        nonlocal latest
        have, free = latest.data.num_train, _free_rows(cfg, latest, total)
        if max(cfg.rows_for(total), free) <= have:
            return None
        rows = max(min(cfg.rows_for(math.ceil(1.1 * total)), cfg.rows_for(cfg.final_most)), free)
        ctx.progress.phase(f"{label}: {total} steps fit the time left: the transfer set grows to {rows} "
                           f"{cfg.final_unit}s (teacher targets of the new ones)")
        data = final_transfer_set(cfg, ctx.teacher, ctx.texts, rows)
        if data.num_train <= have:
            return None  # the corpus holds no more
        latest = latest.grown(data)
        ctx.progress.phase(f"{label}: distill {total} steps ({cfg.final_method}) on {data.num_train} {cfg.final_unit}s")
        return latest

    return grow


def _free_rows(cfg: Any, cache: Any, steps: int) -> int:
    """Training rows of the set on disk that hold the teacher's targets of the final run's loss (its last
    layer) and start with `cache`'s rows, up to one pass of `steps` batches: text that costs no teacher
    pass is worth more than a row seen again (3,000 steps on 32,768 sentences reached ρ 0.923 against
    0.895 on 4,096, docs/design/final-recipe.md). A longer run of the same corpus left them there."""
    from kdnas.distill import Needs

    stored = cache.stored_rows(Needs(hidden=frozenset({cache.teacher.dims.layers})))
    return min(stored, steps * cfg.final_batch_size) if stored > cache.data.num_train else 0


def _with_stored_rows(ctx: Any, cache: Any) -> Any:
    """`cache`, grown to the rows of its corpus whose targets are on disk already (`_free_rows`)."""
    rows = _free_rows(ctx.config, cache, ctx.config.final_steps)
    if rows <= cache.data.num_train:
        return cache
    ctx.progress.phase(f"final: the teacher's targets of {rows} {ctx.config.final_unit}s are on disk: the run takes them")
    return cache.grown(final_transfer_set(ctx.config, ctx.teacher, ctx.texts, rows))


def _fitted_to(cfg: Any) -> str:
    more = f"more, up to {cfg.final_most}, if time is left; " if cfg.final_most > cfg.final_steps else ""
    return f", {more}fewer if they would not end by --timeout"


def _narrowed_start(ctx: Any, cache: Any, spec: StudentSpec, start: dict[str, Any], label: str) -> Any:
    """`start`'s trained student, read back from over-budget/ and narrowed to `spec`."""
    ctx.progress.phase(f"{label}: continues {start['arch']} ({start['steps']} steps, over the budget as shipped), "
                       f"narrowed by activation importance")
    return narrowed_from(start["dir"], ctx.teacher.tokenizer, spec, *cache.data.split("train"))


def _continued_steps(cfg: Any, start: dict[str, Any], until: float | None) -> int:
    """The steps a continued run can make: `final_steps`, or those that fit before `until` at the
    pace of the refused run (whose FFN was wider, so a little slower: the estimate errs short)."""
    if until is None or not start.get("distill_s"):
        return cfg.final_steps
    return fit_steps(0, start["distill_s"] / max(start["steps"], 1), until - time.monotonic(), cfg.final_steps)


def _continued(start: dict[str, Any]) -> dict[str, Any]:
    return {"init": "continued", "from": start["arch"], "after_steps": start["steps"],
            "narrowed_by": "activation importance (distill.narrowed)"}


def _ship(ctx: Any, student: Any, dest: Path, teacher_dir: str, pipeline: dict[str, Any],
          variant: VariantChoice | None, summary: dict) -> dict:
    """Write `dest`: ONNX (+ INT8), the HF weights, the sentence-transformers modules, distill.json;
    returns the export report and the sentence-transformers pipeline written. `variant`: the fp32
    graph chosen before training (the plain one replaces the fused model.onnx; INT8 stays fused)."""
    from kdnas.export import export_model, write_sentence_transformers

    # export_model writes the folder (ONNX, INT8, tokenizer, config, export.json) atomically and
    # refuses to replace anything but an earlier export; the weights and the sentence-transformers
    # modules then complete it, with the graph's sentence_embedding pooled/normalized like them.
    options = {"tokenizer": ctx.teacher.tokenizer, "pooling": pipeline["pooling"], "normalize": pipeline["normalize"]}
    manifest = export_model(student, dest, int8=True, **options).to_dict()
    if variant is not None:
        manifest["fp32_variant"] = variant.to_dict()
        if variant.shipped == PLAIN:
            manifest |= ship_plain(student, dest, lambda model, folder: export_model(model, folder, optimize=False,
                                                                                     **options))
            manifest["sizes"][FP32_GRAPH] = (dest / FP32_GRAPH).stat().st_size
        atomic_write_text(dest / "export.json", json.dumps(manifest, indent=2) + "\n")
    student.save_pretrained(dest)
    make_shared(dest / "model.safetensors")  # the safetensors writer makes it private; best/ is for users
    sentence = write_sentence_transformers(dest, teacher_dir, hidden_size=student.config.hidden_size)
    atomic_write_text(dest / "distill.json", json.dumps(summary, indent=2, default=str) + "\n")
    return {"export": _jsonable(manifest), "sentence_transformers": _jsonable(sentence)}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
