"""The untrained baselines a shipped student is measured against (nas.baselines)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from kdnas.distill import ModelDims, StudentSpec, TeacherCache
from kdnas.evaluation.baselines import first_layers_depth
from kdnas.nas.baselines import baseline_fidelity, fidelity_table, fit_line, int8_fidelity
from kdnas.nas.schema import Fidelity, FinalRecord, LatencyRecord, Quality, TeacherInt8


def test_first_layers_depth_is_the_deepest_cut_no_dearer_than_the_student():
    teacher = ModelDims(layers=6, hidden=384, heads=12, ffn=1536)
    same = StudentSpec(layers=3, heads=12, hidden=384, ffn=1536)
    assert first_layers_depth(teacher, same, 128) == 3
    narrow_ffn = StudentSpec(layers=4, heads=12, hidden=384, ffn=768)
    assert first_layers_depth(teacher, narrow_ffn, 128) == 2  # 4 layers at FFN 768 cost less than 3 full ones
    tiny = StudentSpec(layers=1, heads=4, hidden=96, ffn=256)
    assert first_layers_depth(teacher, tiny, 128) == 1  # never below one layer


def test_fidelity_table_ranks_the_teacher_itself_above_the_baselines(teacher, news_texts, small_data):
    from kdnas.nas.config import SearchConfig

    d = teacher.dims
    spec = StudentSpec(layers=2, heads=12, hidden=384, ffn=1536, **teacher.student_sizes())
    ctx = SimpleNamespace(config=SearchConfig.from_flags(quality_sentences=60, latency_seq=64), teacher=teacher, texts=news_texts)
    # The full teacher as "student" (6 layers): perfect fidelity, above both 2-layer baselines.
    table = fidelity_table(ctx, spec, teacher.model, TeacherCache(teacher, small_data), passes=3.0)
    rows = table.fidelity
    assert set(rows) == {"student", "first 2 layers (untrained)", "inherited (untrained)"} and next(iter(rows)) == "student"
    assert table.student.spearman > 0.999 and table.beats_baselines and table.sentences == 60
    # as many rows of its transfer set, decoded: the teacher agrees with itself there too
    trained = table.trained_on
    assert trained.sentences == 60 and trained.passes == 3.0 and trained.spearman > 0.999
    assert rows["first 2 layers (untrained)"].spearman < 0.95
    assert Quality.from_attrs(table.to_attrs()) == table  # stored and read back as it was
    torch.manual_seed(0)
    from transformers import BertModel

    random = BertModel(spec.to_config())
    assert not fidelity_table(ctx, spec, random, TeacherCache(teacher, small_data)).beats_baselines
    assert d.layers == 6


def test_int8_fidelity_scores_the_shipped_graph_on_the_same_sentences(teacher, news_texts, small_data, tmp_path):
    from kdnas.export import export_model
    from kdnas.nas.config import SearchConfig

    spec = StudentSpec(layers=2, heads=12, hidden=384, ffn=1536, **teacher.student_sizes())
    ctx = SimpleNamespace(config=SearchConfig.from_flags(quality_sentences=60, latency_seq=64), teacher=teacher, texts=news_texts)
    prepared = baseline_fidelity(ctx, spec, TeacherCache(teacher, small_data))
    export_model("minilm-l6", tmp_path / "graphs", int8=True)
    # The teacher's own fp32 graph orders the pairs as the teacher does: the graph is fed and pooled as
    # the reference was (tokenizer, length cut, mean pooling). Its INT8 graph loses a little.
    fp32 = int8_fidelity(ctx, prepared.held, tmp_path / "graphs" / "model.onnx")
    int8 = int8_fidelity(ctx, prepared.held, tmp_path / "graphs" / "model.int8.onnx")
    assert fp32.spearman > 0.9999 and fp32.mean_cosine > 0.9999
    assert 0.95 < int8.spearman < fp32.spearman and int8.sentences == 60
    assert int8_fidelity(ctx, None, tmp_path / "graphs" / "model.int8.onnx") is None  # fidelity not asked for


@pytest.mark.slow  # an INT8 export of the teacher, 18 s; the default run's e2e search measures it too (test_search_e2e)
def test_the_teacher_as_int8_is_measured_beside_the_students_on_the_same_sentences(teacher, news_texts):
    from kdnas.core.assets import teacher_path
    from kdnas.export import read_sentence_pipeline
    from kdnas.nas.baselines import teacher_int8
    from kdnas.nas.config import SearchConfig

    timed = []

    def alone(graph):  # the search's judge reads the graph; here a fixed reading, the graph's name kept
        timed.append(graph.name)
        return SimpleNamespace(median_ms=7.5, p90_ms=8.0, min_ms=7.0, cv=0.02, noisy=False, cached=False, cores=(0,),
                               window=(0.0, 1.0))

    ctx = SimpleNamespace(config=SearchConfig.from_flags(quality_sentences=60, latency_seq=64), teacher=teacher,
                          texts=news_texts, judge=SimpleNamespace(alone=alone))
    pipeline = read_sentence_pipeline(teacher_path("minilm-l6"))
    found = teacher_int8(ctx, pipeline)
    assert timed == ["model.int8.onnx"] and found.latency.median_ms == 7.5 and found.sentences == 60
    assert 0.95 < found.fidelity.spearman < 1.0  # INT8 loses a little of the teacher
    assert TeacherInt8.from_attrs(found.to_attrs()) == found  # stored and read back as it was
    ctx.config = SearchConfig.from_flags(quality_sentences=0)
    assert teacher_int8(ctx, pipeline) is None and timed == ["model.int8.onnx"]  # fidelity not asked for


def _quality(own_rho: float, held_rho: float, passes: float | None = 4.0, se: float = 0.003) -> Quality:
    return Quality(fidelity={"student": Fidelity(held_rho, se)},
                   trained_on=Fidelity(own_rho, se, sentences=1000, passes=passes))


def test_fit_line_says_whether_the_student_is_at_home_only_on_its_training_text():
    # a fresh-clone demo's student (measured with a one-off benchmark): 0.967 trained on, 0.912 held out
    short = fit_line(_quality(0.967, 0.912))
    assert short.startswith("on 1000 of its own training rows rho 0.967 (+0.055 over held-out, beyond the noise)")
    assert "more distinct text" in short and "(--final-train)" in short and "(--corpus)" in short
    # with the run's training rows, the advice says how many it had
    assert "(--final-train above this run's 15360 rows)" in fit_line(_quality(0.967, 0.912), rows=15360)
    even = fit_line(_quality(0.914, 0.912))  # 0.002 apart, each ± 0.003
    assert "within the noise" in even and "more text would not lift it" in even
    early = fit_line(_quality(0.95, 0.90, passes=0.4))  # some sampled rows not seen yet: no verdict
    assert "0.4 of a pass" in early and "more distinct text" not in early


def test_fit_line_is_silent_where_the_training_text_was_not_measured():
    assert fit_line(Quality(fidelity={"student": Fidelity(0.9, 0.003)})) is None
    assert fit_line(Quality(skipped="corpus too small")) is None


def _final(ms: float, rho: float, int8_ms: float | None, int8_rho: float | None) -> FinalRecord:
    """A finalist's record as stored (the quality and readings as their JSON), read back."""
    quality = Quality(fidelity={"student": Fidelity(rho)}, int8=None if int8_rho is None else Fidelity(int8_rho))
    return FinalRecord.from_attrs({"trial": 0, "arch": "3x12x384x1536", "dir": "best", "latency_ms": ms,
                                   "quality": quality.to_attrs(),
                                   **({"latency_int8_onnx": {"median_ms": int8_ms}} if int8_ms is not None else {})})


