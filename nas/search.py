"""`nas.search`: the whole job, from bad-input checks to the written outputs.

Order: every check that can fail on user input runs before the study is created or changed
(writable output, storage, teacher, space, settings of an existing study, budget against the
fastest shape); then the trials; then the reference shapes (optional) and the final training.
Outputs are rewritten after every trial, so they always reflect the storage.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import optuna

from kdnas.distill import TeacherCache, family_reason, load_corpus, load_teacher, targets_dir
from kdnas.core.errors import InputError, TrainingError
from kdnas.distill.activations import ModelDims
from kdnas.distill.loop import resolve_precision
from kdnas.distill.methods import build_method
from kdnas.distill.trainer import resolve_device
from kdnas.export import LastLayerGraph
from kdnas.core.files import ensure_writable_dir, undone_if_refused

from ._progress import Progress
from .budgets import budget_facts, study_budgets
from .ledger import RunSeconds, StageClock
from .config import DEFAULT_TRIALS, SearchConfig
from .final import claim_final, finalists, is_done, run_final
from .measure import LatencyJudge, ProfileJudge, judge_for, latency_record
from .neighbours import WIDER, ffn_neighbour
from .plans import teacher_plan_for, teacher_plans
from .schema import SCHEMA_VERSION, Candidate, LatencyRecord, StudyFacts, enqueue, record_fact, recorded
from .proxy import probe_sentences
from .pruning import TrainedMedianPruner
from .records import StudySummary, best_row, trial_pace, trial_rows
from .reference import evaluate_references
from .report import write_outputs
from .resume import counted_trials, recover, repeated_failure, slots_taken
from .space import SearchSpace, rule_params
from .storage import (check_settings, default_storage_url, find_study, holds_studies, open_storage,
                      storage_file, write_pointer)
from .time_limit import FIRST_TRIALS, TIMED_TRIAL_SHARE, TRIAL_SHARE, TimeLimit, final_run_s, pace_of
from .recipe import proxy_transfer_set
from .context import SearchContext
from .trial import Objective
from .verify import target_facts, verify_on_target

TPE_STARTUP_TRIALS = FIRST_TRIALS  # under --timeout these start whatever the final run needs
NSGA2_POPULATION = 50  # Optuna's default, for long searches
PRUNER_MIN_TRAINED = 3
# This many finished trials in a row failing with one error is a broken set-up (a full disk, a bad
# driver), not a bad shape: stop with that error instead of spending the budget on it.
SAME_ERROR_STOPS = 3
WAIT_S = 2.0  # how often a worker with nothing left to start looks at the others' last trials


def search(config: SearchConfig) -> StudySummary:
    """Run (or resume) a search and write its outputs into `config.run.out`; returns the summary."""
    optuna_logger = logging.getLogger("optuna")
    level = optuna_logger.level
    optuna_logger.setLevel(logging.WARNING)  # per-trial INFO lines would break the progress bar
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return _search(config)
    finally:
        optuna_logger.setLevel(level)


def _search(cfg: SearchConfig) -> StudySummary:
    limit = None if cfg.run.timeout is None else TimeLimit(time.monotonic(), float(cfg.run.timeout))
    clock = StageClock()
    resolved = resolve_device(cfg.device)  # `--device cuda` without CUDA: one line, before anything
    device, dtype = resolved.type, resolve_precision(cfg.precision, resolved)
    progress = Progress(None if cfg.trials_follow_time else cfg.trial_count, 0, cfg.run.progress)
    try:
        progress.phase("loading teacher")
        teacher = load_teacher(cfg.teacher)
        cfg.check_timeout(teacher.dims.layers, teacher.dims.hidden, teacher.dims.ffn)
        if cfg.init == "inherit" and (reason := family_reason(teacher)) is not None:
            raise InputError(f"--init inherit: {reason}; use --init svd or random (a BERT student)")
        space = cfg.resolve_space(teacher.dims)  # a space with no valid shape: refused before anything is written
        target = load_target(cfg, progress)  # a profile that cannot judge this search: refused here
        judge = judge_for(cfg, target)
        _check_methods(cfg, space, teacher.dims)
        if (targets := targets_dir(cfg.run.cache_dir)) is not None:  # before --out: a refusal writes nothing there
            ensure_writable_dir(targets, "--cache-dir", "; give another folder, or 'none' to keep targets in memory")
        # The corpus and its transfer set are checked before --out and the study are made: a mistyped
        # --corpus or --seq is one line with nothing written, not a study.db left behind.
        progress.phase("preparing transfer set")
        texts = load_corpus(cfg.corpus)
        if cfg.proxy.kind == "fidelity" or cfg.latency.plans:
            probe_sentences(cfg, texts)  # a corpus too small for the probe (shapes' or plans' scores)
        data = proxy_transfer_set(cfg, teacher, texts)
        cache = TeacherCache(teacher, data, directory=targets, on_rows=progress.counter("teacher targets", "rows"),
                             last_layer=LastLayerGraph(teacher.model))
        clock.mark("setup")
        # Refusals found once --out and its study.db are made (a --storage that cannot be opened, a
        # budget under the fastest shape) remove the folder and the storage file they made: nothing left
        # behind — unless a study is in that file by then (another worker's: it stays).
        url = cfg.run.storage or default_storage_url(cfg.run.out)
        made = storage_file(url)
        with undone_if_refused(cfg.run.out, files=[made] if made else [], keep=lambda _: holds_studies(url)):
            out = ensure_writable_dir(Path(cfg.run.out))
            storage = open_storage(url)
            settings = cfg.study_settings(space, teacher.fingerprint, device, dtype,
                                          latency_machine(cfg.latency.runtime, target))
            family = teacher.student_sizes()["family"]
            if family != "bert":  # studies made before students kept their teacher's family had BERT students only
                settings["student_family"] = family
            study, facts = _open_study(cfg, storage, url, settings, lambda: _new_facts(cfg, space, teacher, progress, judge))
        clock.mark("latency")
        cfg = _trials_reached(study, cfg, progress)
        write_pointer(out, url, cfg.run.study_name)
        ctx = SearchContext(config=cfg, space=space, sizes=teacher.student_sizes(), teacher=teacher, texts=texts, data=data,
                            cache=cache, teacher_latency_ms=facts.teacher_latency.median_ms,
                            budget_ms=study_budgets(facts)[0].limit_ms, progress=progress, limit=limit,
                            smallest_ms=study_budgets(facts)[-1].limit_ms,
                            tolerance=study_budgets(facts)[0].tolerance, judge=judge)
        return _stages(study, ctx, out, target, clock)
    finally:
        progress.close()


def _stages(study: optuna.Study, ctx: SearchContext, out: Path, target: Any, clock: StageClock) -> StudySummary:
    """The study's work once it is open: the teacher's plans, the trials, the final stage, the shipped graphs'
    check on the target (with a target profile), each stage's wall seconds added to the study's (`run_seconds`)."""
    cfg, progress = ctx.config, ctx.progress
    if target is not None and StudyFacts.from_study(study).target is None:
        record_fact(study, "target", target_facts(target, cfg.run.target))
    if cfg.latency.plans and (facts := StudyFacts.from_study(study)).teacher_plans is None:  # the teacher is a candidate too
        record_fact(study, "teacher_plans", teacher_plans(ctx, facts, out, ctx.teacher_pipeline))
    clock.mark("plans")
    _run_trials(study, Objective(ctx), cfg, out, progress, ctx.limit)
    clock.mark("trials")
    if cfg.run.reference and StudyFacts.from_study(study).reference is None:
        record_fact(study, "reference", evaluate_references(ctx))
    if isinstance(ctx.judge, ProfileJudge):
        # The final stage judges by the profile alone, and what ships is read once after it (`verify_on_target`):
        # read there too, a finalist's gate and its plan's bisection near the budget took 144 s of a demo's 480 s
        # on the profile's own host (each plan read beside the teacher up to three times), past its --timeout.
        ctx.judge = replace(ctx.judge, on_target=False)
    _finish(study, ctx, out, progress)
    clock.mark("final")
    if target is not None:
        progress.phase("checking the shipped graphs on the target")
        record_fact(study, "verified", list(verify_on_target(StudyFacts.from_study(study), cfg, target, cfg.run.target)))
        clock.mark("verification")
    before = StudyFacts.from_study(study).run_seconds or RunSeconds()
    record_fact(study, "run_seconds", asdict(before.plus(clock.seconds())))
    progress.phase("done")
    return write_outputs(study, out)


def _trials_reached(study: optuna.Study, cfg: SearchConfig, progress: Progress) -> SearchConfig:
    """`cfg` with the trial count that trials which followed the time reached in an earlier run of this study
    (`StudyFacts.trials_reached`): a rerun resumes the study as it stands instead of running trials again on its
    own clock."""
    reached = StudyFacts.from_study(study).trials_reached
    if not cfg.trials_follow_time or reached is None:
        return cfg
    progress.set_total(reached)
    return cfg.with_flags(trials=reached)


def _check_methods(cfg: SearchConfig, space, teacher_dims) -> None:
    """Every width the space proposes must train with --method (its trials) and --final-method (the
    winner): a method that needs the teacher's head count (minilm, xtremedistil) is refused now, not as
    failed trials or a failed final run."""
    layers, ffn = min(space.layers), min(space.ffn)
    for flag, method in (("--proxy-method", cfg.proxy.method), ("--final-method", cfg.final.method)):
        for heads, hidden in space.widths():
            try:
                build_method(method, teacher_dims, ModelDims(layers, hidden, heads, ffn))
            except InputError as err:
                raise InputError(f"{flag} {method}: the space proposes {heads} heads of {hidden}; {err}") from None


def _new_facts(cfg: SearchConfig, space, teacher, progress: Progress, judge: LatencyJudge) -> StudyFacts:
    """A new study's facts: the teacher's latency, the fastest shape and the budget (measured); with several
    budgets, `budget_ms` is the largest (the trials' gate) and `budgets` holds them all, largest first."""
    teacher_latency, fastest, budgets_ms = _latency_facts(cfg, space, teacher, progress, judge)
    rules = [rule_params(space, teacher.dims.layers, ms / teacher_latency.median_ms) for ms in budgets_ms]
    several = budget_facts(cfg, budgets_ms)
    # the rule applied to the all-INT8 graph, where graphs may be INT8: the depth that fits as INT8
    int8_rules = [_below_teacher(space, teacher.dims.layers,
                                 rule_params(space, teacher.dims.layers, ms / teacher_latency.int8_ms))
                  for ms in budgets_ms] if teacher_latency.int8_ms is not None else None
    return StudyFacts(teacher_latency=teacher_latency, budget_ms=budgets_ms[0], fastest=fastest, space_size=space.size,
                      rule=rules[0], budget_tolerance=cfg.latency.budget_tolerance, budgets=several or None,
                      rules=rules if several else None, int8_rules=int8_rules)


def _below_teacher(space: SearchSpace, teacher_layers: int, rule: dict[str, Any] | None) -> dict[str, Any] | None:
    """A rule shape with fewer layers than the teacher: at its full depth the teacher itself is the candidate
    (its own plans, untrained: nas.plans), not a student inherited whole."""
    if rule is None or rule["layers"] < teacher_layers:
        return rule
    shallower = [n for n in space.layers if n < teacher_layers]
    return {**rule, "layers": max(shallower)} if shallower else None


def _open_study(cfg: SearchConfig, storage, url: str, settings: dict[str, Any],
                new_facts) -> tuple[optuna.Study, StudyFacts]:
    """The study to work on and its facts (budget, teacher latency): the existing one (checked against
    `settings`), or a new one with `new_facts()` — also the existing one when another worker created it
    between our check and our create."""
    existing = _found_study(storage, cfg.run.study_name)
    if existing is not None:
        check_settings(existing, settings, url)
    else:
        facts = replace(new_facts(), version=SCHEMA_VERSION, settings=settings)
        study = _create_study(cfg, storage, facts)
        if study is not None:
            return study, facts
        existing = _settled_study(storage, cfg.run.study_name)  # another worker created it a moment ago
        check_settings(existing, settings, url)
    study = optuna.load_study(study_name=cfg.run.study_name, storage=storage,
                              sampler=_sampler(cfg, len(existing.trials)), pruner=_pruner(cfg))
    return study, StudyFacts.from_study(existing)


def _run_trials(study: optuna.Study, objective: Objective, cfg: SearchConfig, out: Path, progress: Progress,
                limit: TimeLimit | None = None) -> None:
    """Trials until the study holds exactly `cfg.run.trials` counted ones (other workers' included), or
    until `limit` says no more may start; the pages are rewritten after each. While the trials still
    to do are all running on other workers, this one waits for them (one of them may die and need its
    retry) instead of starting more."""
    _show(study, out, progress)
    while True:
        recover(study, cfg.run.stale_after_s)
        done = counted_trials(study)
        if done >= cfg.trial_count:
            return
        if limit is not None and not _trial_fits(study, objective.ctx, limit, done):
            if cfg.trials_follow_time:
                record_fact(study, "trials_reached", done)  # a rerun resumes this study as it is
            return
        if slots_taken(study) >= cfg.trial_count:
            progress.phase("waiting for other workers' last trials")
            time.sleep(WAIT_S)
            continue
        _one_trial(study, objective, progress)  # the next loop's recover() queues its retry if it failed
        error = repeated_failure(study, SAME_ERROR_STOPS)
        if error is not None:
            write_outputs(study, out)
            raise TrainingError(f"the last {SAME_ERROR_STOPS} trials all failed with the same error, so the search "
                                f"stops: {error}")
        progress.phase("writing pages")
        _show(study, out, progress)


def _trial_fits(study: optuna.Study, ctx: SearchContext, limit: TimeLimit, done: int) -> bool:
    """Whether `limit` lets another trial start; when not, the summary says why."""
    cfg, space, progress = ctx.config, ctx.space, ctx.progress
    if cfg.trials_follow_time:
        rest = f"{done} done; --trials N asks for more"
        if done >= DEFAULT_TRIALS and not limit.timed_trials_may_start(ctx.cache.pass_seconds if ctx.cache else 0.0):
            progress.note(f"--timeout {limit.seconds:g} s: {TIMED_TRIAL_SHARE:.0%} of it (less the teacher's one-time "
                          f"targets) is spent on trials, so no further trial starts ({rest})")
            return False
    else:
        rest = f"{done} of {cfg.run.trials} done; a rerun with a longer --timeout, or none, adds the rest"
    if not limit.trials_may_start(done):
        progress.note(f"--timeout {limit.seconds:g} s: {TRIAL_SHARE:.0%} of it is spent, so no further trial starts ({rest})")
        return False
    forecast = _final_forecast(study, cfg, space) if done >= FIRST_TRIALS else None
    if forecast is not None and not limit.keeps_final_run(*forecast):
        progress.note(f"--timeout {limit.seconds:g} s: no further trial starts, so that the final run keeps its "
                      f"{cfg.final.steps} steps (about {forecast[0]:.0f} s at the trials' pace; {rest})")
        return False
    return True


def _final_forecast(study: optuna.Study, cfg: SearchConfig, space: SearchSpace) -> tuple[float, float] | None:
    """(the final stage's seconds at --final-steps for each of --final-top-k finalists, a trained
    trial's median seconds), from the best trial's pace, carried to its wider FFN neighbour where the
    space has one (the final stage tries it first, `nas.neighbours`); None with the hs proxy, whose
    recipe is not the final run's, or before any pace."""
    if cfg.proxy.kind != "fidelity" or cfg.final.steps <= 0:
        return None
    best = best_row(trial_rows(study))
    step_s = None if best is None else trial_pace(study, best.number)
    # A trial's own time, without the one-time teacher work it happened to do first (the first trained
    # trial of an MPNet search spent 8 of its 10 minutes on the teacher's targets, and its 592 s as the
    # "typical trial" stopped the trials after six, so a 0.30-fidelity shape shipped).
    records = [recorded(t) for t in study.get_trials(deepcopy=False)]
    trained = [r.seconds.own for r in records
               if r.step_s is not None and r.duplicate_of is None and r.seconds is not None and r.seconds.total is not None]
    if step_s is None or not trained:
        return None
    wider = ffn_neighbour(space, Candidate.from_attrs(best.as_dict()), WIDER, taken=set())
    if wider is not None:
        step_s = pace_of(step_s, best.arch, wider.arch, cfg.proxy.seq_len)
    trial_s = statistics.median(trained)
    return cfg.final.top_k * len(cfg.budgets) * final_run_s(cfg.final.steps, step_s, trial_s), trial_s


def _one_trial(study: optuna.Study, objective: Objective, progress: Progress) -> None:
    try:
        study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)
    except (ValueError, AssertionError) as err:
        # Another worker judged this one dead (a long pause) and failed its trial: Optuna then refuses our
        # result — a plain ValueError, which Optuna 5's own bookkeeping turns into an AssertionError ("Should
        # not reach") — so it is told apart by the trial's state in the study, not by type or words. The
        # trial is retried by the rules of nas.resume; go on.
        if not failed_meanwhile(study, objective.last_number):
            raise
        progress.note(f"a trial of this worker was failed by another worker meanwhile ({err}); going on")


