"""Distillation methods: small `nn.Module`s that own a method's learned projections and call the
pure losses in `distill/losses.py`.

    method = build_method("hs", teacher_dims, student_dims, layer_map="uniform+last")
    method.teacher_needs()   # what the teacher cache must store
    method.student_needs()   # what the student hooks must capture
    loss = method(student_activations, teacher_activations, attention_mask)

A method's projections are ordinary parameters (`method.parameters()`), so the trainer's optimiser
trains them together with the student. Options are validated when the method is built: a bad
value raises `InputError` naming it and what is allowed. An option left at `None` takes its default;
an option that does not apply to the method is an error (see `method_options`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .activations import Activations, ModelDims, Needs
from kdnas.core.errors import InputError, check_choice
from .losses import (
    CKD_OVERLAPS,
    LAYER_MAPS,
    alp_loss,
    ckd_buckets,
    ckd_loss,
    default_relation_heads,
    direct_minilm_loss,
    hs_pair_losses,
    layer_map,
    minilm_v1_loss,
    mean_pool,
    minilmv2_loss,
    od_loss,
    pooled_cosine_loss,
    anchor_relation_loss,
    relation_loss,
    token_state_loss,
    pkd_loss,
    relation_head_choices,
    xtremedistil_attention_loss,
    xtremedistil_hidden_loss,
)

METHODS: tuple[str, ...] = ("hs", "minilmv2", "direct-minilm", "minilm", "pkd", "ckd", "alp", "xtremedistil", "od",
                             "embed")
EMBED_TERMS: tuple[str, ...] = ("mse", "tok", "cos", "rel", "anc", "mid")
# Token states by plain MSE, not per feature: fidelity rho 0.902 against 0.896 with `tok` on MiniLM
# 3x12x384x1280, 1,200 fp32 steps (docs/design/final-recipe.md, "Which token-state loss").
EMBED_DEFAULT_TERMS = "mse+cos+rel"
ANCHORS = 2048  # teacher embeddings of recent batches that L_anc relates each student embedding to
TEACHER_LAYERS: tuple[str, ...] = ("L", "L-1", "L-2")
ALP_SCOPES: tuple[str, ...] = ("all", "bucket")

# The options each method accepts, with their defaults (None = computed from the shapes).
_OPTIONS: dict[str, dict[str, object]] = {
    "hs": {"layer_map": "uniform"},
    "minilmv2": {"relation_heads": None, "teacher_layer": "L"},
    "direct-minilm": {"relation_heads": None, "teacher_layer": "L"},
    "minilm": {},
    "pkd": {"layer_map": "uniform"},
    "ckd": {"ckd_overlap": "NO"},
    "alp": {"alp_scope": "all", "ckd_overlap": None},
    "xtremedistil": {},
    "od": {"temperature": 1.0},
    "embed": {"embed_terms": EMBED_DEFAULT_TERMS},
}


def method_options(name: str) -> dict[str, object]:
    """The options `name` accepts and their defaults (None: derived from the model shapes)."""
    _check_name(name)
    return dict(_OPTIONS[name])


def teacher_assistant_advised(teacher: ModelDims, student: ModelDims) -> bool:
    """MiniLM §3.3: distil through an assistant (L_T layers, d_S hidden) when L_S ≤ L_T/2 and d_S ≤ d_T/2."""
    return 2 * student.layers <= teacher.layers and 2 * student.hidden <= teacher.hidden


# --------------------------------------------------------------------------------------------
# the base class and small helpers


class Method(nn.Module):
    """A distillation method: its needs, its learned parameters, and its loss."""

    name: str = ""

    def __init__(self, teacher: ModelDims, student: ModelDims) -> None:
        super().__init__()
        self.teacher_dims, self.student_dims = teacher, student

    def teacher_needs(self) -> Needs:
        """What the teacher cache must store for `forward`."""
        raise NotImplementedError

    def student_needs(self) -> Needs:
        """What the student forward must capture for `forward`."""
        raise NotImplementedError

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        """The scalar loss for one batch (`attention_mask` `[batch, seq]`, 1 = real token)."""
        raise NotImplementedError


def _get(activations: dict[int, torch.Tensor], layer: int, side: str, what: str) -> torch.Tensor:
    """activations[layer], with a message that says which capture is missing (a wiring bug)."""
    if layer not in activations:
        raise KeyError(f"{side} activations lack {what} of layer {layer}; capture what {side}_needs() lists")
    return activations[layer]


def _qkv(activations: Activations, layer: int, side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        _get(activations.query, layer, side, "query"),
        _get(activations.key, layer, side, "key"),
        _get(activations.value, layer, side, "value"),
    )


def _qk(activations: Activations, layer: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K only: the attention distribution softmax(QKᵀ) does not read V (Needs.qkv still stores it)."""
    return _get(activations.query, layer, side, "query"), _get(activations.key, layer, side, "key")


