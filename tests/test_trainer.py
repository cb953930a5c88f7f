import copy
import dataclasses
import math

import pytest
import torch

from kdnas.distill import DistillConfig, Evaluator, KdnasError, TeacherCache, build_student, distill, parse_arch


@pytest.fixture(scope="module")
def cache(teacher, small_data):
    return TeacherCache(teacher, small_data)


def test_evaluator_scale_untrained_student_near_one(teacher, small_data, cache):
    spec = parse_arch("2x4x64x256", **teacher.student_sizes())
    metrics = Evaluator(cache)(build_student(spec, seed=0))
    assert 0.3 < metrics["l_hs_norm"] < 1.5
    assert metrics["l_hs_raw"] > 0
    # its error bar is a standard error over 32 sequences: small next to the value, and larger on 8
    assert 0 < metrics["l_hs_se"] < 0.1 * metrics["l_hs_norm"]
    fewer = Evaluator(cache)(build_student(spec, seed=0), rows=8)
    assert fewer["l_hs_se"] > metrics["l_hs_se"]


def test_clustered_standard_error_matches_the_textbook_cases():
    from kdnas.distill.evaluate import _clustered_se

    values = torch.tensor([1.0, 2.0, 4.0, 7.0], dtype=torch.float64)
    ones = torch.ones(4, dtype=torch.float64)
    assert _clustered_se(values, ones) == pytest.approx((values.std() / 2).item())  # one token per row: s/√n
    # rows whose tokens all carry the row's mean error: the cluster size only weights them
    assert _clustered_se(values * 3, ones * 3) == pytest.approx(_clustered_se(values, ones))
    assert _clustered_se(torch.ones(4, dtype=torch.float64) * 2, ones) == 0.0


def test_short_real_distillation_lowers_held_out_loss(teacher, small_data, cache):
    spec = parse_arch("2x4x128x256", **teacher.student_sizes())
    before = Evaluator(cache)(build_student(spec, seed=0))["l_hs_norm"]
    seen, ticks = [], []
    config = DistillConfig(method="hs", steps=60, batch_size=16, lr=1e-3, eval_every=30, progress=False)
    result = distill(spec, teacher, small_data, config, cache=cache, on_eval=lambda s, m: seen.append(s),
                     on_step=lambda step, total: ticks.append((step, total)))
    assert seen == [30, 60] and ticks == [(step, 60) for step in range(1, 61)]
    assert result.metrics["l_hs_norm"] < before - 0.05, (before, result.metrics)
    assert result.history[0]["train_loss"] > result.history[-1]["train_loss"]


def test_minilmv2_training_lowers_its_relation_loss(teacher, small_data, cache):
    # MiniLMv2 trains only the last layer's Q/K/V relations, so its own loss is what must fall.
    spec = parse_arch("2x4x128x256", **teacher.student_sizes())
    config = DistillConfig(method="minilmv2", steps=40, batch_size=16, lr=1e-3, eval_every=10, progress=False)
    result = distill(spec, teacher, small_data, config, cache=cache)
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.8 * losses[0], losses
    assert math.isfinite(result.metrics["l_hs_norm"])


def test_cache_and_live_teacher_give_the_same_training(teacher, small_data, cache):
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    config = DistillConfig(method="hs", steps=3, batch_size=8, progress=False)
    cached = distill(spec, teacher, small_data, config, cache=cache)
    live = distill(spec, teacher, small_data, config, cache=None, evaluator=Evaluator(cache))
    assert math.isclose(cached.history[-1]["train_loss"], live.history[-1]["train_loss"], rel_tol=2e-2)


@pytest.mark.parametrize("steps", [2, 15])
def test_nan_loss_stops_and_names_the_step(teacher, small_data, cache, steps):
    # Losses are read every few steps, not every step (no per-step host sync on a GPU); the step a
    # loss first went non-finite is still the one named, also when it is found later.
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    with pytest.raises(KdnasError, match=r"loss became (nan|inf) at step 2 .*lower --lr"):
        distill(spec, teacher, small_data, DistillConfig(method="hs", steps=steps, lr=1e30, progress=False),
                cache=cache)


def test_saved_student_loads_with_automodel(teacher, small_data, cache, tmp_path, shared_modes):
    from transformers import AutoModel, AutoTokenizer

    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    result = distill(spec, teacher, small_data, DistillConfig(method="hs", steps=2, progress=False), cache=cache)
    result.save(tmp_path / "student", teacher.tokenizer)
    loaded = AutoModel.from_pretrained(tmp_path / "student")
    ids = small_data.eval_ids[:2]
    torch.testing.assert_close(loaded(input_ids=ids).last_hidden_state, result.student.eval()(input_ids=ids).last_hidden_state)
    assert AutoTokenizer.from_pretrained(tmp_path / "student").vocab_size == teacher.tokenizer.vocab_size
    # readable like any file the user makes, not private like the temporary folder it was written in
    mask = shared_modes.umask()
    assert shared_modes(tmp_path / "student") == {"folders": 0o777 & ~mask, "files": 0o666 & ~mask}


