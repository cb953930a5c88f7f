"""Sentence-embedding transfer (docs/methods.md, "Embedding-level distillation"): the losses and the method."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kdnas.distill import ModelDims, build_method
from kdnas.distill.activations import Activations
from kdnas.core.errors import KdnasError
from kdnas.distill.losses import anchor_relation_loss, mean_pool, pooled_cosine_loss, relation_loss, token_state_loss


def test_mean_pool_ignores_padding():
    states = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.allclose(mean_pool(states, mask), torch.tensor([[2.0, 3.0]]))


def test_pooled_cosine_is_zero_for_the_same_direction_and_one_for_orthogonal():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert pooled_cosine_loss(3 * a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert pooled_cosine_loss(a.flip(1), a).item() == pytest.approx(1.0, abs=1e-6)


def test_relation_loss_is_width_free_and_zero_for_a_rotated_copy():
    torch.manual_seed(0)
    teacher = torch.randn(8, 16)
    rotation, _ = torch.linalg.qr(torch.randn(16, 16))
    assert relation_loss(teacher @ rotation, teacher).item() == pytest.approx(0.0, abs=1e-6)
    narrow = torch.randn(8, 4)
    expected = ((torch.nn.functional.normalize(narrow, dim=-1) @ torch.nn.functional.normalize(narrow, dim=-1).T
                 - torch.nn.functional.normalize(teacher, dim=-1) @ torch.nn.functional.normalize(teacher, dim=-1).T)
                .pow(2).mean())
    assert relation_loss(narrow, teacher).item() == pytest.approx(expected.item(), rel=1e-5)


def test_token_state_loss_is_one_for_the_teachers_mean_and_ignores_padding():
    torch.manual_seed(0)
    teacher = torch.randn(2, 5, 3) * torch.tensor([1.0, 10.0, 100.0])  # very different feature scales
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    real = teacher[mask.bool()]
    mean = real.mean(0).expand_as(teacher)
    assert token_state_loss(mean, teacher, None, mask).item() == pytest.approx(1.0, rel=1e-5)
    padded = teacher.clone()
    padded[mask == 0] = 1e6  # values at padded positions never change the loss
    assert token_state_loss(teacher, padded, None, mask).item() == pytest.approx(0.0, abs=1e-6)


def test_embed_method_is_zero_for_the_teacher_itself_and_trains_its_projection():
    dims = ModelDims(layers=2, hidden=8, heads=2)
    method = build_method("embed", dims, dims)
    states = torch.randn(4, 6, 8)
    acts = Activations(hidden={2: states})
    mask = torch.ones(4, 6, dtype=torch.long)
    assert method(acts, acts, mask).item() == pytest.approx(0.0, abs=1e-5)
    assert method.projection is None and not list(method.parameters())  # equal widths: the student's own embedding
    narrow = build_method("embed", dims, ModelDims(layers=1, hidden=4, heads=2), embed_terms="cos+rel")
    loss = narrow(Activations(hidden={1: torch.randn(4, 6, 4)}), acts, mask)
    loss.backward()
    assert narrow.projection.weight.grad is not None and narrow.teacher_needs().hidden == frozenset({2})


def test_token_state_mse_weighs_features_by_their_scale():
    torch.manual_seed(0)
    teacher = torch.randn(2, 5, 3) * torch.tensor([1.0, 10.0, 100.0])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    real = teacher[mask.bool()]
    mean = real.mean(0).expand_as(teacher)
    assert token_state_loss(mean, teacher, None, mask, per_feature=False).item() == pytest.approx(1.0, rel=1e-5)
    # the same 10 % error on the smallest and on the largest feature: per feature they cost the same,
    # as plain MSE the large one costs 100² times as much, as it does in the pooled embedding's cosine
    small, large = teacher.clone(), teacher.clone()
    small[..., 0] *= 1.1
    large[..., 2] *= 1.1
    per_feature = [token_state_loss(x, teacher, None, mask).item() for x in (small, large)]
    plain = [token_state_loss(x, teacher, None, mask, per_feature=False).item() for x in (small, large)]
    assert per_feature[1] / per_feature[0] < 10
    assert plain[1] / plain[0] > 1000
    dims = ModelDims(layers=1, hidden=3, heads=1)
    states = Activations(hidden={1: small})
    method = build_method("embed", dims, dims, embed_terms="mse")
    assert method(states, Activations(hidden={1: teacher}), mask).item() == pytest.approx(plain[0], rel=1e-5)


@pytest.mark.parametrize("terms", ["", "tok+tok", "cos+magic", "-1*rel", "x*rel"])
def test_embed_terms_are_checked(terms):
    dims = ModelDims(layers=2, hidden=8, heads=2)
    with pytest.raises(KdnasError, match="embed_terms="):
        build_method("embed", dims, dims, embed_terms=terms if terms else "+")


@pytest.mark.parametrize("terms", ["", "mse+mse", "mse+magic", "0*mse"])
def test_a_config_refuses_malformed_embed_terms_before_any_run(terms):
    from kdnas.distill import DistillConfig

    with pytest.raises(KdnasError, match="embed_terms="):
        DistillConfig(method="embed", embed_terms=terms)


def test_embed_terms_take_weights():
    dims = ModelDims(layers=1, hidden=4, heads=2)
    method = build_method("embed", dims, dims, embed_terms="cos+10*rel")
    assert method.terms == {"cos": 1.0, "rel": 10.0}
    torch.manual_seed(0)
    s, t = torch.randn(4, 3, 4), torch.randn(4, 3, 4)
    mask = torch.ones(4, 3, dtype=torch.long)
    e_s, e_t = mean_pool(s, mask), mean_pool(t, mask)
    expected = pooled_cosine_loss(e_s, e_t, method.projection) + 10 * relation_loss(e_s, e_t)
    got = method(Activations(hidden={1: s}), Activations(hidden={1: t}), mask)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)


def test_anchor_relation_loss_is_zero_for_the_teacher_and_grows_with_a_wrong_student():
    torch.manual_seed(0)
    teacher, anchors = torch.randn(4, 8), torch.randn(16, 8)
    assert anchor_relation_loss(2 * teacher, teacher, anchors).item() == pytest.approx(0.0, abs=1e-6)
    wrong = anchor_relation_loss(torch.randn(4, 8), teacher, anchors).item()
    assert wrong > 0.01
    by_hand = (F.normalize(teacher.flip(0), dim=-1) @ F.normalize(anchors, dim=-1).T
               - F.normalize(teacher, dim=-1) @ F.normalize(anchors, dim=-1).T).pow(2).mean()
    assert anchor_relation_loss(teacher.flip(0), teacher, anchors).item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_embed_anchor_queue_fills_while_training_and_stays_bounded():
    dims = ModelDims(layers=1, hidden=4, heads=2)
    method = build_method("embed", dims, dims, embed_terms="cos+anc")
    mask = torch.ones(3, 2, dtype=torch.long)
    for _ in range(2):
        method(Activations(hidden={1: torch.randn(3, 2, 4)}), Activations(hidden={1: torch.randn(3, 2, 4)}), mask)
    assert method.anchors.shape == (6, 4)
    method.eval()
    method(Activations(hidden={1: torch.randn(3, 2, 4)}), Activations(hidden={1: torch.randn(3, 2, 4)}), mask)
    assert method.anchors.shape == (6, 4)  # evaluation batches are not queued


def test_embed_mid_term_pairs_intermediate_layers_uniformly():
    method = build_method("embed", ModelDims(layers=6, hidden=4, heads=2), ModelDims(layers=3, hidden=4, heads=2),
                          embed_terms="cos+mid")
    assert method.student_needs().hidden == frozenset({1, 2, 3})
    assert method.teacher_needs().hidden == frozenset({2, 4, 6})
    states = {k: torch.randn(2, 3, 4) for k in range(1, 7)}
    mask = torch.ones(2, 3, dtype=torch.long)
    same = method(Activations(hidden={1: states[2], 2: states[4], 3: states[6]}), Activations(hidden=states), mask)
    assert same.item() == pytest.approx(0.0, abs=1e-5)
