"""The comparison a deployment decision needs (`kdnas evaluate`): teacher and students side by side
on embedding fidelity, linear probes and fine-tuning, each with its CPU latency, as a JSON-ready
report and a readable table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from kdnas.core.errors import InputError, check_choice
from kdnas.distill.data import HELDOUT_EVERY, heldout_sentences, load_corpus
from .compare import scores as measure_scores
from .fidelity import MIN_PAIRS, MIN_SENTENCES, fidelity_scores
from .finetune import FinetuneConfig, TaskScore, evaluate_model, protocol_splits
from .models import ModelRef, count_parameters, resolve_device, resolve_model
from .probe import PROBE_C, PROBE_MAX_ITER, probe_scores
from .tasks import Task, load_task

MEASURES = ("fidelity", "probe", "finetune")


@dataclass(frozen=True)
class QualityConfig:
    """The protocol of the fidelity and probe measures (max length and device are the fine-tuning ones)."""

    corpus: str = "news"  # held-out sentences for fidelity come from this corpus
    fidelity_sentences: int = 1000
    fidelity_pairs: int = 4000
    shots: int = 16  # examples per class in a few-shot probe
    draws: int = 10  # few-shot draws (the same for every model)
    seed: int = 0

    def __post_init__(self) -> None:
        limits = {"fidelity_sentences": MIN_SENTENCES, "fidelity_pairs": MIN_PAIRS, "shots": 1, "draws": 1}
        for name, low in limits.items():
            if getattr(self, name) < low:
                raise InputError(f"{name.replace('_', ' ')} {getattr(self, name)} is invalid: must be >= {low}")


def check_measures(measures: str | Sequence[str]) -> tuple[str, ...]:
    """The measures as a tuple in `MEASURES` order; an unknown name is a user error naming it."""
    names = [m.strip() for m in (measures.split(",") if isinstance(measures, str) else measures) if m.strip()]
    for name in names:
        check_choice("measure", name, MEASURES)
    if not names:
        raise InputError(f"no measure given; allowed: {', '.join(MEASURES)}")
    return tuple(m for m in MEASURES if m in names)


@dataclass
class ModelScores:
    model: str
    path: str
    role: str  # "teacher", "student" or "baseline" (untrained, evaluation.baselines)
    parameters: int
    latency_ms: float | None
    tasks: dict[str, TaskScore] = field(default_factory=dict)
    quality: dict = field(default_factory=dict)  # "fidelity" and "probes" (measure_model), when measured
    beside_teacher: dict | None = None  # latency as a share of the teacher's, side by side (_latency)

    def to_dict(self) -> dict:
        return {"model": self.model, "path": self.path, "role": self.role, "parameters": self.parameters,
                "latency_ms": self.latency_ms, "tasks": {k: v.to_dict() for k, v in self.tasks.items()},
                **({"latency_beside_teacher": self.beside_teacher} if self.beside_teacher else {}), **self.quality}


def _resolved(teacher: str | None, models: Sequence[str], latency_seq: int | None) -> list[tuple[ModelRef, str]]:
    """The teacher and the models with their roles, each checked to exist, to have a tokenizer and (with a
    latency length, None: no latency) to take that many tokens — before the minutes of measuring; the
    timing, which comes last, would refuse a length past a model's positions only then."""
    from kdnas.latency import max_tokens

    refs = [(resolve_model(teacher, "--teacher"), "teacher")] if teacher else []
    refs += [(resolve_model(m), "student") for m in models]
    for ref, _ in refs if latency_seq is not None else ():
        if (positions := max_tokens(ref.path)) is not None and latency_seq > positions:
            raise InputError(f"--latency-seq {latency_seq} exceeds {ref.name}'s {positions} positions; "
                             f"allowed 1..{positions}")
    return refs