@pytest.mark.parametrize("bad, message", [
    (dict(steps=0), "steps=0 is invalid"),
    (dict(lr=-1.0), "learning rate -1.0 is invalid"),
    (dict(weight_decay=-0.1), "weight decay -0.1 is invalid: must be a number >= 0"),
    (dict(weight_decay=float("inf")), "weight decay inf is invalid"),
    (dict(init="zeros"), "init 'zeros' is invalid"),
    (dict(precision="half"), "precision 'half' is invalid: allowed auto, bf16, fp32"),
    (dict(augment=1.5), r"augment 1.5 is invalid: the share of batches perturbed, 0 <= augment <= 1"),
    (dict(augment=float("nan")), "augment nan is invalid"),
    (dict(augment=True), "augment True is invalid"),
    (dict(augment_words="vocab"), r"augment words .vocab. is invalid: allowed batch, neighbours"),
])
def test_bad_config_values(bad, message):
    with pytest.raises(KdnasError, match=message):
        DistillConfig(**bad)


def test_epoch_batches_hold_rows_of_similar_length_and_cover_the_epoch():
    import torch

    from kdnas.distill.loop import epoch_batches

    lengths = torch.randint(5, 64, (1000,), generator=torch.Generator().manual_seed(1))
    batches = epoch_batches(lengths, 32, torch.Generator().manual_seed(0))
    seen = torch.cat(batches)
    assert all(len(b) == 32 for b in batches) and len(set(seen.tolist())) == len(seen) == 992  # full batches only
    spread = sum(int(lengths[b].max() - lengths[b].min()) for b in batches) / len(batches)
    assert spread < 10, spread  # a random batch of 32 spans about 55 tokens
    assert [len(b) for b in epoch_batches(lengths[:5], 32, torch.Generator().manual_seed(0))] == [5]


def test_shuffled_batches_cover_every_row_once_per_pass():
    import itertools

    import torch

    from kdnas.distill.loop import shuffled_batches

    def first_pass(n, size, drop_last):
        batches = shuffled_batches(n, size, torch.Generator().manual_seed(0), drop_last=drop_last)
        per_pass = n // size if drop_last and n >= size else -(-n // size)
        return [b.tolist() for b in itertools.islice(batches, per_pass)], next(batches)

    rows, after = first_pass(10, 4, drop_last=False)  # fine-tuning: the last batch is short
    assert [len(b) for b in rows] == [4, 4, 2] and sorted(sum(rows, [])) == list(range(10)) and len(after) == 4
    rows, _ = first_pass(10, 4, drop_last=True)  # task transfer: whole batches only
    assert [len(b) for b in rows] == [4, 4] and len(set(sum(rows, []))) == 8
    rows, _ = first_pass(3, 4, drop_last=True)
    assert sorted(rows[0]) == [0, 1, 2]


def test_a_non_finite_loss_stops_the_loop_naming_its_step():
    import torch

    from kdnas.core.errors import TrainingError
    from kdnas.distill.loop import LossReader

    reader = LossReader("stage hs, lr 0.1", "lower that stage's lr")
    for value in (1.0, 0.5, float("nan")):
        reader.add(torch.tensor(value))
    with pytest.raises(TrainingError, match=r"loss became nan at step 7 \(stage hs, lr 0.1\).*lower that stage's lr"):
        reader.read(7)
    reader.add(torch.tensor(0.25))
    assert reader.read(8) == [0.25]


def test_adamw_is_fused_on_cpu_and_takes_the_same_steps_as_the_per_tensor_loop():
    from kdnas.distill.loop import Optimization, adamw

    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    weights = {}
    for fused in (True, False):
        model = copy.deepcopy(start)
        params = list(model.parameters())
        optim = Optimization(lr=1e-2, steps=20, warmup_steps=2, weight_decay=0.01)  # fused by default
        optimizer, schedule = adamw(params, optim if fused else dataclasses.replace(optim, fused=False))
        assert optimizer.defaults["fused"] is (True if fused else None)
        for _ in range(20):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            schedule.step()
        weights[fused] = torch.cat([p.detach().flatten() for p in params])
    assert not torch.equal(weights[True], torch.cat([p.detach().flatten() for p in start.parameters()]))
    torch.testing.assert_close(weights[True], weights[False], atol=1e-5, rtol=1e-5)