def failed_meanwhile(study: optuna.Study, number: int | None) -> bool:
    """Whether trial `number` of `study` (this worker's last) is already FAIL in the storage: failed by another
    worker while this one still ran it."""
    if number is None:
        return False
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    return trial is not None and trial.state == optuna.trial.TrialState.FAIL


def _show(study: optuna.Study, out: Path, progress: Progress) -> None:
    progress.set_done(counted_trials(study))
    progress.best(None if (best := best_row(trial_rows(study))) is None else best.reward)
    write_outputs(study, out)


def _finish(study: optuna.Study, ctx: SearchContext, out: Path, progress: Progress) -> None:
    """The final stage, once across workers: distill, ship and profile the winner of each budget, largest
    budget first (or say why not)."""
    cfg = ctx.config
    stages = [(ctx.for_budget(budget), finalists(study, cfg.reward.objective, budget))
              for budget in study_budgets(StudyFacts.from_study(study))]
    empty = [stage.budget_named for stage, chosen in stages if not chosen]
    if empty:
        write_outputs(study, out)
        raise InputError(
            f"no trial was trained within {' or '.join(empty)} after {counted_trials(study)} trials; "
            f"see {out / 'trials.csv'} for the reasons, then raise --budget-ms or --trials"
        )
    todo = [(stage, chosen) for stage, chosen in stages if not is_done(study, out, chosen, stage)]
    if cfg.final.steps <= 0 or not todo:
        return
    held = claim_final(study, cfg.run.stale_after_s)
    if held is not None:
        progress.note(held)
        return
    for stage, chosen, later, trailing in final_order(todo, StudyFacts.from_study(study), cfg.final.top_k):
        run_final(study, stage, out, chosen, later=later, trailing=trailing)


