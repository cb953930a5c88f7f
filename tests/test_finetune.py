"""Fine-tuning and scoring: metrics, a real tiny fine-tune that beats the majority class, caching."""

from __future__ import annotations

import pytest
import torch

from kdnas.core.errors import KdnasError
from kdnas.evaluation.finetune import FinetuneConfig, accuracy_and_f1, evaluate_model, finetune_once, protocol_splits
from kdnas.evaluation.models import resolve_model
from kdnas.evaluation.report import evaluate, format_table
from kdnas.evaluation.tasks import load_task

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def topic():
    return load_task("topic")


# Topic from the first 32 tokens (headline + lead) with 240 training examples, 2 epochs.
TINY = FinetuneConfig(lr=2e-4, batch_size=16, epochs=2, max_len=32, train_size=240, eval_size=150, seeds=(0,),
                      progress=False)


def test_gain_kept_is_zero_at_the_majority_class():
    from kdnas.evaluation.report import gain_kept

    assert gain_kept(0.578, 0.732, 0.578) == 0.0
    assert gain_kept(0.655, 0.732, 0.578) == pytest.approx(50.0)


def test_evaluation_trains_in_fp32_on_every_cpu_so_its_scores_do_not_depend_on_the_cpu_model():
    from kdnas.evaluation.models import yardstick_precision

    assert yardstick_precision(torch.device("cpu")) == "fp32"
    assert yardstick_precision(torch.device("cuda")) == "bf16"


def test_accuracy_and_macro_f1():
    acc, f1 = accuracy_and_f1([0, 0, 1, 1], [0, 1, 1, 1], 2)
    assert acc == 0.75
    # class 0: tp 1, fp 1, fn 0 -> 2/3; class 1: tp 2, fp 0, fn 1 -> 4/5
    assert f1 == pytest.approx((2 / 3 + 4 / 5) / 2)
    _, f1 = accuracy_and_f1([0, 0, 0], [0, 0, 1], 3)  # a class never predicted nor present scores 0
    assert f1 == pytest.approx((0.8 + 0 + 0) / 3)


def test_tiny_finetune_beats_majority_class(minilm_2l, topic, isolated_cache):
    ref = resolve_model(minilm_2l)
    run = finetune_once(ref, topic, TINY, seed=0)
    majority = protocol_splits(topic, TINY)[1].majority_accuracy()
    assert run.train_examples == 240 and run.test_examples == 150
    assert run.accuracy > majority + 0.25, (run.accuracy, majority)
    assert 0 < run.macro_f1 <= 1
    # which examples it got right, kept for paired comparisons
    assert len(run.outcomes) == 150 and run.outcomes.count("1") / 150 == pytest.approx(run.accuracy)


def test_scores_are_cached_per_weights_and_recipe(minilm_2l, topic, isolated_cache, monkeypatch):
    config = FinetuneConfig(lr=2e-4, batch_size=16, epochs=1, max_len=16, train_size=32, eval_size=20,
                            seeds=(0, 1), progress=False)
    ref = resolve_model(minilm_2l)
    first = evaluate_model(ref, [topic], config)["topic"]
    assert [r.seed for r in first.runs] == [0, 1] and not any(r.cached for r in first.runs)

    def fail(*args, **kwargs):
        raise AssertionError("a cached score was recomputed")

    monkeypatch.setattr("kdnas.evaluation.finetune.finetune_once", fail)
    again = evaluate_model(ref, [topic], config)["topic"]
    assert all(r.cached for r in again.runs)
    assert [r.accuracy for r in again.runs] == [r.accuracy for r in first.runs]
    assert first.std() >= 0 and first.mean() == pytest.approx(sum(r.accuracy for r in first.runs) / 2)


def test_report_has_percent_of_teacher(minilm_2l, isolated_cache):
    config = FinetuneConfig(lr=2e-4, batch_size=16, epochs=1, max_len=16, train_size=32, eval_size=20,
                            seeds=(0,), progress=False)
    report = evaluate([minilm_2l], ["topic"], config, teacher=minilm_2l, latency=False)
    teacher, student = report["models"]
    assert teacher["role"] == "teacher" and student["role"] == "student"
    assert student["percent_of_teacher"]["topic"] == pytest.approx(100.0)  # same weights, same seed
    teacher_acc = teacher["tasks"]["topic"]["accuracy_mean"]
    if teacher_acc > teacher["tasks"]["topic"]["majority_accuracy"]:
        assert student["gain_kept"]["topic"] == pytest.approx(100.0)
    else:  # 32 examples, 1 epoch may leave the reference at the majority class: no gain to keep
        assert student["gain_kept"]["topic"] != student["gain_kept"]["topic"]  # nan
    assert report["tasks"]["topic"]["used"] == {"train": 32, "test": 20}
    table = format_table(report)
    assert "% of teacher" in table and "majority class" in table


def test_folder_without_tokenizer_is_a_user_error(minilm_2l, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{minilm_2l}/{name}", bare / name)
    with pytest.raises(KdnasError, match="has no tokenizer"):
        resolve_model(str(bare))


def test_invalid_recipe_values_are_user_errors():
    with pytest.raises(KdnasError, match="learning rate"):
        FinetuneConfig(lr=0)
    with pytest.raises(KdnasError, match="at least one seed"):
        FinetuneConfig(seeds=())