def evaluate(
    models: list[str],
    tasks: list[str],
    config: FinetuneConfig = FinetuneConfig(),
    *,
    teacher: str | None = "minilm-l6",
    latency: bool = True,
    latency_seq: int = 128,
    threads: int = 2,
    cache: bool = True,
    log=None,
    measures: Sequence[str] = ("finetune",),
    quality: QualityConfig | None = None,
    baselines: Sequence[ModelRef] | Callable[[], Sequence[ModelRef]] = (),
) -> dict:
    """Measure `teacher` and each model on each task; a JSON-ready report.

    `measures` (see `MEASURES`): "finetune" fine-tunes over the seeds (`evaluation.finetune`),
    "probe" and "fidelity" read frozen embeddings (`evaluation.probe`, `evaluation.fidelity`; protocol in
    `quality`, a `QualityConfig`; max length and device come from `config`). Every model, task and
    the fidelity corpus are checked before any training, so a typo fails in a second rather than
    after the teacher's fine-tuning. `baselines` (`evaluation.baselines`) are measured after the
    models, as rows of role "baseline"; given as a callable, they are built once all else is checked.
    """
    log = log or (lambda message: None)
    measures = check_measures(measures)
    quality = quality or QualityConfig()
    loaded = [load_task(t) for t in tasks]
    refs = _resolved(teacher, models, latency_seq if latency else None)
    if "fidelity" in measures and not teacher:
        raise InputError("the fidelity measure compares each model with the teacher: give a teacher, "
                         f"or leave fidelity out of the measures ({', '.join(measures)})")
    sentences = (heldout_sentences(load_corpus(quality.corpus), quality.fidelity_sentences, seed=quality.seed)
                 if "fidelity" in measures else None)
    refs += [(b, "baseline") for b in (baselines() if callable(baselines) else baselines)]
    device = resolve_device(config.device)
    log(f"evaluating {len(refs)} model(s) on {', '.join(t.name for t in loaded)} ({', '.join(measures)}"
        + (f", fine-tuning seeds {list(config.seeds)}" if "finetune" in measures else "") + f") on {device.type}")

    results: list[ModelScores] = []
    teacher_ref = refs[0][0] if teacher else None
    for ref, role in refs:
        extra = measure_model(ref, teacher_ref, loaded, measures, quality, sentences,
                              max_len=config.max_len, device=config.device, cache=cache)
        scores = evaluate_model(ref, loaded, config, cache=cache) if "finetune" in measures else {}
        beside_of = teacher_ref if role != "teacher" else None
        lat, beside = _latency(ref, beside_of, latency_seq, threads) if latency else (None, None)
        results.append(ModelScores(model=ref.name, path=ref.path, role=role, parameters=count_parameters(ref),
                                   latency_ms=lat, tasks=scores, quality=extra, beside_teacher=beside))
        log(f"  {ref.name}: " + _summary(results[-1]))

    rows = [_relative(entry, results[0] if teacher else None) for entry in results]
    return {
        "protocol": {**asdict(config), "device": device.type, "latency": {"batch": 1, "seq": latency_seq,
                     "threads": threads, "runtime": "onnxruntime"} if latency else None,
                     **protocol(measures, quality, sentences)},
        "tasks": {t.name: _task_entry(t, config) for t in loaded},
        "models": rows,
    }


def _task_entry(task: Task, config: FinetuneConfig) -> dict:
    """A task in the report: its labels, split sizes, source and the examples fine-tuning used."""
    train, test = protocol_splits(task, config)
    return {"labels": list(task.labels), "sizes": task.sizes(), "source": task.source,
            "used": {"train": len(train), "test": len(test)}}


def _latency(ref: ModelRef, teacher: ModelRef | None, seq: int, threads: int) -> tuple[float, dict | None]:
    """Median CPU latency (batch 1, onnxruntime) of the model in milliseconds, and beside `teacher` (None
    for none) its latency as a share of the teacher's, the two timed in alternation in one process
    (`latency.profile_pair`): two readings taken apart (one perhaps cached from another day) differ by
    more than a student's margin on a shared host; a ratio taken side by side does not."""
    from kdnas.latency import profile, profile_pair

    alone = profile(ref.path, batch=1, seq=seq, threads=threads).median_ms
    if teacher is None:
        return alone, None
    pair = profile_pair(ref.path, teacher.path, batch=1, seq=seq, threads=threads)
    return alone, {"ratio": pair.ratio, "quartiles": [pair.ratio_low, pair.ratio_high], "rounds": pair.rounds}


