"""Is the shipped student better than what needs no training? Its embedding fidelity beside two
untrained baselines at equal or lower cost.

- `first k layers`: the teacher cut after its first k layers at full width, untrained, with k the
  deepest cut whose FLOPs do not exceed the student's (so its latency is not higher);
- `inherited, untrained`: the student's own starting point (`distill.inherit`), before any step
  (both built by `evaluation.baselines`, which `kdnas evaluate --baselines` rebuilds them with).

A distilled student that does not beat both has failed, and the summary says so. Fidelity is
Spearman's ρ between the teacher's and the model's pairwise cosine similarities of held-out corpus
sentences (`evaluation.fidelity.embedding_fidelity`); the probes of `kdnas evaluate` are too slow for
the search itself and are run by `kdnas evaluate --baselines`.

The student's fidelity on as many rows of its own transfer set stands beside it, as a training run shows
its training loss beside the validation loss: a student that orders the teacher's similarities better on
text it was trained on than on new text is short of text, and more of it would lift it where more passes
over the same would not (measured with a one-off benchmark, in git history; docs/design/final-recipe.md
"Short of text, or of capacity?").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kdnas.distill import StudentSpec
from kdnas.core.errors import KdnasError
from kdnas.evaluation.baselines import untrained_baselines
from kdnas.evaluation.fidelity import MIN_SENTENCES

from .schema import STUDENT, FinalRecord, Fidelity, Quality, TeacherInt8

if TYPE_CHECKING:
    from kdnas.core.sentence import SentencePipeline

    from .context import SearchContext

PAIRS = 4000


def untrained_row(name: str) -> str:
    """The `Quality.fidelity` row of the untrained baseline `name` (evaluation.baselines.untrained_baselines)."""
    return f"{name} (untrained)"


# The row that is an inherit run's own start: the inherited student before any step.
START_ROW = untrained_row("inherited")


@dataclass(frozen=True)
class HeldOut:
    """Sentences and the teacher's embeddings of them (`reference`); where the corpus holds too few to hold any
    out, none and why (`skipped`)."""

    sentences: list[str] = field(default_factory=list)
    reference: Any = None
    skipped: str | None = None


@dataclass(frozen=True)
class Prepared:
    """What `fidelity_table` needs besides the student (`baseline_fidelity`): the held-out sentences, both untrained
    baselines' rows on them, and as many rows of the student's own transfer set (`trained_on`)."""

    held: HeldOut
    rows: dict[str, Fidelity] = field(default_factory=dict)
    trained_on: HeldOut | None = None


def baseline_fidelity(ctx: "SearchContext", spec: StudentSpec, cache: Any) -> Prepared | None:
    """What `fidelity_table` needs besides the student (None when fidelity is not asked for). The final stage
    computes it before training: nothing in it depends on the training, and its time tells what a `--timeout`
    must leave for after the run."""
    cfg = ctx.config
    held = _held_out(ctx)
    if held is None or held.skipped:
        return None if held is None else Prepared(held)
    baselines, _ = untrained_baselines(ctx.teacher, spec, cache.importance(), cfg.layer_rule, cfg.latency.seq)
    rows = {untrained_row(name): _fidelity(ctx, model, held.sentences, held.reference)
            for name, model in baselines.items()}
    return Prepared(held, rows, _training_rows(ctx, cache))


def teacher_int8(ctx: "SearchContext", pipeline: SentencePipeline, exported: Path | None = None,
                 read: Callable[[Path], Any] | None = None) -> TeacherInt8 | None:
    """The alternative a user has for free, beside the students: the teacher itself as INT8 (the recipe of
    `kdnas export --int8`; `exported`, where that graph exists already), its latency read by `read` (by default
    alone, on the search's settings) and its fidelity on the held-out sentences the students are scored on (None
    when fidelity is not asked for)."""
    import tempfile

    from kdnas.evaluation import embedding_fidelity
    from kdnas.export import export_model, onnx_sentence_embeddings

    from .measure import latency_record

    cfg = ctx.config
    held = _held_out(ctx)
    if held is None or held.skipped:
        return None  # the students' table says why (baseline_fidelity)
    sentences, reference = held.sentences, held.reference
    read = read or ctx.judge.alone
    with tempfile.TemporaryDirectory(prefix="kdnas-teacher-int8-") as tmp:
        graph = exported
        if graph is None:
            folder = Path(tmp) / "teacher"
            export_model(ctx.teacher.model, folder, int8=True, tokenizer=ctx.teacher.tokenizer,
                         pooling=pipeline.pooling, normalize=pipeline.normalize)
            graph = folder / "model.int8.onnx"
        latency = latency_record(read(graph))
        emb = onnx_sentence_embeddings(graph, ctx.teacher.tokenizer, sentences, max_len=cfg.latency.seq)
    fidelity = embedding_fidelity(reference, torch.from_numpy(emb), pairs=PAIRS, seed=cfg.seed)
    return TeacherInt8(latency=latency, fidelity=Fidelity.from_attrs(fidelity), sentences=len(sentences))


def _held_out(ctx: "SearchContext") -> HeldOut | None:
    """The `final.quality_sentences` held-out corpus sentences every shipped model is scored on, with the teacher's
    embeddings of them; None when fidelity is not asked for, none and why when the corpus holds too few.
    Once per search: the teacher's INT8 graph and every budget's finalists are scored on the same ones, and the
    teacher's pass over them takes about 30 s for MPNet on two cores (`SearchContext.shared` keeps them)."""
    from kdnas.distill.data import heldout_sentences
    from kdnas.evaluation import sentence_embeddings

    shared = getattr(ctx, "shared", None)
    if shared is not None and "held_out" in shared:
        return shared["held_out"]
    cfg = ctx.config
    if cfg.final.quality_sentences <= 0:
        return None
    try:
        sentences = heldout_sentences(ctx.texts, cfg.final.quality_sentences, seed=cfg.seed)
    except KdnasError as err:
        return HeldOut(skipped=str(err))
    held = HeldOut(sentences, sentence_embeddings(ctx.teacher, sentences, max_len=cfg.latency.seq))
    if shared is not None:
        shared["held_out"] = held
    return held


