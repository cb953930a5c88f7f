"""Teacher-inherited students (distill.inherit): exact at the teacher's shape, useful when pruned."""

from __future__ import annotations

import pytest
import torch

from kdnas.distill import DistillConfig, StudentSpec, TeacherCache, distill
from kdnas.core.errors import KdnasError
from kdnas.distill.inherit import inherit_reason, inherit_student, plan, select_layers
from kdnas.evaluation import embedding_fidelity, sentence_embeddings

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def importance(teacher, small_data):
    return TeacherCache(teacher, small_data).importance(rows=64)


@pytest.fixture(scope="module")
def sentences(news_texts):
    from kdnas.distill.data import heldout_sentences

    return heldout_sentences(news_texts, 160, seed=0)


def _spec(teacher, layers, heads, hidden, ffn) -> StudentSpec:
    return StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **teacher.student_sizes())


def test_the_teachers_own_shape_reproduces_the_teacher(teacher, small_data, importance):
    d = teacher.dims
    student, chosen = inherit_student(teacher, _spec(teacher, d.layers, d.heads, d.hidden, d.ffn), importance, "bi")
    assert chosen.layers == tuple(range(d.layers)) and chosen.q_scale == 1.0
    ids, mask = small_data.split("eval")
    with torch.no_grad():
        want = teacher.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = student(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (want - got)[mask.bool()].abs().max().item() <= 1e-5


@pytest.mark.parametrize("rule, want", [("first", (0, 1, 2)), ("even", (0, 2, 5))])
def test_layer_rules(rule, want):
    assert select_layers(rule, 6, 3) == want
    assert select_layers(rule, 6, 6) == tuple(range(6))


def test_block_influence_keeps_the_layers_that_change_the_states_most():
    assert select_layers("bi", 6, 2, (0.1, 0.5, 0.2, 0.05, 0.4, 0.3)) == (1, 4)
    with pytest.raises(KdnasError, match="layer rule 'deep' is invalid"):
        select_layers("deep", 6, 2)


def test_heads_of_another_size_group_teacher_heads_and_keep_the_score_scale(teacher, importance):
    # 4 heads of 96 = 3 teacher heads (size 32) each; 6 heads of 16 = half of a teacher head each.
    wide = plan(teacher, _spec(teacher, 2, 4, 384, 768), importance)
    assert [len(rows) for rows in wide.qk] == [384, 384] and len(set(wide.qk[0])) == 384
    assert wide.q_scale == pytest.approx(3 ** 0.5)
    narrow = plan(teacher, _spec(teacher, 2, 6, 96, 256), importance)
    assert len(narrow.qk[0]) == 96 and len(narrow.neurons[0]) == 256 and len(narrow.channels) == 96
    assert narrow.q_scale == pytest.approx(0.5 ** 0.5)
    for head in range(6):  # each student head reads 16 dimensions of one teacher head
        rows = narrow.qk[0][16 * head : 16 * (head + 1)]
        assert len({r // 32 for r in rows}) == 1


def test_a_pruned_student_before_training_is_far_better_than_random(teacher, importance, sentences):
    spec = _spec(teacher, 3, 6, 288, 768)
    inherited, _ = inherit_student(teacher, spec, importance, "even")
    torch.manual_seed(0)
    from transformers import BertModel

    random = BertModel(spec.to_config())
    t = sentence_embeddings(teacher, sentences, max_len=64)
    kept = embedding_fidelity(t, sentence_embeddings((inherited, teacher.tokenizer), sentences, max_len=64), pairs=2000)
    rand = embedding_fidelity(t, sentence_embeddings((random, teacher.tokenizer), sentences, max_len=64), pairs=2000)
    assert kept["spearman"] > rand["spearman"] + 0.2, (kept, rand)


@pytest.mark.parametrize("shape, words", [
    ((7, 12, 384, 1536), "layers=7 exceeds the teacher's 6"),
    ((2, 12, 768, 1536), "hidden=768 exceeds the teacher's 384"),
    ((2, 12, 384, 3072), "ffn=3072 exceeds the teacher's 1536"),
])
def test_a_student_larger_than_its_teacher_cannot_inherit(teacher, shape, words):
    assert words in inherit_reason(teacher, _spec(teacher, *shape))


def test_the_trainer_falls_back_to_svd_with_a_notice(teacher, small_data, capsys):
    config = DistillConfig(method="hs", steps=1, batch_size=4, init="inherit", progress=False)
    deeper = distill(_spec(teacher, 7, 12, 384, 256), teacher, small_data, config)
    assert deeper.init["init"] == "svd" and "layers=7 exceeds the teacher's 6" in deeper.init["note"]
    assert "init inherit is not possible for 7x12x384x256 (" in capsys.readouterr().err
    wider = distill(_spec(teacher, 1, 12, 768, 256), teacher, small_data, config)
    assert wider.init["init"] == "random" and "hidden=768 exceeds the teacher's 384" in wider.init["note"]
    inherited = distill(_spec(teacher, 2, 6, 192, 512), teacher, small_data, config)
    assert inherited.init == {"init": "inherit", "layer_rule": "even", "teacher_layers": [1, 6],
                              "hidden_kept": 192, "q_scale": inherited.init["q_scale"]}


@pytest.mark.slow
def test_an_mpnet_teacher_gives_mpnet_students(news_texts, tmp_path):
    """The bundled MPNet: at its full shape the student is the teacher (relative position bias included);
    a pruned student is an MPNetModel far from random, and its graph embeds a sentence as it does."""
    from kdnas.distill import load_teacher, make_transfer_set

    mpnet = load_teacher("mpnet-base")
    data = make_transfer_set(mpnet.tokenizer, news_texts, seq_len=64, num_train=64, num_eval=8, seed=0)
    importance = TeacherCache(mpnet, data).importance(rows=64)
    d = mpnet.dims
    full, _ = inherit_student(mpnet, _spec(mpnet, d.layers, d.heads, d.hidden, d.ffn), importance, "even")
    ids, mask = data.split("eval")
    with torch.no_grad():
        want = mpnet.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = full.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert type(full).__name__ == "MPNetModel" and (want - got)[mask.bool()].abs().max().item() <= 1e-5
    del full
    spec = _spec(mpnet, 4, 12, 384, 1536)
    student, chosen = inherit_student(mpnet, spec, importance, "even")
    assert chosen.layers == (0, 4, 7, 11) and student.config.layer_norm_eps == mpnet.model.config.layer_norm_eps
    assert student.config.model_type == "mpnet" and len(chosen.bias_heads) == 12
    sentences = [s for s in news_texts[:40]]
    t = sentence_embeddings(mpnet, sentences, max_len=64)
    s = sentence_embeddings((student.eval(), mpnet.tokenizer), sentences, max_len=64)
    from kdnas.core.spec import build_student

    r = sentence_embeddings((build_student(spec, seed=0).eval(), mpnet.tokenizer), sentences, max_len=64)
    assert embedding_fidelity(t, s, pairs=500)["spearman"] > embedding_fidelity(t, r, pairs=500)["spearman"] + 0.2
    # MPNet has no segment embeddings, so the graph takes no token_type_ids; onnxruntime's optimizer has
    # no MPNet attention pattern (the bias), so attention stays unfused, and the export says so.
    from kdnas.export import export_model, onnx_sentence_embeddings

    report = export_model(student, tmp_path / "graph", tokenizer=mpnet.tokenizer)
    assert report.inputs == ("input_ids", "attention_mask") and not report.attention_fused
    graph = onnx_sentence_embeddings(tmp_path / "graph" / "model.onnx", mpnet.tokenizer, sentences, max_len=64)
    assert abs(graph - s.numpy()).max() < 1e-4


def test_a_pruned_students_embed_projection_starts_as_its_channel_selection(teacher, small_data):
    from kdnas.distill.methods import build_method
    from kdnas.distill.trainer import spec_dims

    spec = _spec(teacher, 1, 6, 192, 256)
    chosen = plan(teacher, spec, TeacherCache(teacher, small_data).importance(rows=32))
    selection = chosen.selection(teacher.dims.hidden)
    assert selection.shape == (192, 384) and torch.equal(selection.sum(1), torch.ones(192))
    assert torch.equal(selection.argmax(1), torch.tensor(chosen.channels))
    method = build_method("embed", teacher.dims, spec_dims(spec))
    method.align_to(selection)
    states = torch.randn(2, 3, 192)
    assert torch.equal(method.projection(states)[..., list(chosen.channels)], states)


def test_a_trained_student_is_narrowed_as_a_teacher_is(teacher, small_data, importance):
    from kdnas.distill import narrowed

    ids, mask = small_data.split("train")
    ids, mask = ids[:32], mask[:32]
    source, _ = inherit_student(teacher, _spec(teacher, 2, 12, 384, 1024), importance)
    # At its own shape the narrowed model is the model.
    same, _ = narrowed(source, teacher.tokenizer, _spec(teacher, 2, 12, 384, 1024), ids, mask)
    with torch.no_grad():
        want = source(input_ids=ids, attention_mask=mask).last_hidden_state
        got = same(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (want - got)[mask.bool()].abs().max().item() <= 1e-5
    # Narrower FFN: every layer keeps its most active neurons, in order, with their weights.
    small, chosen = narrowed(source, teacher.tokenizer, _spec(teacher, 2, 12, 384, 512), ids, mask)
    assert chosen.layers == (0, 1)
    for j, neurons in enumerate(chosen.neurons):
        assert len(neurons) == 512 and list(neurons) == sorted(neurons)
        kept = source.encoder.layer[j].intermediate.dense.weight[list(neurons)]
        assert torch.equal(small.encoder.layer[j].intermediate.dense.weight, kept)
    with pytest.raises(KdnasError, match="cannot narrow 2 layers to 1x12x384x512"):
        narrowed(source, teacher.tokenizer, _spec(teacher, 1, 12, 384, 512), ids, mask)
