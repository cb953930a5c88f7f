"""export/: real exports of a tiny student and the bundled teachers, parity, fusion, INT8, bad input."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from kdnas.core.errors import KdnasError
from kdnas.core.spec import StudentSpec, build_student
from kdnas.export import export_model
from kdnas.export import _parity

TINY = StudentSpec(layers=2, heads=4, hidden=64, ffn=128)


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    """A random-weight student saved the way transformers saves any model, with the teacher's tokenizer."""
    from transformers import AutoTokenizer

    from kdnas.core.assets import teacher_path

    folder = tmp_path_factory.mktemp("student")
    build_student(TINY, seed=0).save_pretrained(folder)
    AutoTokenizer.from_pretrained(teacher_path("minilm-l6")).save_pretrained(folder)
    return folder


def _run(path, batch):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in batch.items() if k in names})


def test_tiny_student_export_parity_fusion_int8(student_dir, tmp_path):
    out = tmp_path / "onnx"
    report = export_model(student_dir, out, int8=True)

    assert report.parity.passed and report.parity.max_abs <= 1e-4
    assert report.parity.cosine > 0.9999
    assert len(set(report.parity.lengths)) > 3  # several lengths, padded in shared batches
    assert report.attention_fused
    assert report.fused["Attention"] == 2 and report.fused["SkipLayerNormalization"] > 0
    assert report.fused["EmbedLayerNormalization"] == 1
    assert report.fused["BiasGelu"] + report.fused["Gelu"] + report.fused["FastGelu"] > 0
    assert report.int8_cosine is not None and report.int8_mean_cosine >= 0.99 and report.int8_cosine >= 0.98
    assert report.inputs == ("input_ids", "attention_mask", "token_type_ids")

    files = {p.name for p in out.iterdir()}
    assert {"model.onnx", "model.int8.onnx", "config.json", "export.json", "tokenizer.json"} <= files
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["parity"]["max_abs"] == report.parity.max_abs
    assert manifest["fused"] == report.fused and manifest["opset"] == 17
    # The embedding tables (most of a small student's weights) are int8 too: about a quarter of the file.
    assert manifest["sizes"]["model.int8.onnx"] < 0.4 * manifest["sizes"]["model.onnx"]
    assert {"torch", "onnxruntime", "onnx", "transformers"} <= set(manifest["versions"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind

    # Dynamic axes: a batch size and length the export never saw, from the shipped folder alone.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    batch = dict(tok(["one", "two sentences of which this one is longer", "three"], padding=True, return_tensors="np"))
    hidden, embedding = _run(out / "model.onnx", batch)
    assert hidden.shape == (3, batch["input_ids"].shape[1], 64) and embedding.shape == (3, 64)
    q_hidden, q_embedding = _run(out / "model.int8.onnx", batch)
    assert q_embedding.shape == embedding.shape
    # The default recipe quantizes the fused attention too (QAttention): that is where the speed is.
    ops = Counter(node.op_type for node in onnx.load(str(out / "model.int8.onnx")).graph.node)
    assert ops["QAttention"] == 2 and ops["Attention"] == 0 and ops["DynamicQuantizeMatMul"] + ops["MatMulInteger"] > 0
    assert ops["QEmbedLayerNormalization"] == 1 and ops["EmbedLayerNormalization"] == 0
    from kdnas.export import int8_range

    weights = "full 8-bit range (VNNI CPUs only)" if int8_range()[0] else "int8 weights in a 7-bit range"
    assert manifest["int8_recipe"].startswith("dynamic, per-channel int8 weights") and weights in manifest["int8_recipe"]
    assert manifest["int8_recipe"].endswith("attention quantized too, embedding tables int8")

    # Exporting again into the same folder replaces the earlier export.
    again = export_model(student_dir, out, optimize=False, opset=14)
    assert not again.optimized and again.opset == 14 and again.parity.passed
    assert not (out / "model.int8.onnx").exists()


def test_bundled_teacher_minilm(tmp_path):
    report = export_model("minilm-l6", tmp_path / "teacher", int8=True)
    assert report.arch == "6x12x384x1536"
    assert report.parity.max_abs <= 1e-4 and report.parity.cosine > 0.99999
    assert report.attention_fused and report.fused["Attention"] == 6
    assert report.fused["SkipLayerNormalization"] == 12
    # INT8 quality on real sentences (per-channel weights, attention quantized too).
    assert report.int8_mean_cosine >= 0.99 and report.int8_cosine >= 0.98, report.to_dict()
    assert not report.warnings


def test_int8_fp32_attention_option_and_quality_warning(student_dir, tmp_path, monkeypatch):
    # Asking for fp32 attention keeps the fused Attention node; a mean cosine under the threshold warns
    # (threshold raised to 1.0 here, so any real quantization error trips it) and says so in export.json.
    monkeypatch.setattr(_parity, "INT8_MEAN_COSINE", 1.0)
    with pytest.warns(UserWarning, match="INT8 quality: mean cosine"):
        report = export_model(student_dir, tmp_path / "onnx", int8=True, int8_fp32_attention=True)
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "onnx" / "model.int8.onnx")).graph.node)
    assert ops["Attention"] == 2 and ops["QAttention"] == 0
    assert report.int8_recipe.endswith("fused attention fp32, embedding tables int8")
    assert any("INT8 quality" in w for w in json.loads((tmp_path / "onnx" / "export.json").read_text())["warnings"])


