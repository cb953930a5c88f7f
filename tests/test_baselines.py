"""The untrained baselines a shipped student is measured against (nas.baselines)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from distill import ModelDims, StudentSpec, TeacherCache
from nas.baselines import fidelity_table, first_layers_depth


def test_first_layers_depth_is_the_deepest_cut_no_dearer_than_the_student():
    teacher = ModelDims(layers=6, hidden=384, heads=12, ffn=1536)
    same = StudentSpec(layers=3, heads=12, hidden=384, ffn=1536)
    assert first_layers_depth(teacher, same, 128) == 3
    narrow_ffn = StudentSpec(layers=4, heads=12, hidden=384, ffn=768)
    assert first_layers_depth(teacher, narrow_ffn, 128) == 2  # 4 layers at FFN 768 cost less than 3 full ones
    tiny = StudentSpec(layers=1, heads=4, hidden=96, ffn=256)
    assert first_layers_depth(teacher, tiny, 128) == 1  # never below one layer


def test_fidelity_table_ranks_the_teacher_itself_above_the_baselines(teacher, news_texts, small_data):
    from nas.config import SearchConfig

    d = teacher.dims
    spec = StudentSpec(layers=2, heads=12, hidden=384, ffn=1536, **teacher.student_sizes())
    ctx = SimpleNamespace(config=SearchConfig(quality_sentences=60, latency_seq=64), teacher=teacher, texts=news_texts)
    # The full teacher as "student" (6 layers): perfect fidelity, above both 2-layer baselines.
    table = fidelity_table(ctx, spec, teacher.model, TeacherCache(teacher, small_data))
    rows = table["fidelity"]
    assert set(rows) == {"student", "first 2 layers (untrained)", "inherited (untrained)"}
    assert rows["student"]["spearman"] > 0.999 and table["beats_baselines"]
    assert rows["first 2 layers (untrained)"]["spearman"] < 0.95
    torch.manual_seed(0)
    from transformers import BertModel

    random = BertModel(spec.to_config())
    assert not fidelity_table(ctx, spec, random, TeacherCache(teacher, small_data))["beats_baselines"]
    assert d.layers == 6