def _check_name(name: str) -> None:
    if name not in METHODS:
        raise InputError(f"unknown distillation method {name!r}; allowed: {', '.join(METHODS)}")


def _check_dims(side: str, dims: ModelDims) -> None:
    for field in ("layers", "hidden", "heads"):
        value = getattr(dims, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{side} {field}={value!r} is invalid: must be a positive integer")
    if dims.hidden % dims.heads:
        raise InputError(f"{side} hidden={dims.hidden} is not divisible by heads={dims.heads}")


def _choice(option: str, value: object, allowed: tuple[str, ...]) -> str:
    check_choice(option, value, allowed)
    return str(value)


def _teacher_layer(option: object, teacher: ModelDims) -> int:
    """'L' / 'L-1' / 'L-2' -> a 1-based teacher layer (comparative Table 2, MHA transfer)."""
    choice = _choice("teacher_layer", option, TEACHER_LAYERS)
    layer = teacher.layers - TEACHER_LAYERS.index(choice)
    if layer < 1:
        possible = ", ".join(TEACHER_LAYERS[: teacher.layers])
        raise InputError(f"teacher_layer={choice!r} needs more than {teacher.layers} teacher layers; allowed here: {possible}")
    return layer


def _relation_heads(option: object, default: int, teacher: ModelDims, student: ModelDims) -> int:
    choices = relation_head_choices(teacher.hidden, student.hidden)
    if option is None:
        return default
    if not isinstance(option, int) or isinstance(option, bool) or option not in choices:
        raise InputError(
            f"relation_heads={option!r} must divide both hidden sizes ({teacher.hidden}, {student.hidden}); "
            f"allowed: {', '.join(map(str, choices))}"
        )
    return option


def _equal_heads(method: str, teacher: ModelDims, student: ModelDims) -> None:
    if teacher.heads != student.heads:
        raise InputError(
            f"method {method!r} needs equal attention heads, but teacher has {teacher.heads} and student "
            f"{student.heads}; use minilmv2 (any head counts) or hs, or give the student {teacher.heads} heads"
        )


def _linear(d_in: int, d_out: int, bias: bool = False) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=bias)


def _layer_map(strategy: str, teacher: ModelDims, student: ModelDims) -> list[list[int]]:
    return layer_map(strategy, teacher.layers, student.layers)


# --------------------------------------------------------------------------------------------
# hidden-state methods


class _MappedLayersMethod(Method):
    """A method over (student layer, teacher layer) hidden-state pairs chosen by a layer map."""

    def __init__(self, teacher: ModelDims, student: ModelDims, layer_map: str = "uniform") -> None:
        super().__init__(teacher, student)
        self.layer_map = _choice("layer_map", layer_map, LAYER_MAPS)
        self.pairs = [(i, j) for i, js in enumerate(_layer_map(self.layer_map, teacher, student), 1) for j in js]

    def teacher_needs(self) -> Needs:
        return Needs(hidden=frozenset(j for _, j in self.pairs))

    def student_needs(self) -> Needs:
        return Needs(hidden=frozenset(i for i, _ in self.pairs))


