"""Distillation losses, as pure functions: tensors in, a scalar tensor out.

Every loss states the paper and equation it implements (see docs/methods.md, which
restates them; "comparative" is Udagawa et al. 2023, "MiniLM" is Wang et al. 2020, "ALP-KD" is
Passban et al. 2021, "XtremeDistil" is Mukherjee et al. 2021). Learned projections are passed in,
as a matrix `[d_in, d_out]` (applied as `x @ W`), a callable (e.g. an `nn.Linear`), or `None`
(identity), so the functions themselves hold no state; `distill/methods.py` owns the parameters.

Conventions shared by all losses:
- activations are `[batch, seq, d]`; `attention_mask` is `[batch, seq]` with 1 = real token,
  0 = padding, and `None` means "no padding";
- padded *keys* get a large negative score before a softmax, padded *rows/positions* are excluded
  from every mean, so values at padded positions never change a loss;
- "MSE" is the mean over non-padded positions and features;
- everything is computed in float32 with autocast disabled: the trainer runs bf16 autocast on GPU,
  and a bf16 softmax/KL over hundreds of keys is too coarse to distill from.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence, Union

import torch
import torch.nn.functional as F

from kdnas.core.errors import InputError

Projection = Union[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], None]

LAYER_MAPS: tuple[str, ...] = ("single", "last", "uniform", "uniform-cons", "uniform+last")
CKD_OVERLAPS: tuple[str, ...] = ("NO", "PO")

# Score given to padded keys. Finite, so a fully padded row gives a uniform (not NaN) softmax; such
# rows are excluded from the means anyway. Far below any real float32 attention score.
_MASKED_SCORE = -1e9


# --------------------------------------------------------------------------------------------
# small helpers


def _fp32(t: torch.Tensor):
    """A context in which autocast is off on `t`'s device, so matmuls/softmax run in float32."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _token_mask(attention_mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The `[batch, seq]` boolean mask of real tokens for activations `like` `[batch, seq, ...]`."""
    if attention_mask is None:
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    if tuple(attention_mask.shape) != tuple(like.shape[:2]):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} does not match activations {tuple(like.shape)}")
    return attention_mask.to(device=like.device) != 0


def _same_tokens(student: torch.Tensor, teacher: torch.Tensor) -> None:
    if student.shape[:2] != teacher.shape[:2]:
        raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} differ in [batch, seq]")


def _project(x: torch.Tensor, projection: Projection) -> torch.Tensor:
    """Apply a learned map: matrix `[d_in, d_out]`, callable, or `None` (identity); float32 out."""
    if projection is None:
        return x.float()
    if isinstance(projection, torch.Tensor):
        return x.float() @ projection.float()
    weight = getattr(projection, "weight", None)
    if isinstance(weight, torch.Tensor):  # autocast is off here, so the input must match the weight dtype
        x = x.to(weight.dtype)
    return projection(x).float()


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """`[batch, seq, d]` -> `[batch, heads, seq, d / heads]` (the BERT head split, in float32)."""
    batch, seq, d = x.shape
    if d % heads:
        raise ValueError(f"hidden size {d} is not divisible by {heads} heads")
    return x.float().view(batch, seq, heads, d // heads).transpose(1, 2)


def _attention_log_probs(left: torch.Tensor, right: torch.Tensor, heads: int, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(left_a right_aᵀ / sqrt(d_head)) per head, padded keys masked: `[batch, heads, seq, seq]`.

    With left = Q, right = K this is the attention distribution (MiniLM Eq. 6); with left = right = A
    it is a self-relation (MiniLM Eq. 9, MiniLMv2 / comparative Eq. 7-8).
    """
    lhs, rhs = _split_heads(left, heads), _split_heads(right, heads)
    scores = lhs @ rhs.transpose(-1, -2) / math.sqrt(lhs.shape[-1])
    scores = scores.masked_fill(~tokens[:, None, None, :], _MASKED_SCORE)
    return scores.log_softmax(dim=-1)


def _mean_rowwise_kl(teacher_logp: torch.Tensor, student_logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over heads and non-padded rows of KL(teacher row ‖ student row); inputs `[B, H, S, S]`."""
    kl = teacher_logp.exp() * (teacher_logp - student_logp)
    kl = torch.where(tokens[:, None, None, :], kl, torch.zeros_like(kl)).sum(-1)  # [B, H, S]
    rows = tokens[:, None, :].expand_as(kl)
    return kl[rows].sum() / rows.sum().clamp_min(1)


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (n if limit is None else min(n, limit)) + 1) if n % d == 0]