def test_a_student_is_set_against_the_teachers_int8_graph_as_a_user_would_choose():
    from kdnas.nas.baselines import versus_teacher_int8

    teacher = TeacherInt8(LatencyRecord(median_ms=25.6), Fidelity(0.871))
    # MPNet at 0.5x (measured): the teacher's INT8 graph is faster and closer than the fp32 student, not than its INT8 one
    assert "ship the student as INT8" in versus_teacher_int8(_final(29.8, 0.858, 11.8, 0.834), teacher)
    assert "ship it instead" in versus_teacher_int8(_final(29.8, 0.858, 27.0, 0.850), teacher)  # beaten in both forms
    assert "either form" not in versus_teacher_int8(_final(29.8, 0.858, None, None), teacher)
    assert versus_teacher_int8(_final(6.9, 0.836, 3.4, 0.830), teacher).startswith("faster than the teacher as INT8")
    assert versus_teacher_int8(_final(6.9, 0.9, 3.4, 0.89), teacher) == \
        "closer to the teacher than the teacher as INT8 (25.60 ms, rho 0.871), and faster"
    assert versus_teacher_int8(_final(6.9, 0.9, 3.4, 0.89), None) is None  # not measured: nothing said


def test_an_int8_budgeted_student_is_set_against_the_teacher_by_its_fp32_reading_where_one_was_taken():
    from kdnas.nas.baselines import versus_teacher_int8

    teacher = TeacherInt8(LatencyRecord(median_ms=25.6), Fidelity(0.871))
    final = replace(_final(11.8, 0.858, 11.8, 0.834), latency_fp32_onnx=LatencyRecord(29.8))  # latency_ms: the INT8 graph's
    assert "ship the student as INT8" in versus_teacher_int8(final, teacher)