class HSMethod(_MappedLayersMethod):
    """Hidden-state transfer (comparative Eq. 6): one learned W_i^j per mapped (student i, teacher j)."""

    name = "hs"

    def __init__(self, teacher: ModelDims, student: ModelDims, layer_map: str = "uniform") -> None:
        super().__init__(teacher, student, layer_map)
        self.projections = nn.ModuleDict({f"s{i}_t{j}": _linear(student.hidden, teacher.hidden) for i, j in self.pairs})

    def pair_losses(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        """`[len(self.pairs)]` raw per-pair MSEs, for the variance-normalised L_HS of the KD-NAS reward."""
        return hs_pair_losses(
            [_get(student.hidden, i, "student", "hidden state") for i, _ in self.pairs],
            [_get(teacher.hidden, j, "teacher", "hidden state") for _, j in self.pairs],
            [self.projections[f"s{i}_t{j}"] for i, j in self.pairs],
            attention_mask,
        )

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.pair_losses(student, teacher, attention_mask).sum()


class PKDMethod(_MappedLayersMethod):
    """Patient KD (ALP-KD Eq. 3-4) on [CLS]; student projected to d_T per pair when sizes differ."""

    name = "pkd"

    def __init__(self, teacher: ModelDims, student: ModelDims, layer_map: str = "uniform") -> None:
        super().__init__(teacher, student, layer_map)
        project = student.hidden != teacher.hidden
        self.projections = nn.ModuleDict(
            {f"s{i}_t{j}": _linear(student.hidden, teacher.hidden) for i, j in self.pairs} if project else {}
        )

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        return pkd_loss(
            [_get(student.hidden, i, "student", "hidden state") for i, _ in self.pairs],
            [_get(teacher.hidden, j, "teacher", "hidden state") for _, j in self.pairs],
            [self.projections[f"s{i}_t{j}"] if self.projections else None for i, j in self.pairs],
        )


class _LayerGroupsMethod(Method):
    """A method where student layer j learns from a group of teacher layers, `groups[j-1]`
    (CKD's buckets, ALP-KD's candidates): both sides' hidden states, layer by layer."""

    groups: list[list[int]]

    def teacher_needs(self) -> Needs:
        return Needs(hidden=frozenset(k for group in self.groups for k in group))

    def student_needs(self) -> Needs:
        return Needs(hidden=frozenset(range(1, self.student_dims.layers + 1)))

    def states(self, student: Activations, teacher: Activations) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """Student layer j's hidden state, and the hidden states of its teacher group, for each j."""
        return ([_get(student.hidden, j, "student", "hidden state") for j in range(1, len(self.groups) + 1)],
                [[_get(teacher.hidden, k, "teacher", "hidden state") for k in group] for group in self.groups])


class CKDMethod(_LayerGroupsMethod):
    """CKD: each student layer j learns P_j from its concatenated teacher bucket to d_S (NO / PO buckets)."""

    name = "ckd"

    def __init__(self, teacher: ModelDims, student: ModelDims, ckd_overlap: str = "NO") -> None:
        super().__init__(teacher, student)
        self.ckd_overlap = _choice("ckd_overlap", ckd_overlap, CKD_OVERLAPS)
        self.groups = ckd_buckets(teacher.layers, student.layers, self.ckd_overlap)
        self.projections = nn.ModuleList(_linear(len(b) * teacher.hidden, student.hidden) for b in self.groups)

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        return ckd_loss(*self.states(student, teacher), list(self.projections), attention_mask)


class ALPMethod(_LayerGroupsMethod):
    """ALP-KD (Eq. 6 over all teacher layers, or Eq. 5 over CKD buckets); P_j per student layer when d_S ≠ d_T."""

    name = "alp"

    def __init__(self, teacher: ModelDims, student: ModelDims, alp_scope: str = "all", ckd_overlap: str | None = None) -> None:
        super().__init__(teacher, student)
        self.alp_scope = _choice("alp_scope", alp_scope, ALP_SCOPES)
        if self.alp_scope == "all":
            if ckd_overlap is not None:
                raise InputError(f"ckd_overlap={ckd_overlap!r} only applies to alp with alp_scope='bucket' (got 'all')")
            self.groups = [list(range(1, teacher.layers + 1)) for _ in range(student.layers)]
        else:
            overlap = _choice("ckd_overlap", "NO" if ckd_overlap is None else ckd_overlap, CKD_OVERLAPS)
            self.groups = ckd_buckets(teacher.layers, student.layers, overlap)
        project = student.hidden != teacher.hidden
        self.projections = nn.ModuleList(
            _linear(student.hidden, teacher.hidden) for _ in range(student.layers) if project
        )

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        projections = list(self.projections) if len(self.projections) else [None] * len(self.groups)
        return alp_loss(*self.states(student, teacher), projections, attention_mask)


class _QKVRelationMethod(Method):
    """A method that relates the queries, keys and values of one teacher layer (`teacher_layer`) to
    those of the student's last layer (the MiniLM family)."""

    teacher_layer: int

    def teacher_needs(self) -> Needs:
        return Needs(qkv=frozenset({self.teacher_layer}))

    def student_needs(self) -> Needs:
        return Needs(qkv=frozenset({self.student_dims.layers}))

    def qkv(self, student: Activations, teacher: Activations) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """(student Q, K, V), (teacher Q, K, V) of the two related layers."""
        return _qkv(student, self.student_dims.layers, "student"), _qkv(teacher, self.teacher_layer, "teacher")


class MiniLMv2Method(_QKVRelationMethod):
    """MiniLMv2 (comparative Eq. 7-9): Q-Q, K-K, V-V relations of one teacher layer → the last student layer."""

    name = "minilmv2"

    def __init__(
        self, teacher: ModelDims, student: ModelDims, relation_heads: int | None = None, teacher_layer: str = "L"
    ) -> None:
        super().__init__(teacher, student)
        self.teacher_layer = _teacher_layer(teacher_layer, teacher)
        default = default_relation_heads(teacher.hidden, student.hidden)
        self.relation_heads = _relation_heads(relation_heads, default, teacher, student)

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        s, t = self.qkv(student, teacher)
        return sum(minilmv2_loss(sa, ta, self.relation_heads, attention_mask) for sa, ta in zip(s, t))


class DirectMiniLMMethod(_QKVRelationMethod):
    """DirectMiniLM (comparative Eq. 10): learned W_{α,a} ∈ R^{d_r^S×d_r^T} per α ∈ {Q,K,V} and relation head.

    A_r defaults to the number of attention heads (App. B: "A_r = A_h"): the teacher's, which must
    then also divide d_S. W starts orthogonal (the MiniLMv2-like point, Eq. 11) but is unconstrained.
    """

    name = "direct-minilm"

    def __init__(
        self, teacher: ModelDims, student: ModelDims, relation_heads: int | None = None, teacher_layer: str = "L"
    ) -> None:
        super().__init__(teacher, student)
        self.teacher_layer = _teacher_layer(teacher_layer, teacher)
        if relation_heads is None and student.hidden % teacher.heads:
            choices = ", ".join(map(str, relation_head_choices(teacher.hidden, student.hidden)))
            raise InputError(
                f"direct-minilm defaults relation_heads to the teacher's {teacher.heads} heads, which does not divide "
                f"the student hidden size {student.hidden}; set relation_heads to one of: {choices}"
            )
        self.relation_heads = _relation_heads(relation_heads, teacher.heads, teacher, student)
        d_s, d_t = student.hidden // self.relation_heads, teacher.hidden // self.relation_heads
        weight = torch.empty(3, self.relation_heads, d_s, d_t)
        for w in weight.view(-1, d_s, d_t):
            nn.init.orthogonal_(w)
        self.weight = nn.Parameter(weight)  # [Q/K/V, A_r, d_r^S, d_r^T]

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        s, t = self.qkv(student, teacher)
        return sum(direct_minilm_loss(sa, ta, w, attention_mask) for sa, ta, w in zip(s, t, self.weight))


class MiniLMMethod(_QKVRelationMethod):
    """MiniLM v1 (MiniLM Eq. 6-10): attention + value-relation KL, last layer → last layer, equal heads."""

    name = "minilm"

    def __init__(self, teacher: ModelDims, student: ModelDims) -> None:
        super().__init__(teacher, student)
        _equal_heads(self.name, teacher, student)
        self.teacher_layer = teacher.layers

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        return minilm_v1_loss(*self.qkv(student, teacher), self.student_dims.heads, attention_mask)


class XtremeDistilMethod(Method):
    """XtremeDistil (§3.4, Eq. 8 + Eq. 9): last L_S layers aligned, one shared affine up-projection W^f, b^f."""

    name = "xtremedistil"

    def __init__(self, teacher: ModelDims, student: ModelDims) -> None:
        super().__init__(teacher, student)
        _equal_heads(self.name, teacher, student)
        self.pairs = [(i, js[0]) for i, js in enumerate(_layer_map("last", teacher, student), 1) if js]
        self.projection = _linear(student.hidden, teacher.hidden, bias=True)

    def teacher_needs(self) -> Needs:
        layers = frozenset(j for _, j in self.pairs)
        return Needs(hidden=layers, qkv=layers)

    def student_needs(self) -> Needs:
        layers = frozenset(i for i, _ in self.pairs)
        return Needs(hidden=layers, qkv=layers)

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = xtremedistil_hidden_loss(
            [_get(student.hidden, i, "student", "hidden state") for i, _ in self.pairs],
            [_get(teacher.hidden, j, "teacher", "hidden state") for _, j in self.pairs],
            self.projection,
            attention_mask,
        )
        attention = xtremedistil_attention_loss(
            [_qk(student, i, "student") for i, _ in self.pairs],
            [_qk(teacher, j, "teacher") for _, j in self.pairs],
            self.student_dims.heads,
            attention_mask,
        )
        return hidden + attention


# --------------------------------------------------------------------------------------------
# output distribution


class ODMethod(Method):
    """Output-distribution transfer (comparative Eq. 5) on masked-LM logits.

    Contract with the trainer: `Activations.logits` holds the MLM logits of both sides, either
    `[batch, seq, vocab]` with `attention_mask` = the mask of MASKED positions (1 = a position that
    was masked for MLM, not the padding mask), or already gathered `[n_masked, vocab]` with
    `attention_mask=None`. The loss is the mean over those positions of τ²·KL(p_T ‖ p_S).
    """

    name = "od"

    def __init__(self, teacher: ModelDims, student: ModelDims, temperature: float = 1.0) -> None:
        super().__init__(teacher, student)
        ok = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
        if not ok or not math.isfinite(temperature) or temperature <= 0:
            raise InputError(f"temperature={temperature!r} is invalid: must be a finite number > 0")
        self.temperature = float(temperature)

    def teacher_needs(self) -> Needs:
        return Needs(logits=True)

    def student_needs(self) -> Needs:
        return Needs(logits=True)

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if teacher.logits is None:
            raise InputError("method 'od' needs teacher masked-LM logits, but the teacher gave none (it has no MLM head)")
        if student.logits is None:
            raise KeyError("student activations lack MLM logits; capture what student_needs() lists")
        return od_loss(student.logits, teacher.logits, self.temperature, attention_mask)


# --------------------------------------------------------------------------------------------
# sentence embedding


def weighted_embed_terms(text: str) -> dict[str, float]:
    """'tok+cos+10*rel' -> {"tok": 1.0, "cos": 1.0, "rel": 10.0}: distinct terms, positive weights."""
    terms: dict[str, float] = {}
    for part in (p.strip() for p in str(text).split("+")):
        weight, _, name = part.rpartition("*")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            value = -1.0
        if name not in EMBED_TERMS or name in terms or not (value > 0 and math.isfinite(value)):
            raise InputError(f"embed_terms={text!r} is invalid: '+'-joined distinct terms of {', '.join(EMBED_TERMS)}, "
                             "each optionally weighted as W*term (e.g. tok+cos+10*rel)")
        terms[name] = value
    return terms


class EmbedMethod(Method):
    """Sentence-embedding transfer on the last layers (docs/methods.md, "Embedding-level distillation"):
    the weighted sum of the chosen terms — `mse` (token states, plain MSE), `tok` (token states
    normalised per feature), `cos` (pooled cosine), `rel` (in-batch similarity relation), `anc`
    (relation to a queue of teacher embeddings of earlier batches), `mid` (`tok` at the intermediate
    layers, student k against teacher round(k·L_T/L_S)) — of the last student layer against the last
    teacher layer.

    One projection `W ∈ R^{H_S×H_T}` serves `mse`, `tok`, `cos`, `anc` and `mid` when the widths
    differ; with equal widths there is none: an inherited student starts in the teacher's
    coordinates and stays.
    """

    name = "embed"

    def __init__(self, teacher: ModelDims, student: ModelDims, embed_terms: str = EMBED_DEFAULT_TERMS) -> None:
        super().__init__(teacher, student)
        self.terms = weighted_embed_terms(embed_terms)
        # Equal widths: no projection at all. The shipped embedding is the student's own, so `mse` and
        # `cos` must pull the student to the teacher, not a map absorb the difference (measured on
        # 3x12x384x1536, 300 steps: rho 0.861 without a map against 0.852 with a trained one).
        self.projection = None if student.hidden == teacher.hidden else _linear(student.hidden, teacher.hidden, bias=True)
        self.register_buffer("anchors", torch.zeros(0, teacher.hidden), persistent=False)

    @torch.no_grad()
    def align_to(self, selection: torch.Tensor) -> None:
        """Start the projection as `selection` `[H_S, H_T]` (an inherited student's channel map)."""
        if self.projection is not None:
            self.projection.weight.copy_(selection.T)
            self.projection.bias.zero_()

    def _pairs(self) -> list[tuple[int, int]]:
        pairs = [(self.student_dims.layers, self.teacher_dims.layers)]
        if "mid" in self.terms:
            pairs += [(k, max(1, round(k * self.teacher_dims.layers / self.student_dims.layers)))
                      for k in range(1, self.student_dims.layers)]
        return pairs

    def teacher_needs(self) -> Needs:
        return Needs(hidden=frozenset(t for _, t in self._pairs()))

    def student_needs(self) -> Needs:
        return Needs(hidden=frozenset(s for s, _ in self._pairs()))

    def forward(self, student: Activations, teacher: Activations, attention_mask: torch.Tensor) -> torch.Tensor:
        s = _get(student.hidden, self.student_dims.layers, "student", "hidden state")
        t = _get(teacher.hidden, self.teacher_dims.layers, "teacher", "hidden state")
        s_emb, t_emb = mean_pool(s, attention_mask), mean_pool(t, attention_mask)
        loss = {
            "mse": lambda: token_state_loss(s, t, self.projection, attention_mask, per_feature=False),
            "tok": lambda: token_state_loss(s, t, self.projection, attention_mask),
            "cos": lambda: pooled_cosine_loss(s_emb, t_emb, self.projection),
            "rel": lambda: relation_loss(s_emb, t_emb),
            "anc": lambda: self._anchor_loss(s_emb, t_emb),
            "mid": lambda: sum(token_state_loss(_get(student.hidden, i, "student", "hidden state"),
                                                _get(teacher.hidden, j, "teacher", "hidden state"),
                                                self.projection, attention_mask)
                               for i, j in self._pairs()[1:]) / max(1, len(self._pairs()) - 1),
        }
        return sum(weight * loss[term]() for term, weight in self.terms.items())

    def _anchor_loss(self, s_emb: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        anchors = torch.cat([t_emb.detach().float(), self.anchors.to(t_emb.device)])[:ANCHORS]
        if self.training:
            self.anchors = anchors
        return anchor_relation_loss(s_emb, t_emb, anchors, self.projection)


# --------------------------------------------------------------------------------------------

_CLASSES: dict[str, type[Method]] = {
    "hs": HSMethod,
    "minilmv2": MiniLMv2Method,
    "direct-minilm": DirectMiniLMMethod,
    "minilm": MiniLMMethod,
    "pkd": PKDMethod,
    "ckd": CKDMethod,
    "alp": ALPMethod,
    "xtremedistil": XtremeDistilMethod,
    "od": ODMethod,
    "embed": EmbedMethod,
}


def build_method(name: str, teacher: ModelDims, student: ModelDims, **options: object) -> Method:
    """Build a method by name, validating its options against the teacher and student shapes.

    Options left at None take their defaults; options that `name` does not accept raise
    `InputError` (see `method_options(name)`).
    """
    _check_name(name)
    _check_dims("teacher", teacher)
    _check_dims("student", student)
    accepted = _OPTIONS[name]
    given = {key: value for key, value in options.items() if value is not None}
    for key in given:
        if key not in accepted:
            allowed = ", ".join(accepted) or "no options"
            raise InputError(f"option {key!r} does not apply to method {name!r}; it accepts: {allowed}")
    return _CLASSES[name](teacher, student, **given)
