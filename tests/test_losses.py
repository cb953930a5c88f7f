"""Tests for distill/losses.py: docs/methods.md worked examples, slow loop references, padding, fp32."""

from __future__ import annotations

import math

import pytest
import torch

from kdnas.core.errors import KdnasError
from kdnas.distill.losses import (
    LAYER_MAPS,
    alp_loss,
    ckd_buckets,
    ckd_loss,
    default_relation_heads,
    direct_minilm_loss,
    hs_loss,
    hs_pair_losses,
    layer_map,
    masked_mse,
    minilm_v1_loss,
    minilmv2_loss,
    od_loss,
    pkd_loss,
    relation_head_choices,
    svd_embedding_init,
    xtremedistil_attention_loss,
    xtremedistil_hidden_loss,
)

B, S = 3, 6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def padding_mask() -> torch.Tensor:
    """Example 0 full, example 1 has 2 pads, example 2 only 2 real tokens."""
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    return mask


def scramble_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with every padded position replaced by large random values."""
    noise = 100 * torch.randn_like(x)
    pad = (mask == 0).view(*mask.shape, *([1] * (x.dim() - 2)))
    return torch.where(pad, noise, x)


# ---------------------------------------------------------------------------------------------
# layer maps


def test_layer_maps_worked_example_12_to_4():
    assert layer_map("single", 12, 4) == [[], [], [], [12]]
    assert layer_map("last", 12, 4) == [[9], [10], [11], [12]]
    assert layer_map("uniform", 12, 4) == [[3], [6], [9], [12]]
    assert layer_map("uniform-cons", 12, 4) == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    assert layer_map("uniform+last", 12, 4) == [[3, 9], [6, 10], [9, 11], [12]]


def test_layer_maps_worked_example_12_to_5():  # k = 3, does not divide
    assert layer_map("uniform", 12, 5) == [[3], [6], [9], [12], [12]]
    assert layer_map("last", 12, 5) == [[8], [9], [10], [11], [12]]
    assert layer_map("single", 12, 5) == [[], [], [], [], [12]]
    # the METHODS reading of [k(i-1)+1, ki] ∩ [1, L_T] leaves the last student layer unmapped here
    assert layer_map("uniform-cons", 12, 5) == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], []]
    assert layer_map("uniform+last", 12, 5) == [[3, 8], [6, 9], [9, 10], [11, 12], [12]]


def test_layer_maps_6_to_4():  # k = 2
    assert layer_map("uniform", 6, 4) == [[2], [4], [6], [6]]
    assert layer_map("last", 6, 4) == [[3], [4], [5], [6]]
    assert layer_map("uniform-cons", 6, 4) == [[1, 2], [3, 4], [5, 6], []]
    assert layer_map("uniform+last", 6, 4) == [[2, 3], [4], [5, 6], [6]]


def test_layer_maps_equal_depth_is_identity():
    identity = [[i] for i in range(1, 7)]
    for strategy in ("last", "uniform", "uniform-cons", "uniform+last"):
        assert layer_map(strategy, 6, 6) == identity, strategy
    assert layer_map("single", 6, 6) == [[], [], [], [], [], [6]]


def test_layer_maps_single_student_layer():
    assert layer_map("single", 12, 1) == [[12]]
    assert layer_map("last", 12, 1) == [[12]]
    assert layer_map("uniform", 12, 1) == [[12]]
    assert layer_map("uniform-cons", 12, 1) == [list(range(1, 13))]
    assert layer_map("uniform+last", 12, 1) == [[12]]


def test_layer_maps_deeper_student_than_teacher():
    assert layer_map("last", 3, 5) == [[], [], [1], [2], [3]]
    assert layer_map("uniform", 3, 5) == [[1], [2], [3], [3], [3]]
    assert layer_map("uniform-cons", 3, 5) == [[1], [2], [3], [], []]
    assert layer_map("single", 3, 5) == [[], [], [], [], [3]]


def test_layer_maps_are_sorted_unique_and_in_range():
    for strategy in LAYER_MAPS:
        for n_teacher in range(1, 13):
            for n_student in range(1, 13):
                phi = layer_map(strategy, n_teacher, n_student)
                assert len(phi) == n_student
                assert any(phi), (strategy, n_teacher, n_student)
                for layers in phi:
                    assert layers == sorted(set(layers))
                    assert all(1 <= j <= n_teacher for j in layers)


@pytest.mark.parametrize(
    "args, words",
    [
        (("skip", 12, 4), ["'skip'", "uniform-cons", "uniform+last"]),
        (("uniform", 0, 4), ["teacher layers=0"]),
        (("uniform", 12, -1), ["student layers=-1"]),
        (("uniform", 12, True), ["student layers=True"]),
    ],
)
def test_layer_map_rejects_bad_input(args, words):
    with pytest.raises(KdnasError) as err:
        layer_map(*args)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_default_relation_heads():
    assert default_relation_heads(768, 768) == 48
    assert default_relation_heads(768, 384) == 48
    assert default_relation_heads(384, 192) == 24  # 48 and 32 would leave d_r < 8 for the student
    assert default_relation_heads(768, 576) == 48
    assert default_relation_heads(12, 8) == 1  # nothing keeps d_r >= 8 with more than one head
    for d_t, d_s in [(768, 768), (384, 192), (768, 576), (312, 128)]:
        a = default_relation_heads(d_t, d_s)
        assert d_t % a == 0 and d_s % a == 0 and a <= 48 and min(d_t, d_s) // a >= 8
    assert relation_head_choices(24, 16) == [1, 2, 4, 8]


# ---------------------------------------------------------------------------------------------
# OD


def test_od_equals_kl_times_tau_squared_on_hand_example():
    # z_S = [1, 2, 3], z_T = [3, 2, 1], τ = 2: p_T = softmax([1.5, 1, .5]) is p_S reversed, so
    # KL(p_T‖p_S) = Σ p_i log(p_i / p_{2-i}) = (p_0 − p_2)·log(p_0/p_2) = (p_0 − p_2)·1
    #             = 2 sinh(.5) / (1 + 2 cosh(.5)) ≈ 0.3201567,   L_OD = τ² · KL ≈ 1.2806270
    kl = 2 * math.sinh(0.5) / (1 + 2 * math.cosh(0.5))
    assert kl == pytest.approx(0.3201567, abs=1e-6)
    loss = od_loss(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[3.0, 2.0, 1.0]]), temperature=2.0)
    assert loss.item() == pytest.approx(4 * kl, rel=1e-6)


def test_od_kl_form_is_ce_minus_teacher_entropy_and_respects_mask():
    student, teacher = torch.randn(B, S, 10), torch.randn(B, S, 10)
    mask = padding_mask()
    tau = 1.5
    p_t = (teacher / tau).softmax(-1)
    kl = (p_t * (p_t.log() - (student / tau).log_softmax(-1))).sum(-1)
    ce = -(p_t * (student / tau).log_softmax(-1)).sum(-1)
    entropy = -(p_t * p_t.log()).sum(-1)
    keep = mask.bool()
    expected = kl[keep].mean() * tau**2
    got = od_loss(student, teacher, tau, mask)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert (got + tau**2 * entropy[keep].mean()).item() == pytest.approx(tau**2 * ce[keep].mean().item(), rel=1e-5)
    assert od_loss(scramble_padding(student, mask), scramble_padding(teacher, mask), tau, mask).item() == pytest.approx(got.item(), rel=1e-6)
    # gathered logits [n, vocab] without a mask give the same value
    assert od_loss(student[keep], teacher[keep], tau).item() == pytest.approx(got.item(), rel=1e-6)
    assert od_loss(teacher, teacher, tau, mask).item() == pytest.approx(0.0, abs=1e-6)
    # No position selected: 0, and the student still receives a (zero) gradient.
    leaf = student.clone().requires_grad_(True)
    empty = od_loss(leaf, teacher, tau, torch.zeros_like(mask))
    empty.backward()
    assert empty.item() == 0.0 and leaf.grad is not None and not leaf.grad.any()
    with pytest.raises(ValueError, match="OD mask shape"):
        od_loss(student, teacher, tau, mask[:, :1])


def test_od_rejects_bad_temperature():
    with pytest.raises(KdnasError, match="temperature=0"):
        od_loss(torch.zeros(2, 3), torch.zeros(2, 3), temperature=0)


# ---------------------------------------------------------------------------------------------
# hidden-state style losses


def reference_masked_mse(pred, target, mask):
    total, count = 0.0, 0
    for b in range(pred.shape[0]):
        for t in range(pred.shape[1]):
            if mask[b, t]:
                total += float(((pred[b, t].double() - target[b, t].double()) ** 2).sum())
                count += pred.shape[2]
    return total / count


def test_masked_mse_and_hs_loss_match_reference():
    mask = padding_mask()
    s1, s2 = torch.randn(B, S, 4), torch.randn(B, S, 4)
    t1, t2 = torch.randn(B, S, 8), torch.randn(B, S, 8)
    w1 = torch.randn(4, 8)
    w2 = torch.nn.Linear(4, 8, bias=False)
    with torch.no_grad():
        expected = [reference_masked_mse(s1 @ w1, t1, mask), reference_masked_mse(w2(s2), t2, mask)]
    pairs = hs_pair_losses([s1, s2], [t1, t2], [w1, w2], mask)
    assert pairs.tolist() == pytest.approx(expected, rel=1e-5)
    assert hs_loss([s1, s2], [t1, t2], [w1, w2], mask).item() == pytest.approx(sum(expected), rel=1e-5)
    assert masked_mse(s1, s1 + 2.0, mask).item() == pytest.approx(4.0)
    scrambled = hs_loss([scramble_padding(s1, mask), s2], [t1, scramble_padding(t2, mask)], [w1, w2], mask)
    assert scrambled.item() == pytest.approx(sum(expected), rel=1e-5)


def test_pkd_hand_example():
    # [CLS] vectors: (3, 4) vs (6, 8) point the same way -> 0; (1, 0) vs (0, 2) are orthogonal -> ‖e1 − e2‖² = 2
    same_s, same_t = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    same_s[0, 0] = torch.tensor([3.0, 4.0])
    same_t[0, 0] = torch.tensor([6.0, 8.0])
    orth_s, orth_t = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    orth_s[0, 0] = torch.tensor([1.0, 0.0])
    orth_t[0, 0] = torch.tensor([0.0, 2.0])
    orth_s[0, 1] = 5.0  # non-[CLS] positions are ignored
    assert pkd_loss([same_s], [same_t], [None]).item() == pytest.approx(0.0, abs=1e-7)
    assert pkd_loss([same_s, orth_s], [same_t, orth_t], [None, None]).item() == pytest.approx(2.0)
    # a projection to d_T is applied before normalising: map (1, 0) onto (0, 1)
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert pkd_loss([orth_s], [orth_t], [swap]).item() == pytest.approx(0.0, abs=1e-7)


def test_ckd_buckets():
    assert ckd_buckets(12, 4) == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    assert ckd_buckets(12, 4, "PO") == [[1, 2, 3, 4], [4, 5, 6, 7], [7, 8, 9, 10], [10, 11, 12]]
    assert ckd_buckets(12, 3, "PO") == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9], [9, 10, 11, 12]]  # the paper's PO
    assert ckd_buckets(12, 5) == [[1, 2, 3], [4, 5, 6], [7, 8], [9, 10], [11, 12]]
    assert ckd_buckets(6, 4) == [[1, 2], [3, 4], [5], [6]]
    assert ckd_buckets(6, 6) == [[i] for i in range(1, 7)]
    assert ckd_buckets(12, 1) == [list(range(1, 13))]
    assert ckd_buckets(3, 5) == [[1], [2], [2], [3], [3]]
    with pytest.raises(KdnasError, match="'XO'.*NO, PO"):
        ckd_buckets(12, 4, "XO")


def test_ckd_loss_matches_reference():
    mask = padding_mask()
    student = [torch.randn(B, S, 4), torch.randn(B, S, 4)]
    buckets = [[torch.randn(B, S, 3), torch.randn(B, S, 3)], [torch.randn(B, S, 3)]]
    projections = [torch.randn(6, 4), torch.randn(3, 4)]
    expected = sum(
        reference_masked_mse(s, torch.cat(bucket, -1) @ w, mask) for s, bucket, w in zip(student, buckets, projections)
    )
    assert ckd_loss(student, buckets, projections, mask).item() == pytest.approx(expected, rel=1e-5)
    scrambled = [[scramble_padding(t, mask) for t in bucket] for bucket in buckets]
    assert ckd_loss(student, scrambled, projections, mask).item() == pytest.approx(expected, rel=1e-5)


def test_alp_loss_matches_reference():
    mask = padding_mask()
    student = [torch.randn(B, S, 4), torch.randn(B, S, 4)]
    teacher = [torch.randn(B, S, 5) for _ in range(3)]
    projections = [torch.randn(4, 5) * 0.3, torch.randn(4, 5) * 0.3]
    expected = 0.0
    for s, w in zip(student, projections):
        mapped = s @ w
        combined = torch.zeros(B, S, 5)
        for b in range(B):
            scores = torch.tensor([float(mapped[b, 0] @ t[b, 0]) for t in teacher])
            alpha = scores.softmax(0)  # one α per example, from [CLS] ...
            combined[b] = sum(alpha[k] * teacher[k][b] for k in range(3))  # ... applied to every token
        expected += reference_masked_mse(mapped, combined, mask)
    got = alp_loss(student, [teacher, teacher], projections, mask)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    scrambled = [scramble_padding(t, mask) for t in teacher]
    assert alp_loss(student, [scrambled, scrambled], projections, mask).item() == pytest.approx(expected, rel=1e-5)
    # a single candidate layer gets α = 1: plain MSE to that layer
    single = alp_loss(student[:1], [teacher[:1]], projections[:1], mask)
    assert single.item() == pytest.approx(reference_masked_mse(student[0] @ projections[0], teacher[0], mask), rel=1e-5)


def test_xtremedistil_hidden_loss_matches_eq8():
    mask = padding_mask()
    student = [torch.randn(B, S, 4), torch.randn(B, S, 4)]
    teacher = [torch.randn(B, S, 6), torch.randn(B, S, 6)]
    up = torch.nn.Linear(4, 6)  # W^f h + b^f
    real = int(mask.sum())
    expected = 0.0
    with torch.no_grad():
        for s, t in zip(student, teacher):
            for b in range(B):
                for i in range(S):
                    if mask[b, i]:
                        expected += float(((up(s[b, i]) - t[b, i]) ** 2).sum()) / (2 * len(student) * real)
    got = xtremedistil_hidden_loss(student, teacher, up, mask)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    scrambled = xtremedistil_hidden_loss([scramble_padding(x, mask) for x in student], teacher, up, mask)
    assert scrambled.item() == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# attention losses: slow references with explicit loops over batch, heads and rows


def ref_distribution(left, right, b, head, heads, row, n_real):
    """softmax over the REAL keys only of left_h[row] · right_h[key] / sqrt(d_h), in float64."""
    d_h = left.shape[-1] // heads
    sl = slice(head * d_h, (head + 1) * d_h)
    q = left[b, row, sl].double()
    scores = torch.stack([q @ right[b, key, sl].double() for key in range(n_real)]) / math.sqrt(d_h)
    return scores.softmax(0)


def ref_kl(p, q):
    return float(sum(p[i] * (math.log(p[i]) - math.log(q[i])) for i in range(len(p))))


def ref_relation_kl(s_left, s_right, t_left, t_right, heads, mask):
    """Mean over heads and real rows of KL(teacher row ‖ student row); padding = trailing zeros in mask."""
    total, rows = 0.0, 0
    for b in range(s_left.shape[0]):
        n_real = int(mask[b].sum())
        for head in range(heads):
            for row in range(n_real):
                p_t = ref_distribution(t_left, t_right, b, head, heads, row, n_real)
                p_s = ref_distribution(s_left, s_right, b, head, heads, row, n_real)
                total += ref_kl(p_t, p_s)
                rows += 1
    return total / rows


def test_minilmv2_zero_for_identical_inputs():
    mask = padding_mask()
    x = torch.randn(B, S, 12)
    assert minilmv2_loss(x, x.clone(), 3, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert minilmv2_loss(x, x.clone(), 4).item() == pytest.approx(0.0, abs=1e-6)


def test_minilmv2_matches_slow_reference_with_padding():
    mask = padding_mask()
    student, teacher = torch.randn(B, S, 12), torch.randn(B, S, 24)  # d_r: 4 vs 8
    expected = ref_relation_kl(student, student, teacher, teacher, 3, mask)
    got = minilmv2_loss(student, teacher, 3, mask)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(expected, rel=1e-5)
    scrambled = minilmv2_loss(scramble_padding(student, mask), scramble_padding(teacher, mask), 3, mask)
    assert scrambled.item() == pytest.approx(expected, rel=1e-5)


def test_minilmv2_rejects_relation_heads_that_do_not_divide():
    with pytest.raises(KdnasError, match=r"relation heads 5 .*allowed: \[1, 2, 3, 4, 6, 12\]"):
        minilmv2_loss(torch.randn(1, 3, 12), torch.randn(1, 3, 24), 5)


def test_minilm_v1_zero_for_identical_inputs():
    mask = padding_mask()
    qkv = tuple(torch.randn(B, S, 8) for _ in range(3))
    assert minilm_v1_loss(qkv, tuple(t.clone() for t in qkv), 2, mask).item() == pytest.approx(0.0, abs=1e-6)


def test_minilm_v1_matches_slow_reference_with_padding():
    mask = padding_mask()
    qs, ks, vs = (torch.randn(B, S, 8) for _ in range(3))  # 2 heads of 4
    qt, kt, vt = (torch.randn(B, S, 16) for _ in range(3))  # 2 heads of 8
    expected = ref_relation_kl(qs, ks, qt, kt, 2, mask) + ref_relation_kl(vs, vs, vt, vt, 2, mask)
    got = minilm_v1_loss((qs, ks, vs), (qt, kt, vt), 2, mask)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    scrambled = minilm_v1_loss(
        tuple(scramble_padding(x, mask) for x in (qs, ks, vs)), tuple(scramble_padding(x, mask) for x in (qt, kt, vt)), 2, mask
    )
    assert scrambled.item() == pytest.approx(expected, rel=1e-5)


def test_xtremedistil_attention_loss_matches_eq9():
    mask = padding_mask()
    heads = 2
    student = [(torch.randn(B, S, 8), torch.randn(B, S, 8)) for _ in range(2)]
    teacher = [(torch.randn(B, S, 12), torch.randn(B, S, 12)) for _ in range(2)]
    real = int(mask.sum())
    expected = 0.0
    for (qs, ks), (qt, kt) in zip(student, teacher):
        for b in range(B):
            n_real = int(mask[b].sum())
            for a in range(heads):
                for i in range(n_real):
                    diff = ref_distribution(qs, ks, b, a, heads, i, n_real) - ref_distribution(qt, kt, b, a, heads, i, n_real)
                    expected += float((diff**2).sum()) / (2 * len(student) * heads * real)
    got = xtremedistil_attention_loss(student, teacher, heads, mask)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    scrambled = [(scramble_padding(q, mask), scramble_padding(k, mask)) for q, k in teacher]
    assert xtremedistil_attention_loss(student, scrambled, heads, mask).item() == pytest.approx(expected, rel=1e-5)
    assert xtremedistil_attention_loss(student, student, heads, mask).item() == pytest.approx(0.0, abs=1e-7)


def test_direct_minilm_matches_eq10_reference():
    mask = padding_mask()
    heads, d_rs, d_rt = 2, 3, 5
    student, teacher = torch.randn(B, S, heads * d_rs), torch.randn(B, S, heads * d_rt)
    w = torch.randn(heads, d_rs, d_rt)
    expected = 0.0
    for a in range(heads):  # Σ_a MSE(A^S_a W_a, A^T_a), averaged over heads like MiniLMv2
        s_a = student[..., a * d_rs : (a + 1) * d_rs] @ w[a]
        expected += reference_masked_mse(s_a, teacher[..., a * d_rt : (a + 1) * d_rt], mask) / heads
    assert direct_minilm_loss(student, teacher, w, mask).item() == pytest.approx(expected, rel=1e-5)
    scrambled = direct_minilm_loss(scramble_padding(student, mask), scramble_padding(teacher, mask), w, mask)
    assert scrambled.item() == pytest.approx(expected, rel=1e-5)


def test_direct_minilm_with_orthogonal_maps_equals_eq11():
    mask = padding_mask()
    heads, d_rs, d_rt = 3, 4, 6
    student, teacher = torch.randn(B, S, heads * d_rs), torch.randn(B, S, heads * d_rt)
    w = torch.empty(heads, d_rs, d_rt)
    for a in range(heads):
        torch.nn.init.orthogonal_(w[a])  # orthonormal rows: W Wᵀ = I
    assert torch.allclose(w @ w.transpose(1, 2), torch.eye(d_rs).expand(heads, -1, -1), atol=1e-5)
    # Eq. 11 computed independently, with no W at all: Σ_a MSE(A^S_a A^S_aᵀ, A^T_a A^T_aᵀ) over real token pairs
    expected = 0.0
    for a in range(heads):
        total, count = 0.0, 0
        for b in range(B):
            n = int(mask[b].sum())
            s_a = student[b, :n, a * d_rs : (a + 1) * d_rs].double()
            t_a = teacher[b, :n, a * d_rt : (a + 1) * d_rt].double()
            total += float(((s_a @ s_a.T - t_a @ t_a.T) ** 2).sum())
            count += n * n
        expected += total / count / heads
    got = direct_minilm_loss(student, teacher, w, mask, gram=True)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # and a teacher that IS the orthogonally mapped student is matched exactly by Eq. 10
    mapped = torch.cat([student[..., a * d_rs : (a + 1) * d_rs] @ w[a] for a in range(heads)], dim=-1)
    assert direct_minilm_loss(student, mapped, w, mask).item() == pytest.approx(0.0, abs=1e-10)


def test_softmax_losses_run_in_float32_under_bf16_autocast():
    mask = padding_mask()
    student, teacher = torch.randn(B, S, 12), torch.randn(B, S, 24)
    exact = minilmv2_loss(student, teacher, 3, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = minilmv2_loss(student.bfloat16(), teacher.bfloat16(), 3, mask)
        hs = hs_loss([student], [teacher], [torch.nn.Linear(12, 24)], mask)
    assert inside.dtype == torch.float32 and hs.dtype == torch.float32
    # only the bf16 rounding of the inputs remains, not bf16 matmul/softmax
    rounded = minilmv2_loss(student.bfloat16().float(), teacher.bfloat16().float(), 3, mask)
    assert inside.item() == pytest.approx(rounded.item(), rel=1e-5)
    assert inside.item() == pytest.approx(exact.item(), rel=0.05)


def test_fully_padded_example_gives_finite_losses():
    mask = padding_mask()
    mask[2] = 0
    x, y = torch.randn(B, S, 8, requires_grad=True), torch.randn(B, S, 8)
    losses = [
        minilmv2_loss(x, y, 2, mask),
        minilm_v1_loss((x, x, x), (y, y, y), 2, mask),
        xtremedistil_attention_loss([(x, x)], [(y, y)], 2, mask),
        masked_mse(x, y, mask),
    ]
    total = sum(losses)
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(x.grad).all()
    assert x.grad[2].abs().sum() == 0  # nothing flows from a fully padded example


# ---------------------------------------------------------------------------------------------
# SVD embedding init


def test_svd_init_reproduces_teacher_embeddings_when_sizes_match():
    """What is tested, precisely: with d_S = d_T the result X = U Σ equals E·V for the orthogonal
    V of E's SVD, so (a) the Gram matrix X Xᵀ equals E Eᵀ (all inner products between embeddings
    are preserved) and (b) the least-squares map Q with E Q = X is orthogonal and reconstructs X
    exactly, i.e. E = X Qᵀ: the teacher embeddings are reproduced up to a rotation."""
    embeddings = torch.randn(40, 8, dtype=torch.float64)
    init = svd_embedding_init(embeddings, 8)
    assert init.shape == (40, 8) and init.dtype == torch.float64
    assert torch.allclose(init @ init.T, embeddings @ embeddings.T, atol=1e-10)
    q = torch.linalg.lstsq(embeddings, init).solution
    assert torch.allclose(q.T @ q, torch.eye(8, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(init @ q.T, embeddings, atol=1e-10)


def test_svd_init_keeps_top_components():
    """With d_S < d_T: columns of U_k Σ_k are orthogonal with norms σ_1..σ_k (the top singular values),
    and X V_kᵀ (V_k the top right singular vectors) is the best rank-k approximation of E."""
    embeddings = torch.randn(50, 10)
    init = svd_embedding_init(embeddings, 4)
    sigma = torch.linalg.svdvals(embeddings.double())[:4]
    assert init.dtype == torch.float32
    assert torch.allclose((init.T @ init).double(), torch.diag(sigma**2), atol=1e-3)
    projection = torch.linalg.lstsq(embeddings.double(), init.double()).solution  # = V_k
    rank_k = init.double() @ projection.T
    best = torch.linalg.svdvals(embeddings.double())[4:].pow(2).sum()
    assert torch.allclose((embeddings.double() - rank_k).pow(2).sum(), best, rtol=1e-6)
    assert torch.equal(init, svd_embedding_init(embeddings, 4))  # deterministic signs
    with pytest.raises(KdnasError, match="student hidden 11 .*allowed: 1..10"):
        svd_embedding_init(embeddings, 11)
