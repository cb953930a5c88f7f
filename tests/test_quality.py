"""Embedding fidelity and linear probes (evaluation.fidelity, evaluation.probe), and `kdnas evaluate --measures`."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

import kdnas.cli
from kdnas.core.errors import KdnasError
from kdnas.evaluation.fidelity import average_ranks, embedding_fidelity, fidelity_scores, sample_pairs, spearman
from kdnas.evaluation.models import resolve_model, sentence_embeddings
from kdnas.evaluation.probe import few_shot_draws, probe, probe_scores
from kdnas.evaluation.report import QualityConfig, check_measures
from kdnas.evaluation.tasks import Task, load_task

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def random_2l(minilm_2l, tmp_path_factory) -> str:
    """minilm_2l's shape and tokenizer with freshly initialised weights: a student that learned nothing."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    out = tmp_path_factory.mktemp("random-2l")
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(minilm_2l)).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_2l).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def sentences(news_texts):
    from kdnas.distill.data import heldout_sentences

    return heldout_sentences(news_texts, 40, seed=0)


@pytest.fixture(scope="module")
def mini_topic() -> Task:
    """A small stratified cut of the topic task: 60 train, 50 test articles."""
    topic = load_task("topic")
    return Task(name="topic-mini", labels=topic.labels, train=topic.train.subsample(60), dev=topic.dev.subsample(10),
                test=topic.test.subsample(50), source="tests")


# --------------------------------------------------------------------------------------------
# rank correlation and pairs


def test_spearman_matches_hand_computed_values_with_and_without_ties():
    assert average_ranks(torch.tensor([10.0, 20.0, 20.0, 30.0])).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks(torch.tensor([3.0, 1.0, 2.0])).tolist() == [3.0, 1.0, 2.0]
    # No ties: 1 - 6·Σd² / (n(n²-1)) with d = (1, 1, 1, 1, 0) -> 1 - 24/120.
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # Ties: ranks of y are (1, 2, 3.5, 5, 3.5); centred products sum to 8, squares to 10 and 9.5.
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 4, 9]) == 1.0  # any increasing map
    assert math.isnan(spearman([1, 2, 3], [7, 7, 7]))  # constant side: undefined


def test_sample_pairs_are_distinct_unordered_and_seeded():
    i, k = sample_pairs(5, 100)  # more than exist: all 10
    assert sorted(zip(i.tolist(), k.tolist())) == [(a, b) for a in range(5) for b in range(a + 1, 5)]
    i, k = sample_pairs(300, 2000, seed=3)
    pairs = list(zip(i.tolist(), k.tolist()))
    assert len(set(pairs)) == 2000 and all(0 <= a < b < 300 for a, b in pairs)
    assert pairs == list(zip(*(t.tolist() for t in sample_pairs(300, 2000, seed=3))))
    assert pairs != list(zip(*(t.tolist() for t in sample_pairs(300, 2000, seed=4))))


# --------------------------------------------------------------------------------------------
# fidelity


def test_fidelity_on_synthetic_embeddings():
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(200, 16, generator=g)
    same = embedding_fidelity(teacher, teacher, pairs=2000)
    assert same["spearman"] == 1.0 and same["mean_cosine"] == pytest.approx(1.0)
    assert same["cosine_via"] == "identity" and same["pairs"] == 2000 and same["sentences"] == 200
    # A wider student that is a linear image of the teacher: the fitted map recovers it on unseen sentences.
    wide = embedding_fidelity(teacher, teacher @ torch.randn(16, 24, generator=g), pairs=2000)
    assert wide["cosine_via"] == "fitted projection" and wide["cosine_sentences"] == 100
    assert wide["mean_cosine"] == pytest.approx(1.0, abs=1e-6)
    noise = embedding_fidelity(teacher, torch.randn(200, 8, generator=g), pairs=2000)
    assert abs(noise["spearman"]) < 0.1 and abs(noise["mean_cosine"]) < 0.2
    with pytest.raises(KdnasError, match="at least 4 sentences"):
        embedding_fidelity(teacher[:3], teacher[:3])


