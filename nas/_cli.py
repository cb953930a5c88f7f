"""`kdnas search` and `kdnas report`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import SearchConfig
    from .records import StudySummary
    from .schema import FinalRecord, FinalTeacher, Refusal, TeacherInt8

SEARCH_EPILOG = """\
how a trial runs:
  1. the sampler proposes LAYERSxHEADSxHIDDENxFFN from the space (default: derived from the teacher,
     every combination valid; override per dimension, e.g. --layers 2-6 --hidden 128-384:64 --heads 4,8);
  2. latency first: the shape is built with random weights, exported and timed on CPU (cached per
     shape); over --budget-ms it is infeasible and never trained;
  3. brief distillation, by --proxy:
     fidelity (default): the final recipe (--final-method on the final transfer set) for --proxy-steps,
       scored by embedding fidelity rho on --proxy-sentences held-out sentences: loss = 1 - rho;
     hs (the paper's): --proxy-method hs on a fixed --proxy-train set, held-out normalized L_HS reported
       every --eval-every steps to a median pruner: loss = L_HS;
  4. score: KD-NAS reward (1 - loss) * (lat(S) / (0.6 lat(T)))^-0.06, teacher latency measured once.
  Then the best feasible trial (--final-top-k of them) is distilled for --final-steps, exported
  (ONNX fused or plain, the faster here, INT8, parity-checked) and profiled into OUT/best/.

objectives:
  reward   maximize the KD-NAS reward (default; single objective, so the pruner can stop bad trials)
  pareto   minimize the proxy's loss and latency together (Pareto front; NO pruning: Optuna's
           pruners are single-objective only); the winner is the front member with the best reward

outputs in OUT: best/ (HF folder, model.onnx, model.int8.onnx, export.json), pareto.html, report.html,
trials.csv, summary.json, study.db (default storage), search.json (where the study is).

resume: run the same command again; finished trials are kept, trials left running by a killed
process are marked failed and retried. Several workers: share a --storage (postgresql://... or
journal:PATH; SQLite is for one worker) and the same --study-name.

examples:
  kdnas search                                             (bundled defaults, runs/search)
  kdnas search --teacher minilm-l6 --corpus news --budget-ms 8 --trials 20 --out runs/demo
  kdnas search --objective pareto --sampler nsga2 --reference --out runs/pareto
  kdnas report runs/demo                                   (rebuild the pages, also during a search)