def _training_rows(ctx: "SearchContext", cache: Any) -> HeldOut:
    """As many rows of the transfer set as held-out sentences, decoded to text, with the teacher's embeddings."""
    from kdnas.distill.data import training_texts
    from kdnas.evaluation import sentence_embeddings

    cfg = ctx.config
    texts = training_texts(ctx.teacher.tokenizer, cache.data, cfg.final.quality_sentences, seed=cfg.seed)
    return HeldOut(texts, sentence_embeddings(ctx.teacher, texts, max_len=cfg.latency.seq))


def fidelity_table(ctx: "SearchContext", spec: StudentSpec, student: nn.Module, cache: Any,
                   prepared: Prepared | None = None, passes: float | None = None) -> Quality | None:
    """Fidelity of the student and both baselines on `quality_sentences` held-out sentences, and the
    student's on as many rows of its transfer set (`trained_on`, with the `passes` its run made over
    them); None when not asked for (0) or the corpus is too small to hold any out. `prepared` is
    `baseline_fidelity`'s result when it was computed before."""
    prepared = baseline_fidelity(ctx, spec, cache) if prepared is None else prepared
    if prepared is None or prepared.held.skipped:
        return None if prepared is None else Quality(skipped=prepared.held.skipped)
    held = prepared.held
    student_row = _fidelity(ctx, student, held.sentences, held.reference)
    rows = {STUDENT: student_row, **prepared.rows}
    beaten = all(student_row.spearman > r.spearman for name, r in rows.items() if name != STUDENT)
    own, trained = prepared.trained_on, None
    if own is not None and len(own.sentences) >= MIN_SENTENCES:
        trained = replace(_fidelity(ctx, student, own.sentences, own.reference), passes=passes)
    return Quality(fidelity=rows, sentences=len(held.sentences), max_len=ctx.config.latency.seq, beats_baselines=beaten,
                   trained_on=trained)