def test_fidelity_of_a_model_with_itself_is_one_and_of_random_weights_lower(minilm_2l, random_2l, sentences,
                                                                           isolated_cache, monkeypatch):
    trained, untrained = resolve_model(minilm_2l), resolve_model(random_2l)
    itself = fidelity_scores(trained, trained, sentences, pairs=500, max_len=32)
    assert itself["spearman"] == 1.0 and itself["mean_cosine"] == pytest.approx(1.0)
    assert itself["pairs"] == 500 and itself["sentences"] == 40
    rand = fidelity_scores(trained, untrained, sentences, pairs=500, max_len=32)
    assert rand["spearman"] < 0.9, rand  # bag-of-words overlap keeps some order; the embedding space is unrelated:
    assert rand["mean_cosine"] < 0.3, rand

    def fail(*args, **kwargs):
        raise AssertionError("cached embeddings were recomputed")

    monkeypatch.setattr("kdnas.evaluation.fidelity.sentence_embeddings", fail)
    again = fidelity_scores(trained, untrained, sentences, pairs=500, max_len=32)
    assert again["spearman"] == rand["spearman"]


def test_sentence_embeddings_accept_a_loaded_model_and_pad_nothing_in(minilm_2l):
    from kdnas.evaluation.models import load_encoder

    ref = resolve_model(minilm_2l)
    texts = ["A short one.", "A much longer sentence that needs several more tokens than the first one does."]
    by_ref = sentence_embeddings(ref, texts, max_len=32)
    by_pair = sentence_embeddings(load_encoder(ref), texts, max_len=32)
    alone = sentence_embeddings(ref, texts[:1], max_len=32)
    assert by_ref.shape == (2, 384) and by_ref.dtype == torch.float32
    assert torch.allclose(by_ref, by_pair)
    assert torch.allclose(by_ref[0], alone[0], atol=1e-5)  # batched with a longer text: padding is masked out


# --------------------------------------------------------------------------------------------
# probes


def _clusters(n: int, d: int, k: int, spread: float, seed: int) -> tuple[torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=torch.Generator().manual_seed(99)) * spread
    labels = torch.randint(0, k, (n,), generator=g)
    return centres[labels] + torch.randn(n, d, generator=g), labels.tolist()


def test_probe_separates_separable_data_and_is_at_chance_on_shuffled_labels():
    x, y = _clusters(150, 20, 3, spread=6.0, seed=0)
    xt, yt = _clusters(300, 20, 3, spread=6.0, seed=1)
    assert probe(x, y, xt, yt, 3) >= 0.99
    assert probe(x, y, xt, yt, 3) == probe(x, y, xt, yt, 3)  # deterministic
    shuffled = torch.randperm(len(y), generator=torch.Generator().manual_seed(5)).tolist()
    chance = probe(x, [y[i] for i in shuffled], xt, yt, 3)
    assert 0.2 < chance < 0.47, chance
    # Scale-free: the probe standardises, so a student's tiny spread around a mean vector is no handicap.
    assert probe(1e-3 * x + 5.0, y, 1e-3 * xt + 5.0, yt, 3) == probe(x, y, xt, yt, 3)


def test_few_shot_draws_are_stratified_and_reproducible():
    labels = [0] * 30 + [1] * 20 + [2] * 3
    draws = few_shot_draws(labels, shots=4, draws=5, seed=0)
    assert len(draws) == 5
    for draw in draws:
        picked = [labels[i] for i in draw]
        assert (picked.count(0), picked.count(1), picked.count(2)) == (4, 4, 3)  # a small class gives all it has
        assert len(set(draw)) == len(draw)
    assert len({tuple(d) for d in draws}) == 5  # the draws differ
    assert few_shot_draws(labels, shots=4, draws=5, seed=0) == draws
    assert few_shot_draws(labels, shots=4, draws=8, seed=0)[:5] == draws  # more draws keep the first ones
    assert few_shot_draws(labels, shots=4, draws=5, seed=1) != draws