def final_order(todo: list, facts: StudyFacts, top_k: int) -> list:
    """The budgets' final stages in the order they train, each with the finalists after it that share its
    time (`run_final`'s `later`) and those after it that do not but whose work after training it leaves time
    for (`trailing`): budgets where the teacher's own plan fits (nas.plans) go last and take the training time
    the others leave — their student must beat the teacher's graph, which needs no training (on MiniLM at 0.6x
    and 0.5x a plan of the teacher kept ρ 0.99, and four budgets sharing 15 minutes evenly left the 0.25x
    student 20 steps) — the others largest budget first."""
    teacher = [teacher_plan_for(facts, stage.budget_label) is not None for stage, _ in todo]
    ordered = [item for item, t in zip(todo, teacher) if not t] + [item for item, t in zip(todo, teacher) if t]
    rank = sorted(teacher)
    return [(stage, chosen, top_k * sum(1 for t in rank[i + 1:] if t == rank[i]),
             top_k * sum(1 for t in rank[i + 1:] if t != rank[i]))
            for i, (stage, chosen) in enumerate(ordered)]


def _create_study(cfg: SearchConfig, storage, facts: StudyFacts) -> optuna.Study | None:
    """Create the study with its facts, or None when another worker created it first."""
    try:
        study = optuna.create_study(storage=storage, study_name=cfg.run.study_name, directions=_directions(cfg),
                                    sampler=_sampler(cfg, 0), pruner=_pruner(cfg))
    except optuna.exceptions.DuplicatedStudyError:
        return None
    # the first trials: the shape the one-line rule gives for each budget (`_new_facts`), each with the
    # smallest budget it is the rule of (where it reads over that, a shallower one follows: `Objective`)
    budgets, rules = study_budgets(facts), facts.rules or [facts.rule]
    for rule in _distinct([rule for rule in rules if rule]):
        budget = min(b.ms for b, r in zip(budgets, rules) if r == rule)
        enqueue(study, rule, {"origin": "rule", "rule_budget_ms": budget})
    # and where graphs may be INT8 (--runtime onnxruntime-auto), the rule's depth as an all-INT8 graph
    for rule in _distinct([r for r in facts.int8_rules or [] if r and r not in rules]):
        enqueue(study, rule, {"origin": "rule, INT8"})
    for name, value in facts.set_fields().items():  # settings last (StudyFacts.set_fields)
        record_fact(study, name, value)
    return study