def _check_positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{name}={value!r} is invalid: must be a positive integer")
    return value


# --------------------------------------------------------------------------------------------
# layer maps (comparative, Table 2) and relation heads


def layer_map(strategy: str, n_teacher: int, n_student: int) -> list[list[int]]:
    """The 1-based teacher layers φ(i) for each student layer i = 1..n_student (`[]` = unmapped).

    Comparative analysis, Table 2, with k = ceil(L_T / L_S):
      single        φ(L_S) = {L_T}, every other student layer unmapped
      last          φ(i) = {L_T − L_S + i}            (unmapped where that is < 1, i.e. L_S > L_T)
      uniform       φ(i) = {min(k·i, L_T)}
      uniform-cons  φ(i) = {k(i−1)+1, …, k·i} ∩ [1, L_T]   (METHODS choice; may leave the last
                    student layers unmapped when k·(L_S−1) ≥ L_T, e.g. 6→4 gives {1,2},{3,4},{5,6},{})
      uniform+last  φ(i) = uniform(i) ∪ last(i), sorted, unique
    Example L_T=12, L_S=4: uniform → [[3],[6],[9],[12]], uniform+last → [[3,9],[6,10],[9,11],[12]].
    """
    _check_positive_int("teacher layers", n_teacher)
    _check_positive_int("student layers", n_student)
    k = math.ceil(n_teacher / n_student)
    students = range(1, n_student + 1)
    if strategy == "single":
        return [[n_teacher] if i == n_student else [] for i in students]
    if strategy == "last":
        return [[n_teacher - n_student + i] if n_teacher - n_student + i >= 1 else [] for i in students]
    if strategy == "uniform":
        return [[min(k * i, n_teacher)] for i in students]
    if strategy == "uniform-cons":
        return [[j for j in range(k * (i - 1) + 1, k * i + 1) if j <= n_teacher] for i in students]
    if strategy == "uniform+last":
        uniform, last = layer_map("uniform", n_teacher, n_student), layer_map("last", n_teacher, n_student)
        return [sorted(set(u) | set(t)) for u, t in zip(uniform, last)]
    raise InputError(f"unknown layer map {strategy!r}; allowed: {', '.join(LAYER_MAPS)}")


def relation_head_choices(d_teacher: int, d_student: int) -> list[int]:
    """Relation-head counts A_r that divide both hidden sizes (the divisors of their gcd)."""
    return _divisors(math.gcd(d_teacher, d_student))


def default_relation_heads(d_teacher: int, d_student: int, preferred: int = 48) -> int:
    """Default A_r for MiniLMv2: the largest divisor ≤ `preferred` of gcd(d_T, d_S) keeping d_r ≥ 8.

    48 is the paper's value for a base teacher (comparative App. B; MiniLMv2). Small students need
    fewer heads so each relation head keeps at least 8 features on both sides: 384/192 → 24,
    768/384 → 48. Falls back to 1 when even that is impossible (a hidden size below 16).
    """
    _check_positive_int("teacher hidden", d_teacher)
    _check_positive_int("student hidden", d_student)
    smaller = min(d_teacher, d_student)
    fitting = [a for a in relation_head_choices(d_teacher, d_student) if a <= preferred and smaller // a >= 8]
    return max(fitting, default=1)


# --------------------------------------------------------------------------------------------
# output distribution and hidden-state transfer


def masked_mse(prediction: torch.Tensor, target: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error over non-padded positions and all features of `[batch, seq, d]` tensors."""
    _same_tokens(prediction, target)
    with _fp32(prediction):
        tokens = _token_mask(attention_mask, prediction)
        squared = (prediction.float() - target.float()).pow(2)
        squared = torch.where(tokens[..., None], squared, torch.zeros_like(squared))
        return squared.sum() / (tokens.sum().clamp_min(1) * squared.shape[-1])


def od_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Output-distribution transfer, comparative Eq. 5: τ² · KL(softmax(z_T/τ) ‖ softmax(z_S/τ)).

    The paper writes CE(p_T, p_S); CE = KL + H(p_T), and the teacher entropy H(p_T) does not depend
    on the student, so the gradients are identical. We use the KL form so a perfect student scores 0.
    Logits are `[..., vocab]`; `mask` (same leading shape, 1 = use) selects the positions, e.g. the
    masked-LM positions; the result is the mean over selected positions (0 when none is selected).
    """
    if not temperature > 0:
        raise InputError(f"temperature={temperature!r} is invalid: must be > 0")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} != teacher logits {tuple(teacher_logits.shape)}")
    if mask is not None:
        if tuple(mask.shape) != tuple(student_logits.shape[:-1]):
            raise ValueError(f"OD mask shape {tuple(mask.shape)} does not match logits positions "
                             f"{tuple(student_logits.shape[:-1])}")
        # Select the positions first: an fp32 log-softmax over the whole vocabulary at every position
        # would cost ~7x more than at the 15 % that masked-LM distillation scores.
        selected = mask.to(student_logits.device) != 0
        student_logits, teacher_logits = student_logits[selected], teacher_logits[selected]
    with _fp32(student_logits):
        student_logp = (student_logits.float() / temperature).log_softmax(-1)
        teacher_logp = (teacher_logits.float() / temperature).log_softmax(-1)
        kl = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)  # [positions]
        if kl.numel() == 0:
            return student_logits.float().sum() * 0.0  # nothing selected: 0, still part of the graph
        return kl.mean() * temperature**2


