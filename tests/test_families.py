"""Students in the teacher's own family (core.families): for a tiny random teacher of every supported
family, built from a config (no download), inheritance at the full shape is the teacher, a pruned student
is the teacher's class, and its shipped folder exports with parity and loads as a sentence-transformers
drop-in that agrees with its ONNX graph. A teacher of another family is one line naming the supported ones."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kdnas.core.assets import teacher_path  # noqa: E402
from kdnas.core.errors import InputError  # noqa: E402
from kdnas.core.families import FAMILIES  # noqa: E402
from kdnas.core.spec import StudentSpec, build_student  # noqa: E402
from kdnas.distill import load_teacher  # noqa: E402
from kdnas.distill.inherit import inherit_reason, inherit_student, measure_importance  # noqa: E402

torch.set_num_threads(2)

SENTENCES = ["Stocks fell sharply on Monday.", "The central bank left interest rates unchanged.",
             "Is it raining in Berlin?", "A short one."]
# hidden 64 in 8 heads of 8, 3 layers: small enough to build in a second, shaped like an encoder.
TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=8, intermediate_size=128)


def _tiny_teacher(folder: Path, model_type: str) -> Path:
    """A random teacher of `model_type` saved as a folder, with a real tokenizer of its kind (MPNet's for
    MPNet, BERT's WordPiece for the others; the pad id in the config is the tokenizer's)."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(teacher_path("mpnet-base" if model_type == "mpnet" else "minilm-l6"))
    family = FAMILIES[model_type]
    extra = {"type_vocab_size": 2} if model_type in ("bert", "electra") else {}
    if model_type == "electra":
        extra["embedding_size"] = TINY["hidden_size"]
    config = getattr(transformers, family.config_class)(
        vocab_size=len(tok), pad_token_id=tok.pad_token_id, layer_norm_eps=1e-5,
        max_position_embeddings=130 + (tok.pad_token_id + 1 if family.offset_positions else 0), **TINY, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, family.model_class)(config).eval()
    with torch.no_grad():  # LayerNorm weights away from 1/0 so slicing them is checked
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
        if family.shared_position_bias:
            model.encoder.relative_attention_bias.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_teacher(request, tmp_path_factory):
    folder = _tiny_teacher(tmp_path_factory.mktemp(request.param), request.param)
    teacher = load_teacher(str(folder))
    batch = teacher.tokenizer(SENTENCES * 4, padding=True, return_tensors="pt")
    importance = measure_importance(teacher, batch["input_ids"], batch["attention_mask"])
    return request.param, folder, teacher, importance


def _spec(teacher, layers, heads, hidden, ffn) -> StudentSpec:
    return StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **teacher.student_sizes())


def _states(model, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    return out, batch["attention_mask"].bool()


def test_the_full_shape_is_the_teacher_in_its_own_class(family_teacher):
    model_type, _, teacher, importance = family_teacher
    d = teacher.dims
    spec = _spec(teacher, d.layers, d.heads, d.hidden, d.ffn)
    assert spec.family == model_type
    student, chosen = inherit_student(teacher, spec, importance, "first")
    assert type(student).__name__ == FAMILIES[model_type].model_class
    assert spec.num_parameters() == sum(p.numel() for p in student.parameters())
    want, mask = _states(teacher.model, teacher.tokenizer)
    got, _ = _states(student, teacher.tokenizer)
    assert (want - got)[mask].abs().max().item() <= 1e-5
    if FAMILIES[model_type].shared_position_bias:  # the bias travels with its heads, one order in every layer
        assert sorted(chosen.bias_heads) == list(range(d.heads)) and len(set(chosen.qk)) == 1


def test_a_pruned_student_keeps_the_family_and_its_shared_heads(family_teacher):
    model_type, _, teacher, importance = family_teacher
    spec = _spec(teacher, 2, 4, 32, 96)  # half the heads, half the width: heads of the teacher's size
    student, chosen = inherit_student(teacher, spec, importance, "even")
    assert student.config.model_type == model_type and student.config.num_hidden_layers == 2
    assert spec.num_parameters() == sum(p.numel() for p in student.parameters())
    if FAMILIES[model_type].shared_position_bias:
        heads_per_layer = {tuple(r // 8 for r in rows[::8]) for rows in chosen.qk}
        assert heads_per_layer == {chosen.bias_heads}  # the same teacher heads, in the same order, in each layer
        bias = teacher.model.encoder.relative_attention_bias.weight[:, list(chosen.bias_heads)]
        assert torch.equal(student.encoder.relative_attention_bias.weight, bias)
    out, mask = _states(student, teacher.tokenizer)
    assert torch.isfinite(out[mask]).all()


def test_the_shipped_folder_exports_and_loads_as_a_sentence_transformer(family_teacher, tmp_path):
    from sentence_transformers import SentenceTransformer

    from kdnas.core.sentence import write_sentence_transformers
    from kdnas.export import export_model

    model_type, _, teacher, importance = family_teacher
    student, _ = inherit_student(teacher, _spec(teacher, 2, 4, 32, 96), importance, "even")
    folder = tmp_path / "best"
    report = export_model(student, folder, tokenizer=teacher.tokenizer, int8=True, pooling="mean", normalize=True)
    student.save_pretrained(folder)
    write_sentence_transformers(folder, None, hidden_size=32)
    assert report.model_type == model_type and report.parity.passed
    assert report.int8_mean_cosine is not None
    st = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    assert type(st[0].auto_model).__name__ == FAMILIES[model_type].model_class
    want = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)
    batch = teacher.tokenizer(SENTENCES, padding=True, return_tensors="np")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: batch[i.name].astype(np.int64) if i.name in batch else np.zeros_like(batch["input_ids"])
             for i in session.get_inputs()}
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))["sentence_embedding"]
    assert np.abs(got - want).max() <= 1e-4