def test_the_held_out_sentences_are_embedded_once_for_every_budget_of_a_search(teacher, news_texts, monkeypatch):
    """The teacher's INT8 graph and each budget's finalists are scored on one set: the teacher's pass over it
    (about 30 s for MPNet) runs once, shared by the per-budget copies of the search's context."""
    import kdnas.evaluation
    from kdnas.nas.budgets import Budget
    from kdnas.nas.baselines import _held_out
    from kdnas.nas.config import SearchConfig
    from kdnas.nas.context import SearchContext

    passes = []
    real = kdnas.evaluation.sentence_embeddings
    monkeypatch.setattr(kdnas.evaluation, "sentence_embeddings", lambda *a, **k: passes.append(1) or real(*a, **k))
    ctx = SearchContext(config=SearchConfig.from_flags(quality_sentences=60, latency_seq=64), space=None, sizes={},
                        teacher=teacher, texts=news_texts, data=None, cache=None, teacher_latency_ms=1.0,
                        budget_ms=2.0, progress=None)
    first = _held_out(ctx.for_budget(Budget(2.0, "2ms")))
    again = _held_out(ctx.for_budget(Budget(1.0, "1ms")))
    assert again is first and len(first.sentences) == 60 and len(passes) == 1


@pytest.mark.parametrize("trained, steps, init, ships_start", [
    (0.895, 20, "inherit", True),  # below its start: the start ships
    (0.917, 20, "inherit", False),  # above it
    (0.916, 20, "inherit", False),  # level: the trained one stands
    (0.895, 0, "inherit", False),  # no step made: it is the start
    (0.895, 20, "svd", False),  # an SVD start is not the inherited row
    (0.895, 20, "continued", False),  # a narrowed wider run's start is not the inherited row either
])
def test_a_student_trained_below_its_untrained_start_does_not_ship_over_it(trained, steps, init, ships_start):
    from kdnas.nas.baselines import START_ROW
    from kdnas.nas.final._train import below_start
    from kdnas.nas.schema import STUDENT

    quality = Quality(fidelity={STUDENT: Fidelity(trained), START_ROW: Fidelity(0.916), "first 2 layers (untrained)":
                                Fidelity(0.80)})
    why = below_start(SimpleNamespace(steps=steps, init={"init": init}), quality)
    assert (why is not None) is ships_start
    if ships_start:
        assert "0.895" in why and "0.916" in why and "20 steps" in why
    assert below_start(SimpleNamespace(steps=20, init={"init": "inherit"}), None) is None  # fidelity not measured


def test_a_student_below_its_untrained_start_ships_that_start(teacher, news_texts, small_data):
    """A run that ended far below where it began (random weights stand for it) ships its inherited start: the
    start's row and the shipped student's are one, its steps stay those trained, and one line says why."""
    from transformers import BertModel

    from kdnas.distill import DistillConfig, DistillResult
    from kdnas.nas.config import SearchConfig
    from kdnas.nas.final._shipping import _scored
    from kdnas.nas.baselines import START_ROW

    spec = StudentSpec(layers=2, heads=12, hidden=384, ffn=1536, **teacher.student_sizes())
    notes: list[str] = []
    ctx = SimpleNamespace(config=SearchConfig.from_flags(quality_sentences=60, latency_seq=64), teacher=teacher,
                          texts=news_texts, progress=SimpleNamespace(note=notes.append))
    torch.manual_seed(0)
    ended = DistillResult(student=BertModel(spec.to_config()), spec=spec, config=DistillConfig(), metrics={},
                          init={"init": "inherit"}, steps=20)
    shipped, quality = _scored(ctx, spec, ended, TeacherCache(teacher, small_data), None, "final")
    assert shipped.student is not ended.student and shipped.steps == 20 and "step" in shipped.metrics
    assert quality.student.spearman == pytest.approx(quality.fidelity[START_ROW].spearman, abs=1e-6)
    assert shipped.init["start_shipped"] in notes[0] and "below its untrained start" in notes[0]