def _summary(entry: ModelScores) -> str:
    """One log line: fidelity ρ, full-split probe and fine-tuning accuracy, whichever were measured."""
    parts = []
    if "fidelity" in entry.quality:
        parts.append(f"fidelity ρ {entry.quality['fidelity']['spearman']:.3f}")
    parts += [f"{k} probe {100 * v['full']:.1f}" for k, v in entry.quality.get("probes", {}).items()]
    parts += [f"{k} {100 * v.mean():.1f}" for k, v in entry.tasks.items()]
    return ", ".join(parts)


def _relative(entry: ModelScores, reference: ModelScores | None) -> dict:
    """A report row: the model's scores, and beside them what share of the reference's it keeps."""
    row = entry.to_dict()
    # Every measure's standard error (evaluation.compare): two rows closer than ~2 SE are a tie.
    row["standard_errors"] = {name: score.se for name, score in measure_scores(row).items()}
    if reference is None:
        return row
    if entry.tasks:
        row["percent_of_teacher"] = {k: 100 * v.mean() / reference.tasks[k].mean() for k, v in entry.tasks.items()}
        row["percent_of_teacher"]["average"] = sum(row["percent_of_teacher"].values()) / len(entry.tasks)
        # Raw % flatters a student that only predicts the majority class (e.g. 79 % on sentiment);
        # the share of the teacher's gain over that baseline does not.
        row["gain_kept"] = {k: gain_kept(v.mean(), reference.tasks[k].mean(), v.majority)
                            for k, v in entry.tasks.items()}
        row["gain_kept"]["average"] = sum(row["gain_kept"].values()) / len(entry.tasks)
    row.update(relative_quality(entry.quality, reference.quality))
    if entry.beside_teacher:  # the side-by-side ratio, not two readings taken apart
        row["speedup"] = 1 / entry.beside_teacher["ratio"]
    return row


def gain_kept(student: float, teacher: float, majority: float) -> float:
    """100 × (student − majority) / (teacher − majority): 0 = no better than the majority class."""
    return 100 * (student - majority) / (teacher - majority) if teacher > majority else float("nan")


def format_table(report: dict) -> str:
    """A readable table for a terminal (`report_table`'s cells in aligned columns, notes below)."""
    head, lines, notes = report_table(report)
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines), *notes])


def format_markdown(report: dict) -> str:
    """The same table in Markdown (a model card's), its notes as a paragraph below."""
    head, lines, notes = report_table(report)
    row = lambda cells: "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"  # noqa: E731
    table = [row(head), row(["---"] * len(head)), *map(row, lines)]
    return "\n".join(table) + ("\n\n" + " ".join(f"{note}." for note in notes) if notes else "")