"""


def budget_list(text: str) -> float | tuple[float, ...]:
    """`--budget-ms` / `--budget-ratio`: one number, or several separated by commas (each checked by SearchConfig)."""
    values = []
    for part in (part.strip() for part in text.split(",")):
        try:
            values.append(float(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {part!r} is not a number; give one budget or several "
                                             "separated by commas, e.g. 0.5,0.25") from None
    return values[0] if len(values) == 1 else tuple(values)


def register(subparsers: argparse._SubParsersAction) -> None:
    from kdnas.core.assets import DEFAULT_CORPUS, DEFAULT_TEACHER
    from kdnas.core.families import families_help
    from kdnas.distill.loop import PRECISIONS

    from .config import OBJECTIVES, SAMPLERS, SearchConfig

    d = SimpleNamespace(**SearchConfig().flags())  # the defaults by the flags' names: one source, the dataclasses
    p = subparsers.add_parser(
        "search", help="search student architectures under a CPU latency budget (KD-NAS)",
        description=f"Find the best student shape under a hard CPU latency budget, distill it and ship it; {families_help()}.",
        epilog=SEARCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--teacher", default=DEFAULT_TEACHER, help="bundled name, local model folder or hub name (default: %(default)s)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS, help="bundled name or a local text file/folder (default: %(default)s)")
    p.add_argument("--out", default=d.out, help="output folder (default: %(default)s)")
    _length_flags(p, d)
    p.add_argument("--budget-ms", type=budget_list, default=None, metavar="MS[,MS...]",
                   help="hard CPU latency budget in ms (default: --budget-ratio x the teacher's measured latency); "
                        "several, comma-separated (8,4,2), are searched in one study and a student is shipped for "
                        "each, in OUT/best-8ms/ ...")
    p.add_argument("--budget-ratio", type=budget_list, default=d.budget_ratio, metavar="RATIO[,RATIO...]",
                   help="budget as a fraction of the teacher's latency when --budget-ms is not given (default: "
                        "%(default)s); several, comma-separated (0.5,0.25), ship a student each, in OUT/best-0.5x/ ...")
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective,
                   help="reward (pruned) or pareto (loss and latency, no pruning) (default: %(default)s)")
    p.add_argument("--sampler", choices=SAMPLERS, default=d.sampler, help="default: %(default)s")
    p.add_argument("--seed", type=int, default=d.seed, help="default: %(default)s")
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL: sqlite:///file.db, postgresql://..., or journal:PATH (default: sqlite:///OUT/study.db)")
    p.add_argument("--study-name", default=d.study_name, help="default: %(default)s")
    _space_flags(p)
    _proxy_flags(p, d)
    _latency_and_reward_flags(p, d)
    _final_flags(p, d)
    p.add_argument("--workers", type=int, default=1,
                   help="start N workers on this machine that share one study (needs --storage postgresql... or "
                        "journal:PATH; one GPU each when there are N); the final stage runs once (default: %(default)s)")
    p.add_argument("--device", default=d.device, help="training device: auto, cpu, cuda (default: %(default)s)")
    p.add_argument("--cache-dir", default=d.cache_dir,
                   help="where teacher targets are stored and reused by later runs (default: $KDNAS_CACHE/targets); "
                        "'none' keeps them in memory only")
    p.add_argument("--precision", default=d.precision, choices=PRECISIONS,
                   help="training precision; auto: bf16 autocast where the device multiplies bf16 natively "
                        "(CUDA, CPUs with AVX512-BF16 or AMX), else fp32 (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_search)
    _report_and_target(subparsers)


def _report_and_target(subparsers: argparse._SubParsersAction) -> None:
    """`kdnas report` (a search's pages again) and `kdnas target` (the deployment CPU's profile)."""
    r = subparsers.add_parser(
        "report", help="rebuild pareto.html, report.html, trials.csv and summary.json from a search's storage",
        description="Rebuild a search's pages and tables from its Optuna storage (safe while the search runs).",
    )
    r.add_argument("out", help="the search's output folder")
    r.add_argument("--storage", default=None, help="storage URL (default: the one recorded in OUT/search.json)")
    r.add_argument("--study-name", default=None, help="study name (default: the one recorded in OUT/search.json)")
    r.set_defaults(func=_report)

    from . import _target_cli

    _target_cli.register(subparsers)


def _space_flags(p: argparse.ArgumentParser) -> None:
    space = p.add_argument_group("search space (default: derived from the teacher; values: 6 | 4,6,12 | 1-6 | 96-384:96)")
    for name in ("layers", "heads", "hidden", "ffn"):
        space.add_argument(f"--{name}", default=None, help=f"allowed {name}")
    space.add_argument("--space", dest="space_file", default=None, help="TOML or YAML file with keys layers/heads/hidden/ffn (CLI flags win)")


def _proxy_flags(p: argparse.ArgumentParser, d) -> None:
    from kdnas.distill.inherit import LAYER_RULES
    from kdnas.distill.trainer import INITS

    from .config import PROXIES

    proxy = p.add_argument_group("proxy distillation (identical for every trial)")
    proxy.add_argument("--proxy", default=d.proxy, choices=list(PROXIES),
                       help="fidelity: the final recipe, shortened, scored by embedding fidelity on held-out "
                            "sentences; hs: the paper's KD-NAS proxy, scored by held-out L_HS (default: %(default)s)")
    proxy.add_argument("--proxy-sentences", type=int, default=d.proxy_sentences,
                       help="held-out sentences for the fidelity proxy's rho (default: %(default)s)")
    proxy.add_argument("--proxy-method", default=d.proxy_method,
                       help="hs proxy: distillation method (default: %(default)s, as in the paper's KD-NAS)")
    proxy.add_argument("--layer-map", default=d.layer_map, help="hs proxy (default: %(default)s)")
    proxy.add_argument("--init", default=d.init, choices=list(INITS),
                       help="how students start, proxy and final: inherit (the teacher's own layers, heads, neurons, "
                            "channels; svd where a shape cannot), svd of the teacher's word embeddings, or random "
                            "(default: %(default)s)")
    proxy.add_argument("--layer-rule", default=d.layer_rule, choices=list(LAYER_RULES),
                       help="which teacher layers an inherited student keeps (default: %(default)s)")
    proxy.add_argument("--proxy-steps", type=int, default=None,
                       help="default: 30 with --proxy fidelity, 60 with --proxy hs")
    proxy.add_argument("--proxy-train", type=int, default=d.proxy_train,
                       help="hs proxy: training sequences (default: %(default)s)")
    proxy.add_argument("--proxy-eval", type=int, default=d.proxy_eval, help="held-out sequences for L_HS (default: %(default)s)")
    proxy.add_argument("--seq-len", type=int, default=d.seq_len, help="training tokens per sequence (default: %(default)s)")
    proxy.add_argument("--proxy-batch-size", type=int, default=d.proxy_batch_size, help="hs proxy (default: %(default)s)")
    proxy.add_argument("--proxy-lr", type=float, default=d.proxy_lr,
                       help="hs proxy: peak learning rate (default: %(default)s)")
    proxy.add_argument("--eval-every", type=int, default=d.eval_every,
                       help="hs proxy: pruner report interval in steps (default: %(default)s)")
    proxy.add_argument("--no-prune", action="store_true",
                       help="never prune (the hs proxy with the reward objective prunes; the fidelity proxy never does)")


def _latency_and_reward_flags(p: argparse.ArgumentParser, d) -> None:
    lat = p.add_argument_group("latency (identical for teacher and students)")
    lat.add_argument("--latency-batch", type=int, default=d.latency_batch, help="default: %(default)s")
    lat.add_argument("--latency-seq", type=int, default=d.latency_seq, help="default: %(default)s")
    lat.add_argument("--threads", type=int, default=d.threads, help="default: %(default)s")
    lat.add_argument("--runtime", default=d.runtime,
                     help="onnxruntime-auto (default): the graph shipped is the best within the budget of a shape's fp32 "
                          "graph, its all-INT8 graph and the precision plans between them, the teacher's own included; "
                          "the budget is a share of the teacher's fp32 graph. onnxruntime: fp32 graphs only. "
                          "onnxruntime-int8: all-INT8 graphs only (the budget, the reward and the teacher read on them). "
                          "torch: PyTorch (default: %(default)s)")
    lat.add_argument("--budget-tolerance", type=float, default=d.budget_tolerance, metavar="SHARE",
                     help="a graph fits its budget when it reads at most this share over it, read again beside the "
                          "teacher while the budget lies within the reading's spread (default: %(default)s)")
    lat.add_argument("--target", default=None, metavar="FILE",
                     help="judge every trial, plan and finalist by this deployment target's profile (`kdnas target "
                          "--out FILE`, made on the CPU the model will run on) instead of reading latency here; on that "
                          "CPU the shipped graph is then read beside the teacher, elsewhere the summary gives the command "
                          "that checks it there (default: read on this host)")
    lat.add_argument("--no-latency-model", action="store_true",
                     help="measure every trial's latency instead of predicting it where the latency model "
                          "fitted on the study's readings is sure of the budget's verdict")
    rew = p.add_argument_group("reward")
    rew.add_argument("--target-ratio", type=float, default=d.target_ratio, help="default: %(default)s")
    rew.add_argument("--exponent", type=float, default=d.exponent, help="default: %(default)s")


def _final_flags(p: argparse.ArgumentParser, d) -> None:
    from kdnas.distill.data import UNITS
    from kdnas.distill.methods import EMBED_DEFAULT_TERMS
    from .config import AUGMENT_SHARE, FINAL_EXTEND, FINAL_MAX_PASSES

    fin = p.add_argument_group("after the search")
    fin.add_argument("--final-steps", type=int, default=d.final_steps,
                     help="distillation steps for the winner; 0 skips the final phase (default: %(default)s)")
    fin.add_argument("--final-max-steps", type=int, default=None, metavar="STEPS",
                     help="with --timeout: the most steps the final run may train when the time allows (default: "
                          f"{FINAL_EXTEND} x --final-steps; --final-steps' value: never more)")
    fin.add_argument("--final-train", type=int, default=d.final_train,
                     help="training sequences for the final distillation, from the same corpus (default: "
                          "%(default)s, or more when --final-steps would show a sentence more than "
                          f"{FINAL_MAX_PASSES} times); the held-out rows are the proxy's, so final and proxy L_HS compare")
    fin.add_argument("--final-method", default=d.final_method,
                     help="distillation method of the final run (default: %(default)s: token states + pooled "
                          "embedding + in-batch similarities)")
    fin.add_argument("--final-lr", type=float, default=d.final_lr, help="peak learning rate of the final run (default: %(default)s)")
    fin.add_argument("--final-augment", type=float, default=d.final_augment, metavar="SHARE",
                     help="share of the final run's batches whose tokens are perturbed, the teacher labelling them "
                          f"(default: {AUGMENT_SHARE} where the corpus is too small for --final-steps to see each "
                          f"row at most {FINAL_MAX_PASSES} times, else 0)")
    fin.add_argument("--final-embed-terms", default=d.final_embed_terms, metavar="TERMS",
                     help="terms of the final run's embed method, as kdnas distill --embed-terms takes them; the "
                          f"trials keep theirs (default: the method's, {EMBED_DEFAULT_TERMS})")
    fin.add_argument("--final-batch-size", type=int, default=d.final_batch_size, help="default: %(default)s")
    fin.add_argument("--final-save-every", type=int, default=d.final_save_every, metavar="STEPS",
                     help="without --timeout, the final run saves its state every STEPS steps; run the same command "
                          "again after a stop to go on from there; 0: never (default: %(default)s)")
    fin.add_argument("--final-unit", default=d.final_unit, choices=list(UNITS),
                     help="training rows of the final run: one sentence each, or windows of running text "
                          "(default: %(default)s)")
    fin.add_argument("--quality-sentences", type=int, default=d.quality_sentences,
                     help="held-out corpus sentences for the shipped student's embedding fidelity and its untrained "
                          "baselines, and as many rows of its own transfer set beside them; 0 skips (default: %(default)s)")
    fin.add_argument("--final-top-k", type=int, default=d.final_top_k,
                     help="also finish the next best (best/ then finalists/RANK-ARCH/) (default: %(default)s)")
    fin.add_argument("--reference", action="store_true",
                     help="also measure and proxy-distill the paper's Table 1 shapes scaled to the teacher, as plot references")


def _length_flags(p: argparse.ArgumentParser, d: SimpleNamespace) -> None:
    """How long a search runs: its trials and its time limit."""
    from .config import DEFAULT_TRIALS
    from .time_limit import TIMED_TRIAL_SHARE

    p.add_argument("--trials", type=int, default=d.trials,
                   help="total finished trials the study should have; a rerun continues up to it (default: "
                        f"{DEFAULT_TRIALS}; with --timeout, as many as start within {TIMED_TRIAL_SHARE * 100:.0f}%% of it, the "
                        f"teacher's one-time targets left out, at least {DEFAULT_TRIALS})")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="wall-clock limit for the whole command: trials start only in its first half and, after the "
                        "first five, only while --final-steps still fit after them at the trials' pace; the final run "
                        "trains as many steps as fit before the limit: fewer than --final-steps on a slow host, more "
                        "(up to --final-max-steps) on a fast one (default: none, the same work on every host)")


def _search(args: argparse.Namespace) -> int:
    from kdnas.core.errors import InputError
    from kdnas.distill.loop import emulation_notice
    from kdnas.distill.trainer import resolve_device

    from . import search
    from .space import DIMENSIONS, load_space_file

    overrides = load_space_file(args.space_file) if args.space_file else {}
    for name in DIMENSIONS:
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.trials is not None and args.trials < 1:
        raise InputError(f"--trials {args.trials} must be at least 1")
    config = config_from_args(args, overrides)  # every flag checked once, before any worker starts
    if args.workers != 1:
        return _start_workers(args)
    if (notice := emulation_notice(config.precision, resolve_device(config.device))) is not None:
        print(f"kdnas search: {notice}", file=sys.stderr)
    summary = search(config)
    if args.json:
        print(json.dumps(summary.to_json(table=False), indent=2, default=str))
    else:
        _print_summary(summary, Path(args.out))
    return 0


def _start_workers(args: argparse.Namespace) -> int:
    """`--workers N`: N copies of this command, each its own process and storage connection, joined in
    one study by Optuna's distributed mode; exit status: the first failing worker's."""
    import os
    import subprocess

    from kdnas.core.errors import InputError
    from kdnas.latency import LATENCY_CORES_ENV

    if args.workers < 1:
        raise InputError(f"--workers {args.workers} is invalid: must be at least 1")
    if not args.storage or args.storage.startswith("sqlite"):
        raise InputError(f"--workers {args.workers} needs a storage that many workers can share: --storage "
                         "postgresql+psycopg://... or journal:PATH (SQLite is for one worker)")
    from kdnas.distill.trainer import resolve_device

    resolve_device(args.device)  # once, before any worker starts: one line, not one per worker
    argv = _without_workers(args.argv)
    gpus = _gpu_count() if args.device != "cpu" else 0
    measure_on, train_on = _split_cores(args.threads)
    children = []
    for i in range(args.workers):
        env = {**os.environ, LATENCY_CORES_ENV: ",".join(map(str, measure_on))}
        if gpus >= args.workers:
            env["CUDA_VISIBLE_DEVICES"] = str(i)  # one GPU per worker
        extra = [] if i == 0 else ["--no-progress"]  # one progress bar on the terminal
        pin = (lambda: os.sched_setaffinity(0, train_on)) if train_on else None
        children.append(subprocess.Popen([sys.executable, "-m", "kdnas.cli", *argv, *extra], env=env, preexec_fn=pin))
    try:
        codes = [child.wait() for child in children]
    except KeyboardInterrupt:
        for child in children:
            child.terminate()
        raise
    return next((code for code in codes if code), 0)


def _split_cores(threads: int) -> tuple[list[int], list[int]]:
    """(latency cores, training cores) for local workers: measurements get the last `threads` cores,
    training the others; on a host with no core to spare, training shares them and pauses while a
    measurement runs (core.quiet); measurements are one at a time either way."""
    import os

    from kdnas.latency import latency_cores

    measure_on = latency_cores(threads)
    train_on = sorted(set(os.sched_getaffinity(0)) - set(measure_on))
    where = f"training on cores {train_on}" if train_on else "training shares them and pauses while one runs"
    print(f"kdnas search: latency measured on cores {measure_on}, one at a time; {where}", file=sys.stderr)
    return measure_on, train_on


def _without_workers(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def config_from_args(args: argparse.Namespace, overrides: dict) -> SearchConfig:
    """The SearchConfig the flags ask for: every option named as a setting's flag (nas.config.FLAGS) is passed
    as is (one source: the flags' defaults are the dataclasses'); the negative switches and the space are mapped."""
    from .config import FLAGS, SearchConfig

    given = {name: value for name, value in vars(args).items() if name in FLAGS}
    return SearchConfig.from_flags(**given, prune=not args.no_prune, latency_model=not args.no_latency_model,
                                   progress=not args.no_progress, space_overrides=overrides)


def _refusal_line(s: Refusal) -> str:
    """A finalist not shipped, with the readings that refused it."""
    from .neighbours import origin

    twice = " twice (" + " and ".join(f"{r:.2f}" for r in s.latency_readings_ms) + " ms)" \
        if len(s.latency_readings_ms or []) == 2 else ""
    if s.ratio_to_teacher is not None:  # nas.final._latency.final_latency: timed side by side with the teacher
        twice += (f": {s.ratio_to_teacher:.3f}x the teacher side by side (the teacher "
                  f"{s.teacher_latency_now_ms:.2f} ms, it {s.read_ms:.2f} ms)")
    elif (s.latency_scaled_by or 1.0) < 1.0:  # a study of an earlier version: one fresh teacher reading
        twice += f", scaled by {s.latency_scaled_by:.3f} (the teacher read {s.teacher_latency_now_ms:.2f} ms beside it)"
    return (f"not shipped: {s.arch} ({origin(s.trial, s.neighbour_of)}) measured "
            f"{s.latency_ms:.2f} ms {s.stage}{twice}, over the budget of {s.budget_ms:.2f} ms"
            + (f"; moved to {s.dir}" if s.dir else ""))


def _print_summary(summary: StudySummary, out: Path) -> None:
    from .verify import verified_line

    facts, best, budgets = summary.facts, summary.best_trial, summary.budgets or ()
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items()))
    budget = ", ".join(b.label if b.label.endswith("ms") else f"{b.label} {b.budget_ms:.2f} ms"
                       for b in budgets) or f"{facts.budget_ms:.2f} ms"
    tolerance = facts.budget_tolerance or 0.0
    within = f" (a graph fits up to {tolerance:.0%} over: --budget-tolerance)" if tolerance else ""
    print(f"trials: {summary.trials} ({counts}); budget{'s' if budgets else ''} {budget}{within}, "
          f"teacher {facts.teacher_latency.median_ms:.2f} ms")
    if best:
        print(f"best trial #{best.number}: {best.arch}  reward {best.reward:.4f}  "
              f"proxy loss {best.loss:.4f}  {best.latency_median_ms:.2f} ms")
    for s in facts.final_over_budget or ():
        print(_refusal_line(s))
    for n in facts.final_neighbours or ():  # nas.neighbours
        read = n.latency_read_ms or n.scored_latency
        scaled = (f" beside {n.parent_read_ms:.2f} ms for {n.neighbour_of}: {n.scored_latency:.2f} ms "
                  "on the trials' scale" if (n.latency_scaled_by or 1.0) != 1.0 else "")
        print(f"FFN neighbour {n.arch} of {n.neighbour_of}: {read:.2f} ms as shipped{scaled}, proxy reward {n.reward:.4f}")
    int8 = facts.teacher_int8
    for f in facts.final or ():
        _print_final(f, int8)
    for t in facts.final_teacher or ():
        _print_teacher(t)
    if int8 is not None:
        print(f"the teacher as INT8 (no training): {int8.latency.median_ms:.2f} ms, embedding fidelity rho "
              f"{int8.fidelity.spearman:.3f} on the same sentences")
    for b in budgets:
        if not b.final:
            print(f"budget {b.label}: {len(b.trials_within)} trained trials within it, nothing shipped yet")
    if facts.final:
        print(f"probes (minutes on a CPU): kdnas evaluate {shlex.quote(facts.final[0].dir)} --baselines --measures "
              "fidelity,probe --card adds their table, beside the untrained baselines, to its model card (without "
              "--measures, fine-tuning too: an hour or more on a CPU)")
    if facts.target is not None:
        print(f"latency judged by the target profile {facts.target['file']} ({facts.target['cpu']}): no reading in "
              "the search")
    for record in facts.verified or ():
        print(verified_line(record))
    print(summary.time_ledger.line())
    print(f"pages: {out / 'report.html'}  {out / 'pareto.html'}; table: {out / 'trials.csv'}")


def _print_final(f: FinalRecord, teacher_int8: TeacherInt8 | None = None) -> None:
    """A shipped student's lines: shape, steps and latency; its fidelity beside the untrained baselines, on its
    own training rows, as INT8 (first where the budget judged the INT8 graph), and against the teacher's INT8 graph."""
    from kdnas.evaluation.precision import INT8_GRAPH

    from .baselines import fit_line, versus_teacher_int8
    from .neighbours import shape_label
    from .records import steps_label

    method = (f.recipe or {}).get("method", "")
    within = f" (the {f.budget} budget, {f.budget_ms:.2f} ms)" if f.budget else ""
    print(f"final {f.dir}{within}: {shape_label(f)} after {steps_label(f)} of {method}: {f.latency_ms:.2f} ms; "
          f"proxy loss {f.reward_loss:.4f}, held-out L_HS {f.l_hs_norm:.4f}, reward {f.reward:.4f}"
          + (" (L_HS scores the middle layers too, which embed does not distil)" if method == "embed" else ""))
    quality = f.quality
    if quality is not None and quality.fidelity:
        rows = ", ".join(f"{name} {r.spearman:.3f}" for name, r in quality.fidelity.items())
        verdict = "beats both untrained baselines on fidelity" if quality.beats_baselines else \
            "does NOT beat the untrained baselines on fidelity: this recipe failed"
        int8 = quality.int8
        if int8 and f.budget_graph == INT8_GRAPH:  # the graph the budget judged leads
            print(f"  model.int8.onnx, the graph the budget judged: embedding fidelity rho {int8.spearman:.3f} "
                  f"({quality.sentences} held-out sentences)")
        print(f"  embedding fidelity rho ({quality.sentences} held-out sentences): {rows}; {verdict}")
        if fit := fit_line(quality, f.train_rows):
            print(f"  {fit}")
        if int8 and f.budget_graph != INT8_GRAPH:
            print(f"  model.int8.onnx: embedding fidelity rho {int8.spearman:.3f} on the same sentences")
        if line := graphs_line(f):
            print(f"  {line}")
        if against := versus_teacher_int8(f, teacher_int8):
            print(f"  {against}")