def _distinct(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for i, rule in enumerate(rules) if rule not in rules[:i]]


def _found_study(storage, name: str) -> optuna.Study | None:
    """The existing study called `name`, or None. One with neither settings nor trials but the queued first
    ones (`_create_study` queues the rule's shapes, then writes the settings) was created a moment ago by a
    worker started beside this one (three workers on one journal file: one of them saw the study before its
    creator had written the settings, and refused it as not kdnas's): it is read once they are."""
    existing = find_study(storage, name)
    if existing is None or StudyFacts.from_study(existing).settings is not None or any(
            t.state != optuna.trial.TrialState.WAITING for t in existing.trials):
        return existing
    return _settled_study(storage, name)


def _settled_study(storage, name: str, wait_s: float = 60.0) -> optuna.Study:
    """The study another worker just created, once its creator has written the settings (milliseconds
    after creating it); after `wait_s` it is returned as it is and check_settings says what lacks."""
    deadline = time.monotonic() + wait_s
    while True:
        study = find_study(storage, name)
        if StudyFacts.from_study(study).settings is not None or time.monotonic() > deadline:
            return study
        time.sleep(0.5)


def _latency_facts(cfg: SearchConfig, space, teacher, progress: Progress, judge: LatencyJudge
                   ) -> tuple[LatencyRecord, dict, tuple[float, ...]]:
    """Teacher latency, the fastest shape's latency, and the budgets in ms (largest first), the smallest
    checked against the fastest shape: read by `judge` (predicted, with a target profile)."""
    from kdnas.distill import StudentSpec

    progress.phase("measuring teacher latency")
    teacher_latency = latency_record(judge.alone(cfg.teacher))
    if teacher_latency.noisy:
        progress.note(f"the teacher's latency ({teacher_latency.median_ms:.2f} ms) was NOISY: this machine is busy, "
                      "so the budget may be off; a quiet machine gives a budget you can trust")
    if cfg.latency.plans:  # its all-INT8 graph: how much deeper a shape fits as INT8 (the rule's INT8 shapes)
        progress.phase("measuring the teacher's all-INT8 graph")
        teacher_latency = replace(teacher_latency, int8_ms=float(judge.int8_twin().alone(cfg.teacher).median_ms))
    layers, heads, hidden, ffn = space.fastest()
    spec = StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **teacher.student_sizes())
    progress.phase(f"measuring fastest shape {spec.arch}")
    fastest = {"arch": spec.arch, **latency_record(judge.alone(spec)).to_attrs()}
    scale = 1.0 if cfg.budget_ms is not None else teacher_latency.median_ms
    budgets_ms = tuple(float(value * scale) for value in cfg.budgets)
    if budgets_ms[-1] < fastest["median_ms"] and cfg.latency.plans:  # its fastest plan: every group INT8
        fastest["int8_ms"] = float(judge.int8_twin().alone(spec).median_ms)
    if budgets_ms[-1] < min(fastest["median_ms"], fastest.get("int8_ms", float("inf"))):
        given = "" if cfg.budget_ms is not None else f" ({cfg.budgets[-1]:g} x the teacher's {scale:.2f} ms)"
        int8 = f", all-INT8 {fastest['int8_ms']:.2f} ms" if "int8_ms" in fastest else ""
        raise InputError(
            f"budget {budgets_ms[-1]:.2f} ms{given} is below every precision plan of the fastest student in the space "
            f"({spec.arch}: {fastest['median_ms']:.2f} ms median{int8} at batch {cfg.latency.batch}, seq "
            f"{cfg.latency.seq}, {cfg.latency.threads} threads); raise --budget-ms or allow smaller shapes"
        )
    return teacher_latency, fastest, budgets_ms