def hs_pair_losses(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    projections: Sequence[Projection],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-pair terms MSE(H_i^S W_i^j, H_j^T) of comparative Eq. 6, as a `[pairs]` tensor.

    Pair p is (student[p], teacher[p], projections[p]). Kept separate from `hs_loss` so an evaluator
    can normalise each pair by its teacher layer's variance (the KD-NAS reward, docs/methods.md).
    """
    if not (len(student) == len(teacher) == len(projections)) or not student:
        raise ValueError(f"hs pairs: got {len(student)} student, {len(teacher)} teacher, {len(projections)} projections")
    with _fp32(student[0]):
        return torch.stack(
            [masked_mse(_project(s, w), t, attention_mask) for s, t, w in zip(student, teacher, projections)]
        )


def hs_loss(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    projections: Sequence[Projection],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hidden-state transfer, comparative Eq. 6: L_HS = Σ_(i,j mapped) MSE(H_i^S W_i^j, H_j^T).

    The caller lists one entry per mapped pair (a student layer appears once per teacher layer in
    φ(i)); W_i^j ∈ R^{d_S×d_T} is learned (identity is not assumed even when d_S = d_T).
    """
    return hs_pair_losses(student, teacher, projections, attention_mask).sum()


# --------------------------------------------------------------------------------------------
# attention transfer: MiniLMv2, DirectMiniLM, MiniLM v1


def minilmv2_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    num_relation_heads: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """MiniLMv2 self-relation transfer for ONE of Q, K or V, comparative Eq. 7-9.

    `student` `[B, S, d_S]`, `teacher` `[B, S, d_T]` (all heads concatenated, before the head split)
    are re-split into A_r relation heads of size d_r = d / A_r on each side, and
    R = softmax(A Aᵀ / sqrt(d_r)) `[B, A_r, S, S]` (padded keys masked). Returns the mean over relation
    heads (the paper sums them: kdnas averages, for this loss and DirectMiniLM alike, so the scale
    does not depend on A_r) and non-padded rows of the row-wise KL(R^T ‖ R^S). No learned parameters. A_r must divide
    both hidden sizes. The method sums this over α ∈ {Q, K, V}.
    """
    _same_tokens(student, teacher)
    for side, d in (("student", student.shape[-1]), ("teacher", teacher.shape[-1])):
        if d % num_relation_heads:
            raise InputError(
                f"relation heads {num_relation_heads} does not divide the {side} hidden size {d}; "
                f"allowed: {relation_head_choices(student.shape[-1], teacher.shape[-1])}"
            )
    with _fp32(student):
        tokens = _token_mask(attention_mask, student)
        student_logp = _attention_log_probs(student, student, num_relation_heads, tokens)
        teacher_logp = _attention_log_probs(teacher, teacher, num_relation_heads, tokens)
        return _mean_rowwise_kl(teacher_logp, student_logp, tokens)


def direct_minilm_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    projections: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    gram: bool = False,
) -> torch.Tensor:
    """DirectMiniLM for ONE of Q, K or V, comparative Eq. 10: Σ_a MSE(A^S_a W_a, A^T_a), taken as
    (1/A_r) Σ_a — the same convention as `minilmv2_loss` (docs/methods.md): the mean over relation heads,
    which only rescales the paper's sum by 1/A_r and keeps the loss scale independent of A_r.

    `projections` `[A_r, d_r^S, d_r^T]` holds one learned W_a per relation head (A_r is its first
    size; the paper uses A_r = number of attention heads). Each head's MSE is the mean over
    non-padded positions and its d_r^T features.

    `gram=True` compares the per-head Gram matrices instead, MSE((A^S_a W_a)(A^S_a W_a)ᵀ, A^T_a A^T_aᵀ)
    over pairs of real tokens: the "matrix product of each term" of §3 that, for orthogonal W
    (W Wᵀ = I), is exactly Eq. 11, Σ_a MSE(A^S_a A^S_aᵀ, A^T_a A^T_aᵀ). It exists for that check.
    """
    _same_tokens(student, teacher)
    heads = projections.shape[0]
    with _fp32(student):
        tokens = _token_mask(attention_mask, student)
        mapped = _split_heads(student, heads) @ projections.float()[None]  # [B, A_r, S, d_r^T]
        target = _split_heads(teacher, heads)
        if mapped.shape != target.shape:
            raise ValueError(f"projected student heads {tuple(mapped.shape)} do not match teacher heads {tuple(target.shape)}")
        if gram:
            mapped, target = mapped @ mapped.transpose(-1, -2), target @ target.transpose(-1, -2)
            valid = (tokens[:, :, None] & tokens[:, None, :])[:, None, :, :]  # [B, 1, S, S]
        else:
            valid = tokens[:, None, :, None]  # [B, 1, S, 1]
        squared = (mapped - target).pow(2)
        squared = torch.where(valid, squared, torch.zeros_like(squared))
        count = valid.sum() * (1 if gram else squared.shape[-1])  # real entries per head
        per_head = squared.sum(dim=(0, 2, 3)) / count.clamp_min(1)
        return per_head.mean()