def graphs_line(f: FinalRecord) -> str | None:
    """A finalist's graphs side by side — fp32, all-INT8 and its precision plan where one was grown — each
    one's latency as shipped and held-out fidelity, the one the budget judged marked."""
    from kdnas.evaluation.precision import FP32_GRAPH, INT8_GRAPH, MIXED_GRAPH

    from .schema import Quality

    quality = f.quality or Quality()
    names = {FP32_GRAPH: "fp32", INT8_GRAPH: "all-INT8", MIXED_GRAPH: (f.precision_plan or {}).get("label") or "plan"}
    shown = [f"{name} ({what}) {lat.median_ms:.2f} ms" + (f", rho {rho.spearman:.3f}" if rho else "")
             + (" <- shipped" if name == f.budget_graph else "")
             for name, what in names.items()
             for lat, rho in [(f.latency_of(name), quality.of_graph(name))] if lat]
    cut = " (its plan stopped growing at --timeout: the all-INT8 graph stands)" if (f.precision_plan or {}).get(
        "cut_short") else ""
    return "graphs: " + "; ".join(shown) + cut if len(shown) > 1 else None


def _print_teacher(t: FinalTeacher) -> None:
    """The teacher's own plan within a budget beside the student it was compared with (nas.final._teacher)."""
    budget = f"the {t.budget} budget" if t.budget else "the budget"
    plan, student = t.plan, t.student
    rho = "not measured" if student.rho is None else f"{student.rho:.3f}"
    line = (f"the teacher within {budget} ({t.budget_ms:.2f} ms), no training: {plan.label} at "
            f"{plan.latency_ms:.2f} ms, rho {t.fidelity.spearman:.3f} on the held-out sentences; the student "
            f"{student.arch}'s shipped graph: rho {rho}")
    if t.shipped:
        line += f" -> the TEACHER ships in {t.dir} ({t.graph}, {t.latency_ms:.2f} ms as shipped); the student is in {student.dir}"
    else:
        line += " -> the student ships"
    print(line)


def _report(args: argparse.Namespace) -> int:
    from . import write_report

    out = Path(args.out)
    summary = write_report(out, storage=args.storage, study_name=args.study_name)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items()))
    print(f"{summary.study_name}: {summary.trials} trials ({counts}); wrote {out / 'report.html'}, "
          f"{out / 'pareto.html'}, {out / 'trials.csv'}, {out / 'summary.json'}", file=sys.stdout)
    return 0