def int8_fidelity(ctx: "SearchContext", held: HeldOut | None, graph: Path) -> Fidelity | None:
    """The shipped INT8 graph's fidelity on the held-out sentences the student is scored on: what a user
    who deploys model.int8.onnx gets, beside the fp32 student's row. None where fidelity was not measured."""
    if held is None or held.skipped:
        return None
    from kdnas.evaluation import embedding_fidelity
    from kdnas.export import onnx_sentence_embeddings

    cfg = ctx.config
    emb = onnx_sentence_embeddings(graph, ctx.teacher.tokenizer, held.sentences, max_len=cfg.latency.seq)
    return Fidelity.from_attrs(embedding_fidelity(held.reference, torch.from_numpy(emb), pairs=PAIRS,
                                                  seed=cfg.seed))


def fit_line(quality: Quality, rows: int | None = None) -> str | None:
    """One line on the student's fidelity on its own training text beside held-out text, and what the
    difference says, naming the option that gives more text (`rows`: the run's training rows, where known);
    None where it was not measured."""
    own, held = quality.trained_on, quality.student
    if own is None or held is None or own.spearman_se is None or held.spearman_se is None:
        return None
    gap, se = own.spearman - held.spearman, math.hypot(own.spearman_se, held.spearman_se)
    line = f"on {own.sentences} of its own training rows rho {own.spearman:.3f} ({gap:+.3f} over held-out"
    if own.passes is not None and own.passes < 1:
        return line + f"; after {own.passes:.1f} of a pass, not all of them seen yet)"
    if gap > 2 * se:
        more = "--final-train" + ("" if rows is None else f" above this run's {rows} rows")
        return line + ", beyond the noise): it fits the text it saw better than new text; a longer run needs " \
                      f"more distinct text of this kind — more of the corpus ({more}) while it holds more, else " \
                      "another (--corpus) — not more passes over the same"
    return line + ", within the noise): as good on new text as on the text it saw; more text would not lift it"


def versus_teacher_int8(final: FinalRecord, int8: TeacherInt8 | None) -> str | None:
    """One line on a shipped student against the alternative its user has for free, the teacher's own INT8
    graph (`teacher_int8`, read on the same settings and sentences): whether the student is worth shipping,
    as fp32, only as INT8, or not at all. None where either side was not measured."""
    quality = final.quality or Quality()
    fp32_rho = None if quality.student is None else quality.student.spearman
    int8_rho = None if quality.int8 is None else quality.int8.spearman
    int8_ms = None if final.latency_int8_onnx is None else final.latency_int8_onnx.median_ms
    if not int8 or fp32_rho is None:
        return None
    ms, rho = int8.latency.median_ms, int8.fidelity.spearman
    # an INT8-budgeted search's `latency_ms` is its INT8 graph's: the fp32 side is read where it was timed
    fp32_ms = final.latency_ms if final.latency_fp32_onnx is None else final.latency_fp32_onnx.median_ms

    def beaten(s_ms: float | None, s_rho: float | None) -> bool:  # the teacher's INT8 graph as fast and as close
        return s_ms is not None and s_rho is not None and ms <= s_ms and rho >= s_rho

    teacher, fp32_beaten = f"the teacher as INT8 ({ms:.2f} ms, rho {rho:.3f})", beaten(fp32_ms, fp32_rho)
    if fp32_beaten and (int8_ms is None or beaten(int8_ms, int8_rho)):
        return (f"{teacher} is as fast and as close to the teacher as this student in "
                f"{'either form' if int8_ms is not None else 'fp32'}: at this budget, ship it instead")
    if fp32_beaten:
        return f"{teacher} beats this student's fp32 graph: ship the student as INT8 (model.int8.onnx)"
    if fp32_rho >= rho:
        return f"closer to the teacher than {teacher}" + (", and faster" if fp32_ms < ms else "")
    return f"faster than {teacher}, which is closer to the teacher by {rho - fp32_rho:.3f}: a trade of speed for fidelity"


def _fidelity(ctx: "SearchContext", model: nn.Module, sentences: list[str], reference: Any) -> Fidelity:
    from kdnas.evaluation import embedding_fidelity, sentence_embeddings

    cfg = ctx.config
    emb = sentence_embeddings((model.eval(), ctx.teacher.tokenizer), sentences, max_len=cfg.latency.seq)
    return Fidelity.from_attrs(embedding_fidelity(reference, emb, pairs=PAIRS, seed=cfg.seed))