def test_held_out_l_hs_is_cross_fitted_and_not_biased_against_a_narrow_student(teacher, news_texts):
    from kdnas.distill import make_transfer_set
    from kdnas.distill.trainer import initial_student

    data = make_transfer_set(teacher.tokenizer, news_texts, seq_len=64, num_train=8, num_eval=256, seed=0)
    cache = TeacherCache(teacher, data)
    evaluator = Evaluator(cache)
    spec = parse_arch("1x3x96x256", **teacher.student_sizes())
    student, info = initial_student(spec, teacher, cache, DistillConfig(init="inherit"))
    assert info["init"] == "inherit"
    full = evaluator(student)
    # Fitted on one half and scored on the other, both ways: a 1-layer inherited student predicts the
    # teacher better than its mean (the old 16-row split scored such students above 1).
    assert 0.0 < full["l_hs_norm"] < 1.0, full
    interim = evaluator(student, rows=64)
    assert interim["l_hs_norm"] != full["l_hs_norm"] and 0.0 < interim["l_hs_norm"] < 1.5
    # The teacher itself is predicted almost perfectly from its own states.
    assert evaluator(teacher.model)["l_hs_norm"] < 0.02


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_precision_is_bf16_only_on_a_cpu_that_multiplies_bf16_natively(monkeypatch, native, expected):
    from kdnas.distill.loop import resolve_precision

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: native, raising=False)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == expected
    assert resolve_precision("bf16", cpu) == "bf16" and resolve_precision("fp32", cpu) == "fp32"
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    with pytest.raises(KdnasError, match="precision 'fp16' is invalid"):
        resolve_precision("fp16", cpu)


@pytest.mark.parametrize("native", [True, False])
def test_forced_bf16_is_announced_only_where_it_would_be_emulated(monkeypatch, native):
    from kdnas.distill.loop import emulation_notice

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: native, raising=False)
    cpu = torch.device("cpu")
    notice = emulation_notice("bf16", cpu)
    assert (notice is None) == native
    if not native:
        assert "emulated" in notice and "--precision auto" in notice and "\n" not in notice
    assert emulation_notice("auto", cpu) is None and emulation_notice("fp32", cpu) is None
    assert emulation_notice("bf16", torch.device("cuda")) is None


def test_autocast_runs_matrix_products_in_the_resolved_precision():
    from kdnas.distill.loop import autocast

    layer, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    with autocast(torch.device("cpu"), "bf16"):
        assert layer(x).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(x).dtype == torch.float32


def test_bf16_distillation_learns_like_fp32_and_says_which_it_ran(teacher, small_data, cache):
    # The weights, gradients and optimizer state stay fp32 under autocast: the saved student is fp32
    # and its held-out loss ends where the fp32 run's does.
    spec = parse_arch("2x4x128x256", **teacher.student_sizes())
    runs = {}
    for precision in ("fp32", "bf16"):
        config = DistillConfig(method="hs", steps=40, batch_size=16, lr=1e-3, precision=precision, progress=False)
        runs[precision] = distill(spec, teacher, small_data, config, cache=cache)
        assert runs[precision].summary()["precision"] == precision
    assert next(runs["bf16"].student.parameters()).dtype == torch.float32
    fp32, bf16 = (runs[p].metrics["l_hs_norm"] for p in ("fp32", "bf16"))
    assert abs(fp32 - bf16) < 0.02, (fp32, bf16)


def test_substituted_tokens_come_from_the_batch_and_spare_special_tokens_and_padding():
    from kdnas.distill.augment import substitute_tokens

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (64, 40), generator=g)
    ids[:, 0], ids[:, 30], ids[:, 31:] = 101, 102, 0  # [CLS] ... [SEP] then padding
    mask = (ids != 0).long()
    out = substitute_tokens(ids, mask, torch.tensor([101, 102, 0]), torch.Generator().manual_seed(1), share=0.15)
    changed = out != ids
    assert not changed[:, [0, 30]].any() and (out[:, 31:] == 0).all()  # specials and padding untouched
    real = ids[:, 1:30]
    share = changed.sum().item() / real.numel()
    assert 0.10 < share < 0.16, share  # about 15 % chosen (a draw may pick the token it replaces)
    assert set(out[changed].tolist()) <= set(real.flatten().tolist())  # words of the batch, not of the vocabulary
    again = substitute_tokens(ids, mask, torch.tensor([101, 102, 0]), torch.Generator().manual_seed(1), share=0.15)
    assert torch.equal(out, again) and not torch.equal(ids, out)