def report_table(report: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """Head, one row of cells per model and the majority class, and the notes: fidelity and probe
    columns (`table_parts`), then fine-tuning accuracy mean ± std (macro-F1), % of teacher and gain
    kept, each when measured; params, latency."""
    q_head, q_rows, q_majority, q_note = table_parts(report)
    f_head, f_rows, f_majority, f_note = _finetune_parts(report)
    l_head, l_rows, l_note = _latency_parts(report)
    head = ["model", "params"] + l_head + q_head + f_head
    lines = []
    for row, l_cells, q_cells, f_cells in zip(report["models"], l_rows, q_rows, f_rows):
        lines.append([f"{row['model']}{' (teacher)' if row['role'] == 'teacher' else ''}",
                      f"{row['parameters'] / 1e6:.1f}M"] + l_cells + q_cells + f_cells)
    if {"probe", "finetune"} & set(report["protocol"].get("measures", MEASURES)):  # fidelity alone has no classes
        lines.append(["majority class", ""] + [""] * len(l_head) + q_majority + f_majority)
    return head, lines, [note for note in (l_note, q_note, f_note) if note]


def _latency_parts(report: dict) -> tuple[list[str], list[list[str]], str]:
    """The latency columns: each model's own reading, and its share of the teacher's timed beside it."""
    models = report["models"]
    cells = [[f"{row['latency_ms']:.2f}" if row.get("latency_ms") else "-"] for row in models]
    if not any(row.get("latency_beside_teacher") for row in models):
        return ["latency ms"], cells, ""
    for row, c in zip(models, cells):
        beside = row.get("latency_beside_teacher")
        c.append("1" if row["role"] == "teacher" else f"{beside['ratio']:.3f}" if beside else "-")
    p = report["protocol"]["latency"]
    return ["latency ms", "× teacher"], cells, (
        f"latency ms = median, batch 1, {p['seq']} tokens, {p['threads']} threads, onnxruntime, each model alone (a "
        "reading can be cached from an earlier run); × teacher = its latency over the teacher's, the two timed in "
        "alternation in one process: the figure a budget set as a share of the teacher's is judged by")


def _finetune_parts(report: dict) -> tuple[list[str], list[list[str]], list[str], str]:
    """The fine-tuning columns: head, cells per model row, majority row, footer (empty when not measured)."""
    tasks = list(report["tasks"])
    if "finetune" not in report["protocol"].get("measures", ["finetune"]):
        return [], [[] for _ in report["models"]], [], ""
    head = [f"{t} acc (F1)" for t in tasks] + ["% of teacher", "gain kept"]
    rows = []
    for row in report["models"]:
        cells = []
        for t in tasks:
            s = row["tasks"][t]
            pct = row.get("percent_of_teacher", {}).get(t)
            cells.append(f"{100 * s['accuracy_mean']:.1f} ± {100 * s['accuracy_std']:.1f} ({100 * s['macro_f1_mean']:.1f})"
                         + (f" {pct:.0f}%" if pct is not None and row["role"] != "teacher" else ""))
        avg = row.get("percent_of_teacher", {}).get("average")
        cells.append(f"{avg:.1f}%" if avg is not None else "-")
        gain = row.get("gain_kept", {}).get("average")
        cells.append(f"{gain + 0.0:.1f}%" if gain is not None else "-")  # no "-0.0"
        rows.append(cells)
    majority = [f"{100 * report['models'][0]['tasks'][t]['majority_accuracy']:.1f}" for t in tasks] + ["", ""]
    p = report["protocol"]
    footer = (f"accuracy % mean ± std over seeds {p['seeds']} (macro-F1 %); fine-tuned {p['epochs']} epochs, lr {p['lr']}, "
              f"batch {p['batch_size']}, max len {p['max_len']}; train/test examples per task: "
              + ", ".join(f"{t} {v['used']['train']}/{v['used']['test']}" for t, v in report["tasks"].items())
              + "; gain kept = (student - majority) / (teacher - majority), averaged over tasks")
    return head, rows, majority, footer


def measure_model(ref: ModelRef, teacher: ModelRef | None, tasks: Sequence[Task], measures: Sequence[str],
                  config: QualityConfig, sentences: Sequence[str] | None, *, max_len: int = 128,
                  device: str = "auto", cache: bool = True) -> dict:
    """The `fidelity` (against `teacher`) and `probes` entries of one model's report row."""
    out: dict = {}
    if "fidelity" in measures:
        if teacher is None or sentences is None:
            raise InputError("the fidelity measure compares a model with a teacher: give a teacher, "
                             "or leave fidelity out of the measures")
        out["fidelity"] = fidelity_scores(teacher, ref, sentences, pairs=config.fidelity_pairs, seed=config.seed,
                                          max_len=max_len, device=device, cache=cache)
    if "probe" in measures:
        out["probes"] = {t.name: probe_scores(ref, t, shots=config.shots, draws=config.draws, seed=config.seed,
                                              max_len=max_len, device=device, cache=cache) for t in tasks}
    return out


def relative_quality(entry: dict, reference: dict) -> dict:
    """Probe gain kept per task and averaged: 100·(student − majority)/(teacher − majority).

    Raw accuracy flatters a model that only finds the majority class; the share of the teacher's
    gain over that baseline does not. `probe_gain_kept` uses the full-split probe,
    `probe_few_shot_gain_kept` the few-shot mean.
    """
    if "probes" not in entry or "probes" not in reference:
        return {}
    out = {}
    for key, score in (("probe_gain_kept", "full"), ("probe_few_shot_gain_kept", "few_shot_mean")):
        gains = {name: gain_kept(p[score], reference["probes"][name][score], p["majority"])
                 for name, p in entry["probes"].items()}
        gains["average"] = sum(gains.values()) / len(entry["probes"])
        out[key] = gains
    return out


def protocol(measures: Sequence[str], config: QualityConfig, sentences: Sequence[str] | None) -> dict:
    """The report's protocol entries for the measures taken."""
    out: dict = {"measures": list(measures)}
    if "fidelity" in measures and sentences is not None:
        out["fidelity"] = {"corpus": config.corpus, "sentences": len(sentences), "pairs": config.fidelity_pairs,
                           "seed": config.seed, "heldout": f"one corpus document in {HELDOUT_EVERY}, never in a transfer set"}
    if "probe" in measures:
        out["probe"] = {"shots": config.shots, "draws": config.draws, "seed": config.seed,
                        "classifier": f"logistic regression, L2 C={PROBE_C}, L-BFGS max {PROBE_MAX_ITER} iterations, "
                                      "standardised features", "splits": "full train (or few-shot draws) / full test"}
    return out


def table_parts(report: dict) -> tuple[list[str], list[list[str]], list[str], str]:
    """Head, one list of cells per model row, the majority row and a footer for the quality columns."""
    measures, tasks, models = report["protocol"].get("measures", []), list(report["tasks"]), report["models"]
    head: list[str] = []
    rows: list[list[str]] = [[] for _ in models]
    majority: list[str] = []
    notes = []
    if "fidelity" in measures:
        head += ["fidelity ρ", "mean cos"]
        majority += ["", ""]
        for cells, row in zip(rows, models):
            f = row["fidelity"]
            cells += [f"{f['spearman']:.3f}", f"{f['mean_cosine']:.3f}{'' if f['cosine_via'] == 'identity' else '*'}"]
        p = report["protocol"]["fidelity"]
        notes.append(f"fidelity ρ = Spearman of teacher vs student cosine similarities over {models[0]['fidelity']['pairs']} "
                     f"pairs of {p['sentences']} held-out {p['corpus']} sentences; mean cos = teacher vs student "
                     "embedding of the same sentence (* through a least-squares projection fitted on half of them)")
    if "probe" in measures:
        p = report["protocol"]["probe"]
        head += [f"{t} probe" for t in tasks] + [f"{t} {p['shots']}-shot" for t in tasks] + ["probe gain kept"]
        majority += [f"{100 * models[0]['probes'][t]['majority']:.1f}" for t in tasks] * 2 + [""]
        for cells, row in zip(rows, models):
            probes, gain = row["probes"], row.get("probe_gain_kept", {}).get("average")
            cells += [f"{100 * probes[t]['full']:.1f}" for t in tasks]
            cells += [f"{100 * probes[t]['few_shot_mean']:.1f} ± {100 * probes[t]['few_shot_std']:.1f}" for t in tasks]
            cells.append(f"{gain + 0.0:.1f}%" if gain is not None else "-")
        notes.append(f"probe = logistic regression on frozen embeddings, accuracy % on the full test split, trained "
                     f"on the full train split / on {p['shots']} per class (mean ± std over {p['draws']} draws); "
                     "probe gain kept from the full-split probe; each measure's standard error is in the JSON "
                     "report (standard_errors): two models closer than about twice it are a tie")
    return head, rows, majority, "; ".join(notes)
