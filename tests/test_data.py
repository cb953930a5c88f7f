import json

import pytest
import torch

from kdnas.distill import KdnasError, load_corpus, make_transfer_set


def test_news_corpus_is_the_bundled_articles(news_texts):
    assert len(news_texts) > 3700
    assert sum(map(len, news_texts)) > 12_000_000


def test_transfer_set_shapes_padding_and_special_tokens(teacher, small_data):
    tok = teacher.tokenizer
    assert small_data.train_ids.shape == (128, 64) and small_data.eval_ids.shape == (32, 64)
    assert (small_data.train_ids[:, 0] == tok.cls_token_id).all()
    lengths = small_data.train_mask.sum(1)
    last = small_data.train_ids[torch.arange(128), lengths - 1]
    assert (last == tok.sep_token_id).all()
    assert (small_data.train_ids[small_data.train_mask == 0] == tok.pad_token_id).all()
    assert (lengths < 64).any(), "document tails must produce padded rows"


def test_transfer_set_is_deterministic_and_eval_rows_are_held_out(teacher, news_texts, small_data):
    again = make_transfer_set(teacher.tokenizer, news_texts, seq_len=64, num_train=128, num_eval=32, seed=0)
    assert torch.equal(again.train_ids, small_data.train_ids) and again.fingerprint == small_data.fingerprint
    train_rows = {tuple(r.tolist()) for r in small_data.train_ids}
    assert not any(tuple(r.tolist()) in train_rows for r in small_data.eval_ids)
    other = make_transfer_set(teacher.tokenizer, news_texts, seq_len=64, num_train=128, num_eval=32, seed=1)
    assert other.fingerprint != small_data.fingerprint


def test_local_corpus_formats(tmp_path, teacher):
    (tmp_path / "a.txt").write_text("first document here.\n\nsecond document there.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "a json line"}) + "\n")
    (tmp_path / "c.csv").write_text("id,sentence\n1,a csv row\n")
    docs = load_corpus(str(tmp_path))
    assert docs == ["first document here.", "second document there.", "a json line", "a csv row"]


def test_saved_datasets_folder(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["one", "two"], "label": [0, 1]}).save_to_disk(str(tmp_path / "ds"))
    assert load_corpus(str(tmp_path / "ds")) == ["one", "two"]


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "neither a bundled name"),
        (lambda p: (p / "x.txt").write_text("   \n\n  "), "is empty"),
        (lambda p: (p / "x.csv").write_text("id,label\n1,2\n"), "columns found: id, label"),
    ],
)
def test_bad_corpus_errors_name_the_problem(tmp_path, setup, message):
    setup(tmp_path)
    target = tmp_path / ("x.txt" if (tmp_path / "x.txt").exists() else "x.csv" if (tmp_path / "x.csv").exists() else "missing")
    with pytest.raises(KdnasError, match=message):
        load_corpus(str(target))


def test_bad_transfer_set_sizes(teacher, news_texts):
    with pytest.raises(KdnasError, match="sequence length 4 is invalid"):
        make_transfer_set(teacher.tokenizer, news_texts, seq_len=4)
    with pytest.raises(KdnasError, match="too small"):
        make_transfer_set(teacher.tokenizer, ["tiny text"], seq_len=64, num_train=8, num_eval=2)