def test_word_neighbours_are_the_nearest_corpus_words_of_the_same_kind():
    from kdnas.distill.augment import word_neighbours

    # 0-2 special, 3-6 word starts, 7-9 word pieces; 10 is a word start the rows never use
    tokens = ["[PAD]", "[CLS]", "[SEP]", "cat", "cats", "dog", "car", "##s", "##ing", "##ed", "kitten"]
    emb = torch.tensor([[0, 0, 1.0], [0, 1, 0], [0, 1, 1], [1, 0.1, 0], [1, 0.2, 0], [1, 0.9, 0], [0.2, 1, 0],
                        [1, 0, 0.1], [0.1, 0, 1], [0.2, 0, 1], [1, 0.15, 0]])
    ids = torch.tensor([[1, 3, 4, 5, 6, 2, 0], [1, 7, 8, 9, 3, 2, 0]])
    table = word_neighbours(emb, ids, torch.tensor([0, 1, 2]), tokens, k=2)
    assert table.shape == (11, 2)
    assert table[3].tolist() == [4, 5] and table[6].tolist() == [5, 4]  # nearest first, never itself
    assert set(table[7].tolist()) <= {8, 9} and table[8].tolist() == [9, 7]  # a word piece among word pieces
    assert table[10].tolist() == [10, 10] and table[1].tolist() == [1, 1]  # unused and special: unchanged
    assert 10 not in table[3:10].flatten().tolist()  # only words the rows use are drawn


def test_neighbour_substitution_replaces_words_by_their_table_neighbours_only():
    from kdnas.distill.augment import substitute_neighbours

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (64, 40), generator=g)
    ids[:, 0], ids[:, 30], ids[:, 31:] = 101, 102, 0
    mask = (ids != 0).long()
    table = torch.arange(3000).unsqueeze(1) + torch.tensor([5000, 6000, 7000])  # token t's neighbours: t+5000, ...
    out = substitute_neighbours(ids, mask, torch.tensor([101, 102, 0]), table, torch.Generator().manual_seed(1))
    changed = out != ids
    assert not changed[:, [0, 30]].any() and (out[:, 31:] == 0).all()
    assert 0.12 < changed.sum().item() / ids[:, 1:30].numel() < 0.18
    assert set((out[changed] - ids[changed]).tolist()) == {5000, 6000, 7000}  # each from its own row of the table


def test_perturbed_batches_are_labelled_by_the_teacher_live(teacher, small_data, cache, monkeypatch):
    # A perturbed batch has no cached target: the teacher must see exactly the input the student sees.
    spec = parse_arch("1x4x64x128", **teacher.student_sizes())
    config = DistillConfig(method="hs", steps=4, batch_size=8, progress=False)
    plain = distill(spec, teacher, small_data, config, cache=cache)  # also fills the cache
    seen = []
    real = teacher.activations
    monkeypatch.setattr(teacher, "activations", lambda ids, mask, needs: seen.append((ids.clone(), mask.clone()))
                        or real(ids, mask, needs))
    again = distill(spec, teacher, small_data, config, cache=cache)
    assert seen == [] and again.history == plain.history  # every target from the cache; augment 0 draws nothing
    perturbed = distill(spec, teacher, small_data, dataclasses.replace(config, augment=1.0), cache=cache)
    assert len(seen) == 4
    corpus = {tuple(row[row != teacher.tokenizer.pad_token_id].tolist()) for row in small_data.train_ids}
    for ids, mask in seen:  # perturbed copies of training rows, not the rows as the corpus has them
        rows = [tuple(row[m.bool()].tolist()) for row, m in zip(ids, mask)]
        assert sum(row not in corpus for row in rows) >= len(rows) // 2
    assert plain.history[-1]["train_loss"] != perturbed.history[-1]["train_loss"]
    seen.clear()
    near = distill(spec, teacher, small_data, dataclasses.replace(config, augment=1.0, augment_words="neighbours"),
                   cache=cache)
    assert len(seen) == 4 and near.history[-1]["train_loss"] != perturbed.history[-1]["train_loss"]
    for ids, mask in seen:  # perturbed copies here too
        rows = [tuple(row[m.bool()].tolist()) for row, m in zip(ids, mask)]
        assert sum(row not in corpus for row in rows) >= len(rows) // 2


def test_hs_then_od_refuses_the_second_stage_s_options_before_the_first_trains(monkeypatch):
    """A bad --temperature (an OD option) was found only once the HS stage had trained and saved."""
    from types import SimpleNamespace

    from kdnas.distill import recipes
    from kdnas.distill.activations import ModelDims

    monkeypatch.setattr(recipes, "distill", lambda *a, **k: pytest.fail("the first stage trained"))
    teacher = SimpleNamespace(dims=ModelDims(layers=2, hidden=64, heads=4, ffn=128))
    with pytest.raises(KdnasError, match=r"temperature=-1.0 is invalid"):
        recipes.hs_then_od(parse_arch("1x4x64x128"), teacher, None, DistillConfig(method="hs", temperature=-1.0))
