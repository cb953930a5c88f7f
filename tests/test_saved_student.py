"""A student saved with its transfer set's shape (`DistillResult.save`, as `kdnas distill` saves one) is what
`kdnas evaluate --baselines` and benchmarks/student_quality.py measure, and a start a narrower run goes on from."""

from __future__ import annotations

import json
from pathlib import Path

from kdnas.evaluation.baselines import build_baselines


def save_student(result, data, unit: str, teacher, folder: Path) -> Path:
    """The run's student as a loadable folder with the sentence-transformers modules of its teacher and the
    distill.json fields its baselines are rebuilt from (the transfer set's shape)."""
    from kdnas.core.assets import teacher_path

    transfer = {"train": data.num_train, "eval": data.num_eval, "seq_len": data.seq_len, "unit": unit}
    return result.save(folder, teacher.tokenizer, extra={"transfer_set": transfer},
                       sentence_from=teacher_path(teacher.name))


def test_a_saved_student_loads_as_sentence_transformers_and_its_baselines_rebuild(teacher, news_texts, tmp_path):
    from sentence_transformers import SentenceTransformer

    from kdnas.distill import DistillConfig, distill, make_transfer_set, parse_arch

    data = make_transfer_set(teacher.tokenizer, news_texts, seq_len=32, num_train=64, num_eval=8, seed=0,
                             unit="sentence")
    spec = parse_arch("2x12x384x256", **teacher.student_sizes())
    result = distill(spec, teacher, data, DistillConfig(method="embed", steps=2, batch_size=8, progress=False))
    folder = save_student(result, data, "sentence", teacher, tmp_path / "student")

    record = json.loads((folder / "distill.json").read_text())
    assert record["transfer_set"] == {"train": 64, "eval": 8, "seq_len": 32, "unit": "sentence"}
    assert record["init"]["init"] == "inherit" and record["steps"] == 2
    model = SentenceTransformer(str(folder), device="cpu")
    assert model.encode(["A sentence."]).shape == (1, 384)
    # its untrained start is rebuilt from the record (evaluation.baselines) and checked against it
    built = build_baselines(str(folder), "minilm-l6", "news", 128, root=tmp_path / "work")
    assert [r.name for r in built.refs] == ["first layer (untrained)", "inherited 2x12x384x256 (untrained)"]
    assert built.start.startswith("the inherited baseline is this student's own start")
    # a start that is not the one the record names is said ...
    (folder / "distill.json").write_text(json.dumps({**record, "init": {**record["init"], "teacher_layers": [9]}}))
    assert "differs from the student's record" in build_baselines(str(folder), "minilm-l6", "news", 128,
                                                                  root=tmp_path / "work").start
    # ... while a student trained on from a refused wider finalist (the search's fallback) has its own
    # shape's inheritance as its untrained start, as in the search's table
    continued = {"init": "continued", "from": "2x12x384x512", "after_steps": 2, "narrowed_by": "activation importance"}
    (folder / "distill.json").write_text(json.dumps({**record, "init": continued}))
    again = build_baselines(str(folder), "minilm-l6", "news", 128, root=tmp_path / "work")
    assert again.refs == built.refs and again.start.startswith("the student was trained on from another student "
                                                               "(2x12x384x512, after 2 steps)")
    (folder / "distill.json").write_text(json.dumps({**record, "init": {"init": "random"}}))
    assert build_baselines(str(folder), "minilm-l6", "news", 128, root=tmp_path / "work").start.startswith(
        "the student started from random weights, not inherited")


def test_a_saved_student_narrowed_is_a_start_that_keeps_its_strongest_neurons(teacher, news_texts, tmp_path):
    """Train wide, then narrow: the saved student cut to a narrower FFN continues training."""
    import torch

    from kdnas.distill import DistillConfig, distill, make_transfer_set, narrowed_from, parse_arch

    data = make_transfer_set(teacher.tokenizer, news_texts, seq_len=32, num_train=64, num_eval=8, seed=0,
                             unit="sentence")
    wide_spec, narrow_spec = (parse_arch(a, **teacher.student_sizes()) for a in ("2x12x384x256", "2x12x384x128"))
    wide = distill(wide_spec, teacher, data, DistillConfig(method="embed", steps=2, batch_size=8, progress=False))
    folder = save_student(wide, data, "sentence", teacher, tmp_path / "wide")

    start = narrowed_from(folder, teacher.tokenizer, narrow_spec, *data.split("train"))
    w_in = wide.student.encoder.layer[0].intermediate.dense.weight
    n_in = start.encoder.layer[0].intermediate.dense.weight
    assert n_in.shape == (128, 384)
    # every kept row is one of the wide student's FFN neurons, in their original order
    rows = [int(torch.argmin((w_in - row).abs().sum(1))) for row in n_in]
    assert rows == sorted(rows) and len(set(rows)) == 128
    assert torch.equal(n_in, w_in[rows])
    words = start.embeddings.word_embeddings.weight.detach().clone()
    result = distill(narrow_spec, teacher, data, DistillConfig(method="embed", steps=2, batch_size=8, progress=False),
                     student=start)
    assert result.student.config.intermediate_size == 128
    # by default a given start's word embeddings train; frozen keeps them, as the search's final stage
    # does when it continues a refused finalist
    assert not torch.equal(result.student.embeddings.word_embeddings.weight, words)
    start = narrowed_from(folder, teacher.tokenizer, narrow_spec, *data.split("train"))
    frozen = DistillConfig(method="embed", steps=2, batch_size=8, progress=False,
                           freeze_embeddings=True)
    result = distill(narrow_spec, teacher, data, frozen, student=start)
    assert torch.equal(result.student.embeddings.word_embeddings.weight, words)