def latency_machine(runtime: str, target: Any = None) -> dict[str, str]:
    """What a study's latencies depend on besides its settings: the CPU model and the runtime — of the target
    profile's host where the search judges by one (a worker on any host may then join the study)."""
    from kdnas.latency import cpu_model, library_versions

    if target is not None:
        return {"cpu": target.host.cpu, "runtime": f"{runtime} {target.host.versions.get('onnxruntime')}",
                "target": f"profile of {target.teacher}, made {time.strftime('%Y-%m-%d %H:%M', time.gmtime(target.made_at))}"}
    versions = library_versions(runtime)
    return {"cpu": cpu_model(), "runtime": f"{runtime} {versions.get('onnxruntime', versions['torch'])}"}


def load_target(cfg: SearchConfig, progress: Progress) -> Any:
    """The search's target profile (`--target FILE`, `latency.TargetProfile`) checked against its settings and
    teacher, or None; a profile read with other library versions than this host's is said in one line."""
    if cfg.run.target is None:
        return None
    from kdnas.latency import Host, Settings, load_profile

    profile = load_profile(cfg.run.target)
    lat = cfg.latency
    reason = profile.mismatch(Settings(lat.batch, lat.seq, lat.threads, lat.reading_runtime()), cfg.teacher)
    if reason is not None:
        raise InputError(f"--target {cfg.run.target}: cannot judge this search: {reason}; make one with "
                         f"`kdnas target --teacher {cfg.teacher} --threads {lat.threads} --batch {lat.batch} "
                         f"--seq {lat.seq}` on the deployment CPU")
    if (note := profile.version_note(Host.here())) is not None:
        progress.note(f"--target: {note}; its predictions are of graphs those versions export")
    return profile


def _directions(cfg: SearchConfig) -> list[str]:
    return ["maximize"] if cfg.reward.objective == "reward" else ["minimize", "minimize"]


def _sampler(cfg: SearchConfig, offset: int) -> optuna.samplers.BaseSampler:
    # Reseeded by the number of existing trials on resume, so a resumed run does not replay the
    # first run's random proposals.
    seed = cfg.seed + offset
    if cfg.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS, multivariate=True,
                                          constant_liar=True)
    if cfg.sampler == "nsga2":
        # A population larger than the trial count would leave NSGA-II a random search; aim at
        # three generations or more, never below 4 parents.
        population = max(4, min(NSGA2_POPULATION, cfg.trial_count // 3))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    return optuna.samplers.RandomSampler(seed=seed)


def _pruner(cfg: SearchConfig) -> optuna.pruners.BasePruner:
    if not cfg.pruning:
        return optuna.pruners.NopPruner()
    # Counted over trained trials only; the first evaluation is never pruned: shapes differ most in
    # how fast they start.
    return TrainedMedianPruner(min_trained=PRUNER_MIN_TRAINED, warmup_steps=cfg.proxy.eval_every + 1)