def minilm_v1_loss(
    student_qkv: Sequence[torch.Tensor],
    teacher_qkv: Sequence[torch.Tensor],
    num_heads: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """MiniLM (v1) last-layer transfer, MiniLM Eq. 6-10: L_AT + L_VR.

    `*_qkv` = (Q, K, V) of the last layer, each `[B, S, d]`; both sides split into the SAME number
    of heads (head sizes may differ). L_AT = 1/(A_h|x|) Σ_a Σ_t KL(A^T_{a,t} ‖ A^S_{a,t}) with
    A = softmax(Q Kᵀ / sqrt(d_k)); L_VR is the same on softmax(V Vᵀ / sqrt(d_k)). Means run over heads
    and non-padded rows of the whole batch; padded keys are masked.
    """
    (qs, ks, vs), (qt, kt, vt) = student_qkv, teacher_qkv
    _same_tokens(qs, qt)
    with _fp32(qs):
        tokens = _token_mask(attention_mask, qs)
        attention = _mean_rowwise_kl(
            _attention_log_probs(qt, kt, num_heads, tokens), _attention_log_probs(qs, ks, num_heads, tokens), tokens
        )
        value_relation = _mean_rowwise_kl(
            _attention_log_probs(vt, vt, num_heads, tokens), _attention_log_probs(vs, vs, num_heads, tokens), tokens
        )
        return attention + value_relation


# --------------------------------------------------------------------------------------------
# PKD, CKD, ALP-KD (ALP-KD paper, Eq. 3-7)


def pkd_loss(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    projections: Sequence[Projection],
) -> torch.Tensor:
    """Patient KD, ALP-KD Eq. 3-4: Σ_pairs ‖ h_S/‖h_S‖ − h_T/‖h_T‖ ‖² on the [CLS] vector.

    Pair p is (student[p], teacher[p], projections[p]); the projection maps the student to d_T
    when the sizes differ (`None` = identity). Mean over the batch. Only position 0 ([CLS]) is read,
    which is never padding, so no attention mask is needed.
    """
    if not (len(student) == len(teacher) == len(projections)) or not student:
        raise ValueError(f"pkd pairs: got {len(student)} student, {len(teacher)} teacher, {len(projections)} projections")
    with _fp32(student[0]):
        total = student[0].new_zeros((), dtype=torch.float32)
        for s, t, w in zip(student, teacher, projections):
            s_cls = F.normalize(_project(s[:, :1], w)[:, 0], dim=-1)
            t_cls = F.normalize(t[:, 0].float(), dim=-1)
            total = total + (s_cls - t_cls).pow(2).sum(-1).mean()
        return total


def ckd_buckets(n_teacher: int, n_student: int, overlap: str = "NO") -> list[list[int]]:
    """Teacher-layer buckets for CKD / bucketed ALP (ALP-KD §3-4), one bucket per student layer.

    NO: the L_T teacher layers split into L_S consecutive buckets of near-equal size (the first
    L_T mod L_S buckets get one more layer). PO: each bucket also takes the first layer of the next
    one, as in the paper's 1-5, 5-9, 9-12. When L_S > L_T, student layer i gets {ceil(i·L_T/L_S)}.
    12 teacher, 4 student: NO → [1-3],[4-6],[7-9],[10-12]; PO → [1-4],[4-7],[7-10],[10-12].
    """
    _check_positive_int("teacher layers", n_teacher)
    _check_positive_int("student layers", n_student)
    if overlap not in CKD_OVERLAPS:
        raise InputError(f"unknown CKD overlap {overlap!r}; allowed: {', '.join(CKD_OVERLAPS)}")
    if n_student > n_teacher:
        return [[math.ceil(i * n_teacher / n_student)] for i in range(1, n_student + 1)]
    size, extra = divmod(n_teacher, n_student)
    buckets, start = [], 1
    for i in range(n_student):
        end = start + size + (1 if i < extra else 0)
        buckets.append(list(range(start, end)))
        start = end
    if overlap == "PO":
        buckets = [b + [buckets[i + 1][0]] if i + 1 < len(buckets) else b for i, b in enumerate(buckets)]
    return buckets


def ckd_loss(
    student: Sequence[torch.Tensor],
    teacher_buckets: Sequence[Sequence[torch.Tensor]],
    projections: Sequence[Projection],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Combinatorial KD (CKD, the ALP-KD paper's baseline): Σ_j MSE(h_S^j, P_j [h_T^k ; k ∈ bucket j]).

    The teacher layers of bucket j are concatenated on the feature axis and linearly projected
    (`projections[j]`, `[|bucket|·d_T] → d_S`) to the student's size; MSE over all real tokens.
    """
    if not (len(student) == len(teacher_buckets) == len(projections)) or not student:
        raise ValueError("ckd: need one teacher bucket and one projection per student layer")
    with _fp32(student[0]):
        terms = [
            masked_mse(s, _project(torch.cat([t.float() for t in bucket], dim=-1), w), attention_mask)
            for s, bucket, w in zip(student, teacher_buckets, projections)
        ]
        return torch.stack(terms).sum()


def alp_loss(
    student: Sequence[torch.Tensor],
    teacher_candidates: Sequence[Sequence[torch.Tensor]],
    projections: Sequence[Projection],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """ALP-KD, ALP-KD Eq. 5-6: Σ_j MSE(P h_S^j, C^j), C^j = Σ_k α_jk H_k^T, α_jk = softmax_k(⟨P h_S^j, h_T^k⟩).

    `teacher_candidates[j]` are the teacher layers student layer j attends over (all layers: Eq. 6;
    its bucket: Eq. 5). `projections[j]` maps d_S → d_T (`None` when the sizes are equal). METHODS
    choice: α is computed per example from the [CLS] vectors (plain dot product, as in the paper)
    and the same weights combine every token of that example; MSE over all real tokens.
    """
    if not (len(student) == len(teacher_candidates) == len(projections)) or not student:
        raise ValueError("alp: need one candidate list and one projection per student layer")
    with _fp32(student[0]):
        terms = []
        for s, candidates, w in zip(student, teacher_candidates, projections):
            mapped = _project(s, w)  # [B, S, d_T]
            stack = torch.stack([t.float() for t in candidates], dim=1)  # [B, K, S, d_T]
            alpha = torch.einsum("bd,bkd->bk", mapped[:, 0], stack[:, :, 0]).softmax(-1)
            combined = torch.einsum("bk,bksd->bsd", alpha, stack)
            terms.append(masked_mse(mapped, combined, attention_mask))
        return torch.stack(terms).sum()


# --------------------------------------------------------------------------------------------
# XtremeDistilTransformers (§3)


def xtremedistil_hidden_loss(
    student: Sequence[torch.Tensor],
    teacher: Sequence[torch.Tensor],
    projection: Projection,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-layer hidden transfer, XtremeDistil Eq. 8: Σ_l Σ_i ‖W^f h^S_l(x_i) + b^f − h^T_l'(x_i)‖² / (2·L·|x|).

    Pairs are aligned by the caller (student l ↔ teacher L_T − L_S + l); `projection` is the one
    shared affine up-projection (W^f, b^f). ‖·‖² sums the features; |x| is the number of real tokens
    in the batch; L is the number of aligned pairs (= L_S when L_S ≤ L_T). The paper's leading minus
    sign is an extraction artefact: this is minimised.
    """
    if len(student) != len(teacher) or not student:
        raise ValueError(f"xtremedistil: got {len(student)} student and {len(teacher)} teacher layers")
    with _fp32(student[0]):
        terms = [masked_mse(_project(s, projection), t, attention_mask) * t.shape[-1] for s, t in zip(student, teacher)]
        return torch.stack(terms).sum() / (2 * len(terms))


def xtremedistil_attention_loss(
    student_qk: Sequence[tuple[torch.Tensor, torch.Tensor]],
    teacher_qk: Sequence[tuple[torch.Tensor, torch.Tensor]],
    num_heads: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-layer attention transfer, XtremeDistil Eq. 9: Σ_l Σ_a Σ_i ‖A^S_{l,a}(x_i) − A^T_{l',a}(x_i)‖² / (2·L·A·|x|).

    A_{l,a} = softmax(Q Kᵀ / sqrt(d_k)) is head a's attention distribution `[S, S]` (what the
    reference code reads via `output_attentions`); row i is token i's distribution over keys.
    Same head count on both sides. |x| = real tokens in the batch; padded rows and keys excluded.
    """
    if len(student_qk) != len(teacher_qk) or not student_qk:
        raise ValueError(f"xtremedistil: got {len(student_qk)} student and {len(teacher_qk)} teacher layers")
    with _fp32(student_qk[0][0]):
        tokens = _token_mask(attention_mask, student_qk[0][0])
        terms = []
        for (qs, ks), (qt, kt) in zip(student_qk, teacher_qk):
            _same_tokens(qs, qt)
            diff = _attention_log_probs(qs, ks, num_heads, tokens).exp() - _attention_log_probs(qt, kt, num_heads, tokens).exp()
            squared = torch.where(tokens[:, None, None, :], diff.pow(2), torch.zeros_like(diff)).sum(-1)  # [B, A, S]
            rows = tokens[:, None, :].expand_as(squared)
            terms.append(squared[rows].sum() / rows.sum().clamp_min(1))  # mean over heads and real rows
        return torch.stack(terms).sum() / (2 * len(terms))


# --------------------------------------------------------------------------------------------
# sentence-embedding transfer (docs/methods.md, "Embedding-level distillation")


def mean_pool(states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`e = Σ_t m_t h_t / Σ_t m_t`: the masked mean of `[batch, seq, d]` states, `[batch, d]` in float32
    (the sentence-transformers pooling of the bundled teachers)."""
    with _fp32(states):
        tokens = _token_mask(attention_mask, states).float()[..., None]
        return (states.float() * tokens).sum(1) / tokens.sum(1).clamp_min(1.0)


def pooled_cosine_loss(student: torch.Tensor, teacher: torch.Tensor, projection: Projection = None) -> torch.Tensor:
    """`L_cos = mean_batch (1 − ê_S · ê_T)` on pooled embeddings `[batch, d]`, ê = e/‖e‖.

    The student's embedding goes through `projection` (`W ∈ R^{H_S×H_T}`) first when the widths differ.
    """
    with _fp32(student):
        s = F.normalize(_project(student, projection), dim=-1)
        return (1 - (s * F.normalize(teacher.float(), dim=-1)).sum(-1)).mean()


def relation_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """`L_rel = mean_{i,k} ((ê_S,i · ê_S,k) − (ê_T,i · ê_T,k))²` over the batch's pairs, `[batch, d]` in.

    Width-free: it transfers the similarity geometry that sentence-embedding users consume.
    """
    with _fp32(student):
        s, t = F.normalize(student.float(), dim=-1), F.normalize(teacher.float(), dim=-1)
        return (s @ s.T - t @ t.T).pow(2).mean()


def anchor_relation_loss(student: torch.Tensor, teacher: torch.Tensor, anchors: torch.Tensor,
                         projection: Projection = None) -> torch.Tensor:
    """`L_anc = mean_{i,j} ((ê_S,i · â_j) − (ê_T,i · â_j))²` against `[n, H_T]` teacher anchor embeddings.

    SEED-style (Fang et al., 2021) cross-model relation: each student embedding (through
    `projection` when the widths differ) must relate to many teacher embeddings of other sentences as
    its own teacher embedding does — the pairwise-similarity structure that a batch of 32 samples
    thinly. The anchors are detached teacher embeddings of earlier batches (a queue).
    """
    with _fp32(student):
        s = F.normalize(_project(student, projection), dim=-1)
        t = F.normalize(teacher.float(), dim=-1)
        a = F.normalize(anchors.float(), dim=-1)
        return (s @ a.T - t @ a.T).pow(2).mean()


def token_state_loss(student: torch.Tensor, teacher: torch.Tensor, projection: Projection = None,
                     attention_mask: torch.Tensor | None = None, *, per_feature: bool = True) -> torch.Tensor:
    """`L_tok = mean over real tokens and features of (h_S W − h_T)² / Var_T(feature)`.

    The variance is the teacher's, per feature, over the batch's real tokens, so a few outlier
    dimensions (sentence encoders have some) do not dominate; predicting the mean scores 1.0.

    With `per_feature=False` it is `L_mse = mean (h_S W − h_T)² / mean_f Var_T(f)`: the plain MSE,
    scaled only so that predicting the mean still scores 1.0. There the large-variance features
    weigh as much as they do in the mean-pooled, normalised embedding whose cosines users compare.
    """
    _same_tokens(student, teacher)
    with _fp32(student):
        tokens = _token_mask(attention_mask, student)
        target = teacher.float()[tokens]
        variance = target.var(0, unbiased=False)
        variance = (variance if per_feature else variance.mean()).clamp_min(1e-6).detach()
        return ((_project(student, projection)[tokens] - target).pow(2) / variance).mean()


def svd_embedding_init(teacher_word_embeddings: torch.Tensor, d_student: int) -> torch.Tensor:
    """SVD embedding factorisation, XtremeDistil §3.1: the student's word embeddings U_k Σ_k `[V, d_S]`.

    E = U Σ Vᵀ (thin SVD of the `[V, d_T]` teacher matrix); keeping the top k = d_S components gives
    the best rank-k reconstruction E ≈ (U_k Σ_k) V_kᵀ, so the returned rows are the coordinates of
    each teacher embedding in its top-d_S principal subspace (no centring). Equivalently U_k Σ_k =
    E V_k. Signs are fixed (largest |entry| of each V column positive) so the result is deterministic.
    Computed in float64, returned in the input's dtype.
    """
    vocab, d_teacher = teacher_word_embeddings.shape
    _check_positive_int("student hidden", d_student)
    if d_student > min(vocab, d_teacher):
        raise InputError(
            f"SVD embedding init: student hidden {d_student} exceeds the teacher embedding rank bound "
            f"min(vocab {vocab}, hidden {d_teacher}); allowed: 1..{min(vocab, d_teacher)}"
        )
    with _fp32(teacher_word_embeddings):
        u, sigma, vh = torch.linalg.svd(teacher_word_embeddings.double(), full_matrices=False)
        u, sigma, vh = u[:, :d_student], sigma[:d_student], vh[:d_student]
        columns = torch.arange(d_student, device=vh.device)
        signs = torch.sign(vh[columns, vh.abs().argmax(dim=1)])
        signs[signs == 0] = 1
        return (u * (sigma * signs)).to(teacher_word_embeddings.dtype)