def test_probe_scores_embed_each_split_once_and_are_cached(minilm_2l, mini_topic, isolated_cache, monkeypatch):
    import kdnas.evaluation.probe as probe_module

    calls = []
    real = probe_module.sentence_embeddings
    monkeypatch.setattr(probe_module, "sentence_embeddings", lambda model, texts, *a, **k: calls.append(len(texts))
                        or real(model, texts, *a, **k))
    scores = probe_scores(minilm_2l, mini_topic, shots=4, draws=3, max_len=32)
    assert sorted(calls) == [50, 60]  # train and test embedded once, for the full and the 3 few-shot probes
    assert scores["majority"] == mini_topic.test.majority_accuracy()
    assert scores["full"] > scores["majority"] + 0.3, scores
    assert len(scores["few_shot"]) == 3 and scores["few_shot_std"] >= 0
    assert scores["few_shot_mean"] == pytest.approx(sum(scores["few_shot"]) / 3)
    assert (scores["train_examples"], scores["test_examples"], scores["cached"]) == (60, 50, False)
    kept = scores["outcomes"]  # which test examples each probe got right, for paired comparisons
    assert kept["full"].count("1") / 50 == pytest.approx(scores["full"]) and len(kept["full"]) == 50
    assert [r.count("1") / 50 for r in kept["few_shot"]] == pytest.approx(scores["few_shot"])
    again = probe_scores(minilm_2l, mini_topic, shots=4, draws=3, max_len=32)
    assert again["cached"] and len(calls) == 2 and again["full"] == scores["full"]
    probe_scores(minilm_2l, mini_topic, shots=2, draws=3, max_len=32)  # another protocol is another entry
    assert len(calls) == 4


def test_measures_and_protocol_values_are_checked():
    assert check_measures("finetune, fidelity") == ("fidelity", "finetune")
    with pytest.raises(KdnasError, match="measure 'bleu' is invalid: allowed fidelity, probe, finetune"):
        check_measures(["probe", "bleu"])
    with pytest.raises(KdnasError, match="fidelity pairs 50 is invalid: must be >= 100"):
        QualityConfig(fidelity_pairs=50)
    assert QualityConfig().fidelity_pairs >= 2000


# --------------------------------------------------------------------------------------------
# kdnas evaluate --measures


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_cli_rejects_unknown_measure_and_fidelity_without_teacher(capsys, minilm_2l):
    assert kdnas.cli.main(["evaluate", minilm_2l, "--measures", "fidelity,bleu", "--quiet"]) == 2
    line = _error_line(capsys)
    assert "'bleu'" in line and "fidelity, probe, finetune" in line
    assert kdnas.cli.main(["evaluate", minilm_2l, "--teacher", "none", "--measures", "fidelity", "--quiet"]) == 2
    assert "teacher" in _error_line(capsys)
    assert kdnas.cli.main(["evaluate", minilm_2l, "--fidelity-pairs", "10", "--quiet"]) == 2
    assert "fidelity pairs 10" in _error_line(capsys)


def test_cli_fidelity_and_probe_report(capsys, tmp_path, minilm_2l, random_2l, mini_topic, isolated_cache):
    task = tmp_path / "mini.csv"  # 110 articles -> a local task split 80/10/10
    with task.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for split in (mini_topic.train, mini_topic.test):
            writer.writerows((t, mini_topic.labels[y]) for t, y in zip(split.texts, split.labels))
    out = tmp_path / "eval.json"
    code = kdnas.cli.main(["evaluate", random_2l, "--teacher", minilm_2l, "--tasks", str(task), "--measures",
                         "fidelity,probe", "--fidelity-sentences", "24", "--fidelity-pairs", "200", "--shots", "2",
                         "--draws", "2", "--max-len", "16", "--no-latency", "--quiet", "--out", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    for text in ("fidelity ρ", "mean cos", "mini probe", "mini 2-shot", "probe gain kept", "majority class"):
        assert text in table
    assert "acc (F1)" not in table and "% of teacher" not in table  # fine-tuning not measured
    report = json.loads(out.read_text())
    teacher, student = report["models"]
    assert teacher["fidelity"]["spearman"] == 1.0 and student["fidelity"]["spearman"] < 0.9
    assert teacher["probe_gain_kept"]["mini"] == pytest.approx(100.0)
    assert set(student["probes"]["mini"]) >= {"full", "few_shot_mean", "few_shot_std", "majority"}
    errors = student["standard_errors"]  # every measure's noise, for telling a tie from a win
    assert set(errors) == {"fidelity rho", "mini probe", "mini 2-shot"} and all(e > 0 for e in errors.values())
    assert errors["fidelity rho"] == student["fidelity"]["spearman_se"]
    assert report["protocol"]["measures"] == ["fidelity", "probe"] and student["tasks"] == {}
    assert report["protocol"]["fidelity"]["sentences"] == 24 and student["fidelity"]["pairs"] == 200