def test_a_random_student_of_each_family_builds_in_that_family():
    for model_type, family in FAMILIES.items():
        spec = StudentSpec(layers=1, heads=2, hidden=16, ffn=32, vocab_size=100, max_position=40,
                           pad_token_id=1, family=model_type)
        model = build_student(spec)
        assert type(model).__name__ == family.model_class
        assert model.config.max_position_embeddings == 40 + (2 if family.offset_positions else 0)
        assert spec.num_parameters() == sum(p.numel() for p in model.parameters())


def test_a_student_of_another_family_or_an_unknown_one_is_refused(family_teacher):
    model_type, _, teacher, _ = family_teacher
    other = "bert" if model_type != "bert" else "mpnet"
    sizes = {**teacher.student_sizes(), "family": other}
    spec = StudentSpec(layers=1, heads=8, hidden=64, ffn=128, **sizes)
    assert "cannot inherit from a" in inherit_reason(teacher, spec)
    with pytest.raises(InputError, match="student family 'deberta' is invalid; supported: bert, mpnet"):
        StudentSpec(layers=1, heads=2, hidden=16, ffn=32, family="deberta")


def test_a_distilbert_teacher_gets_a_bert_student_and_inherit_names_the_supported_families(tmp_path):
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

    tok = AutoTokenizer.from_pretrained(teacher_path("minilm-l6"))
    DistilBertModel(DistilBertConfig(vocab_size=len(tok), dim=32, hidden_dim=64, n_layers=2, n_heads=4)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    teacher = load_teacher(str(tmp_path))
    spec = StudentSpec(layers=1, heads=4, hidden=32, ffn=64, **teacher.student_sizes())
    assert spec.family == "bert"
    reason = inherit_reason(teacher, spec)
    assert "'distilbert' has no weight map (supported: bert, mpnet, roberta" in reason


@pytest.fixture(scope="module")
def other_families(tmp_path_factory) -> dict[str, Path]:
    """Tiny DistilBERT and DeBERTa teacher folders: families no student class is built in."""
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2Model, DistilBertConfig, DistilBertModel

    tok = AutoTokenizer.from_pretrained(teacher_path("minilm-l6"))
    folders = {}
    for name, model in (("distilbert", DistilBertModel(DistilBertConfig(vocab_size=len(tok), dim=32, hidden_dim=64,
                                                                          n_layers=2, n_heads=4))),
                        ("deberta-v2", DebertaV2Model(DebertaV2Config(vocab_size=len(tok), hidden_size=32,
                                                                      num_hidden_layers=2, num_attention_heads=4,
                                                                      intermediate_size=64)))):
        folders[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(folders[name])
        tok.save_pretrained(folders[name])
    return folders


@pytest.mark.parametrize("command", ["search", "distill"])
def test_a_teacher_of_another_family_is_one_line_and_writes_nothing(other_families, command, tmp_path, capsys):
    import kdnas.cli

    for model_type, folder in other_families.items():
        out = tmp_path / f"{command}-{model_type}"
        extra = ["--arch", "1x4x32x64", "--quiet"] if command == "distill" else ["--no-progress"]
        assert kdnas.cli.main([command, "--teacher", str(folder), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"'{model_type}'" in err and "bert, " in err, err
        assert not out.exists()


def test_the_parameter_count_of_a_model_folder_follows_its_family(family_teacher):
    from kdnas.evaluation.models import ModelRef, count_parameters

    _, folder, teacher, _ = family_teacher
    assert count_parameters(ModelRef(name="t", path=str(folder), fingerprint="")) == \
        sum(p.numel() for p in teacher.model.parameters())