def test_int8_embedding_tables(student_dir, tmp_path):
    # --int8-fp32-embeddings keeps the fused embedding node and its fp32 tables (a larger file).
    kept = export_model(student_dir, tmp_path / "kept", int8=True, int8_fp32_embeddings=True)
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "kept" / "model.int8.onnx")).graph.node)
    assert ops["EmbedLayerNormalization"] == 1 and ops["QEmbedLayerNormalization"] == 0 and ops["QAttention"] == 2
    assert kept.int8_recipe.endswith("attention quantized too, embedding tables fp32")
    assert kept.sizes["model.int8.onnx"] > 0.8 * kept.sizes["model.onnx"]
    # In a plain (unfused) graph each table is read by a Gather: the tables it reads are stored int8.
    plain = export_model(student_dir, tmp_path / "plain", int8=True, optimize=False)
    graph = onnx.load(str(tmp_path / "plain" / "model.int8.onnx")).graph
    tables = {t.name: t.data_type for t in graph.initializer if len(t.dims) == 2}
    read = [tables[n.input[0]] for n in graph.node if n.op_type == "Gather" and n.input[0] in tables]
    assert len(read) >= 2 and set(read) <= {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}, read
    assert plain.int8_mean_cosine >= 0.99 and plain.sizes["model.int8.onnx"] < 0.4 * plain.sizes["model.onnx"]


def _quantized_weight_range(path) -> tuple[int, int]:
    """The lowest and highest int8 weight that a MatMulInteger or QAttention node multiplies by."""
    graph = onnx.load(str(path)).graph
    tables = {t.name: t for t in graph.initializer}
    weights = [onnx.numpy_helper.to_array(tables[n.input[1]]) for n in graph.node
               if n.op_type in ("MatMulInteger", "QAttention") and n.input[1] in tables]
    assert weights and all(w.dtype == np.int8 for w in weights)
    return min(int(w.min()) for w in weights), max(int(w.max()) for w in weights)


def test_int8_weights_use_seven_bits_unless_the_cpu_has_vnni_or_full_range_is_asked_for(student_dir, tmp_path):
    # Full-range int8 weights saturate onnxruntime's int16 sums on x86 CPUs without VNNI (an MPNet
    # student's INT8 graph fell to mean cosine 0.51 to its fp32 graph): there weights stay in 7 bits.
    from kdnas.core.host import int8_extensions
    from kdnas.export import int8_range

    seven = export_model(student_dir, tmp_path / "seven", int8=True, int8_full_range=False)
    low, high = _quantized_weight_range(tmp_path / "seven" / "model.int8.onnx")
    assert -64 <= low and high <= 64 and high - low > 100
    assert "7-bit" in seven.int8_recipe and seven.int8_full_range is False
    full = export_model(student_dir, tmp_path / "full", int8=True, int8_full_range=True)
    low, high = _quantized_weight_range(tmp_path / "full" / "model.int8.onnx")
    assert low < -100 or high > 100
    assert "full 8-bit range" in full.int8_recipe and "full 8-bit range" in (tmp_path / "full" / "export.json").read_text()
    # by default the range is this CPU's, and export.json says why
    default = export_model(student_dir, tmp_path / "default", int8=True)
    assert default.int8_full_range is bool(int8_extensions()) is int8_range()[0]
    manifest = json.loads((tmp_path / "default" / "export.json").read_text())
    assert manifest["int8_full_range"] is default.int8_full_range and manifest["int8_range_reason"]
    assert ("VNNI" in manifest["int8_range_reason"]) is (not default.int8_full_range)


def test_a_graph_with_segment_ids_runs_from_a_tokenizer_that_gives_none(student_dir, tmp_path):
    """A graph that takes token_type_ids from a tokenizer that makes none (a BERT under an MPNet-style
    tokenizer): they are zeros, as BertModel makes them, so it embeds a sentence as with a BERT tokenizer's ids."""
    from functools import partial

    from transformers import AutoTokenizer

    from kdnas.export import onnx_sentence_embeddings

    export_model(student_dir, tmp_path / "onnx")
    graph, tokenizer = tmp_path / "onnx" / "model.onnx", AutoTokenizer.from_pretrained(student_dir)
    without = partial(tokenizer, return_token_type_ids=False)
    assert "token_type_ids" not in without(["a"]) and "token_type_ids" in tokenizer(["a"])
    texts = list(_parity.SENTENCES)
    np.testing.assert_array_equal(onnx_sentence_embeddings(graph, without, texts, batch_size=3),
                                  onnx_sentence_embeddings(graph, tokenizer, texts, batch_size=3))
    feed = _parity.graph_feed(without(texts[:2], padding=True), {"input_ids", "attention_mask"})
    assert set(feed) == {"input_ids", "attention_mask"} and feed["input_ids"].dtype == np.int64


@pytest.mark.slow
def test_bundled_teacher_mpnet(tmp_path):
    with pytest.warns(UserWarning, match="ATTENTION NOT FUSED"):
        report = export_model("mpnet-base", tmp_path / "mpnet")
    assert report.inputs == ("input_ids", "attention_mask")  # MPNet has no token_type_ids
    assert report.parity.max_abs <= 1e-4
    # onnxruntime's optimizer has no MPNet attention pattern (relative position bias): said plainly.
    assert not report.attention_fused and "ATTENTION NOT FUSED" in report.fusion
    assert report.fused["SkipLayerNormalization"] > 0


def test_parity_failure_writes_nothing(student_dir, tmp_path, monkeypatch):
    # A tolerance no float32 export meets: the real comparison must refuse the export.
    monkeypatch.setattr(_parity, "FP32_MAX_ABS", 0.0)
    with pytest.raises(KdnasError, match="parity check failed: .*max-abs"):
        export_model(student_dir, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_parity_compare_uses_only_unpadded_positions():
    mask = np.array([[1, 1, 0]])
    ref_h = np.zeros((1, 3, 2), np.float32)
    cand_h = ref_h.copy()
    cand_h[0, 2] = 5.0  # a padded position: ignored
    cand_h[0, 1, 0] = 2e-4
    emb = np.array([[1.0, 0.0]], np.float32)
    parity = _parity.compare([(ref_h, emb)], [(cand_h, emb * 3)], [{"attention_mask": mask}], 1e-4)
    assert parity.max_abs == pytest.approx(2e-4) and not parity.passed
    assert parity.cosine == pytest.approx(1.0) and parity.lengths == (2,)


def test_bad_inputs(student_dir, tmp_path):
    with pytest.raises(KdnasError, match="not a folder or a bundled teacher"):
        export_model(tmp_path / "missing", tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(KdnasError, match="no config.json"):
        export_model(tmp_path / "empty", tmp_path / "b")
    with pytest.raises(KdnasError, match="opset 9 is not supported"):
        export_model(student_dir, tmp_path / "c", opset=9)
    with pytest.raises(KdnasError, match="^--int8-fp32-attention chooses .* add --int8"):
        export_model(student_dir, tmp_path / "e", int8_fp32_attention=True)
    with pytest.raises(KdnasError, match="^--int8-fp32-embeddings chooses .* add --int8"):
        export_model(student_dir, tmp_path / "e", int8_fp32_embeddings=True)
    with pytest.raises(KdnasError, match="no tokenizer"):
        export_model(TINY, tmp_path / "d")  # a spec has no tokenizer of its own
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(KdnasError, match="not an earlier kdnas export"):
        export_model(student_dir, tmp_path / "busy")
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.txt"]
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(KdnasError, match="a-file is a file, not a folder"):  # before the model loads
        export_model(student_dir, tmp_path / "a-file" / "sub")
    # A model with fewer positions than the graph is traced at: one line, and no folders made on the way.
    short = tmp_path / "short"
    build_student(StudentSpec(layers=1, heads=4, hidden=64, ffn=128, max_position=6)).save_pretrained(short)
    with pytest.raises(KdnasError, match="takes 6 tokens .* at least 8"):
        export_model(short, tmp_path / "new" / "deeper", tokenizer=student_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "busy", "empty", "short"]


def test_a_model_with_few_positions_is_checked_at_its_own_length(student_dir, tmp_path):
    """Parity sentences are cut to the model's positions (here 12; the check sentences run to 49 tokens): the export of
    such a model used to fail with a tensor-size traceback."""
    short = tmp_path / "short"
    build_student(StudentSpec(layers=1, heads=4, hidden=64, ffn=128, max_position=12)).save_pretrained(short)
    report = export_model(short, tmp_path / "graph", tokenizer=student_dir)
    assert report.parity.passed and max(report.parity.lengths) == 12


def test_cli_export(student_dir, tmp_path, capsys):
    from kdnas.cli import main

    assert main(["export", str(student_dir), "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert "max-abs" in out and "attention fused in all 2 layers" in out
    assert (tmp_path / "cli" / "model.onnx").is_file()

    for argv in (["export", str(tmp_path / "nope"), "--out", str(tmp_path / "x")],
                 ["export", str(student_dir), "--out", str(tmp_path / "y"), "--opset", "99"],
                 ["export", str(student_dir), "--out", str(tmp_path / "z"), "--int8-fp32-embeddings"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("kdnas export: error:") and err.count("\n") == 1
    assert not any((tmp_path / name).exists() for name in "xyz")
