"""Tests for distill/methods.py: every method builds, reads exactly its needs, trains its projections,
ignores padding, and rejects bad options with a one-line KdnasError."""

from __future__ import annotations

import pytest
import torch

from kdnas.distill.activations import Activations, ModelDims, Needs
from kdnas.core.errors import KdnasError
from kdnas.distill.losses import LAYER_MAPS
from kdnas.distill.methods import (
    METHODS,
    HSMethod,
    Method,
    build_method,
    method_options,
    teacher_assistant_advised,
)

TEACHER = ModelDims(layers=6, hidden=384, heads=12, ffn=1536)
STUDENT = ModelDims(layers=4, hidden=192, heads=12, ffn=768)
STUDENT_8_HEADS = ModelDims(layers=4, hidden=192, heads=8, ffn=768)
SAME_WIDTH = ModelDims(layers=3, hidden=384, heads=12, ffn=1536)
B, S, VOCAB = 2, 5, 13
EQUAL_HEADS_ONLY = {"minilm", "xtremedistil"}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class Recording(dict):
    """A dict that remembers which keys were read with []."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[int] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def activations(dims: ModelDims, needs: Needs, grad: bool = False) -> Activations:
    """Random activations holding ONLY what `needs` lists, in recording dicts."""

    def tensor(*shape):
        return torch.randn(*shape, requires_grad=grad)

    return Activations(
        hidden=Recording({i: tensor(B, S, dims.hidden) for i in needs.hidden}),
        query=Recording({i: tensor(B, S, dims.hidden) for i in needs.qkv}),
        key=Recording({i: tensor(B, S, dims.hidden) for i in needs.qkv}),
        value=Recording({i: tensor(B, S, dims.hidden) for i in needs.qkv}),
        logits=tensor(B, S, VOCAB) if needs.logits else None,
    )


def padding_mask() -> torch.Tensor:
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 3:] = 0
    return mask


def assert_one_line_error(call, *words: str) -> None:
    with pytest.raises(KdnasError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


CASES = [(name, student) for name in METHODS for student in (STUDENT, STUDENT_8_HEADS, SAME_WIDTH)
         if not (name in EQUAL_HEADS_ONLY and student.heads != TEACHER.heads)]


@pytest.mark.parametrize("name, student_dims", CASES, ids=[f"{n}-{s.layers}x{s.heads}x{s.hidden}" for n, s in CASES])
def test_method_builds_reads_its_needs_and_trains_its_projections(name, student_dims):
    method = build_method(name, TEACHER, student_dims)
    assert isinstance(method, Method) and method.name == name
    teacher_needs, student_needs = method.teacher_needs(), method.student_needs()
    assert teacher_needs != Needs() and student_needs != Needs()
    teacher = activations(TEACHER, teacher_needs)
    student = activations(student_dims, student_needs, grad=True)
    mask = padding_mask()

    loss = method(student, teacher, mask)
    assert loss.dim() == 0 and loss.dtype == torch.float32 and torch.isfinite(loss)

    # the loss reads exactly what the needs list, on both sides
    for side, acts, needs in (("teacher", teacher, teacher_needs), ("student", student, student_needs)):
        assert acts.hidden.read == needs.hidden, side
        for qkv in (acts.query, acts.key):
            assert qkv.read == needs.qkv, side
        # xtremedistil's Eq. 9 uses the attention distribution softmax(QKᵀ), not V
        assert acts.value.read == (set() if name == "xtremedistil" else needs.qkv), side
        assert needs.logits == (name == "od")

    loss.backward()
    for param_name, param in method.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name
    assert all(p.requires_grad for p in method.parameters())
    student_grads = [t.grad for d in (student.hidden, student.query, student.key) for t in d.values()]
    student_grads += [student.logits.grad] if student.logits is not None else []
    assert any(g is not None and g.abs().sum() > 0 for g in student_grads)


def test_projections_exist_where_the_method_learns_them():
    counts = {name: sum(p.numel() for p in build_method(name, TEACHER, STUDENT).parameters()) for name in METHODS}
    assert counts["minilmv2"] == counts["minilm"] == counts["od"] == 0
    for name in ("hs", "direct-minilm", "pkd", "ckd", "alp", "xtremedistil"):
        assert counts[name] > 0, name
    hs = build_method("hs", TEACHER, STUDENT)  # uniform 6 -> 4: {2},{4},{6},{6}, one 192x384 map per pair
    assert hs.pairs == [(1, 2), (2, 4), (3, 6), (4, 6)]
    assert counts["hs"] == 4 * 192 * 384
    # equal widths: PKD and ALP compare without a projection; HS still learns W (identity not assumed)
    assert sum(p.numel() for p in build_method("pkd", TEACHER, SAME_WIDTH).parameters()) == 0
    assert sum(p.numel() for p in build_method("alp", TEACHER, SAME_WIDTH).parameters()) == 0
    assert sum(p.numel() for p in build_method("hs", TEACHER, SAME_WIDTH).parameters()) > 0


@pytest.mark.parametrize("name", METHODS)
def test_padding_does_not_change_any_method_loss(name):
    method = build_method(name, TEACHER, STUDENT)
    mask = padding_mask()
    teacher = activations(TEACHER, method.teacher_needs())
    student = activations(STUDENT, method.student_needs())

    def scrambled(acts: Activations) -> Activations:
        def f(x):
            pad = (mask == 0)[..., None]
            return torch.where(pad, 50 * torch.randn_like(x), x)

        return Activations(
            hidden={i: f(x) for i, x in acts.hidden.items()},
            query={i: f(x) for i, x in acts.query.items()},
            key={i: f(x) for i, x in acts.key.items()},
            value={i: f(x) for i, x in acts.value.items()},
            logits=None if acts.logits is None else f(acts.logits),
        )

    with torch.no_grad():
        clean = method(student, teacher, mask)
        noisy = method(scrambled(student), scrambled(teacher), mask)
    assert noisy.item() == pytest.approx(clean.item(), rel=1e-5, abs=1e-6)


def test_options_select_the_documented_layers():
    assert build_method("minilmv2", TEACHER, STUDENT).teacher_needs() == Needs(qkv=frozenset({6}))
    assert build_method("minilmv2", TEACHER, STUDENT, teacher_layer="L-2").teacher_needs() == Needs(qkv=frozenset({4}))
    assert build_method("direct-minilm", TEACHER, STUDENT, teacher_layer="L-1").teacher_needs() == Needs(qkv=frozenset({5}))
    assert build_method("minilmv2", TEACHER, STUDENT).student_needs() == Needs(qkv=frozenset({4}))
    assert build_method("minilmv2", TEACHER, STUDENT).relation_heads == 24  # default_relation_heads(384, 192)
    assert build_method("minilmv2", TEACHER, STUDENT, relation_heads=48).relation_heads == 48
    assert build_method("direct-minilm", TEACHER, STUDENT).weight.shape == (3, 12, 16, 32)  # A_r = A_h
    for strategy in LAYER_MAPS:
        method = build_method("hs", TEACHER, STUDENT, layer_map=strategy)
        assert sorted(method.teacher_needs().hidden) == sorted({j for _, j in method.pairs})
    assert build_method("hs", TEACHER, STUDENT, layer_map="uniform-cons").pairs == [(1, 1), (1, 2), (2, 3), (2, 4), (3, 5), (3, 6)]
    assert build_method("ckd", TEACHER, STUDENT).groups == [[1, 2], [3, 4], [5], [6]]
    assert build_method("ckd", TEACHER, STUDENT, ckd_overlap="PO").groups == [[1, 2, 3], [3, 4, 5], [5, 6], [6]]
    assert build_method("alp", TEACHER, STUDENT).groups == [list(range(1, 7))] * 4
    assert build_method("alp", TEACHER, STUDENT, alp_scope="bucket", ckd_overlap="PO").groups == [[1, 2, 3], [3, 4, 5], [5, 6], [6]]
    assert build_method("xtremedistil", TEACHER, STUDENT).pairs == [(1, 3), (2, 4), (3, 5), (4, 6)]
    assert build_method("od", TEACHER, STUDENT, temperature=2).temperature == 2.0
    # None means "default", so a CLI can pass every option it has
    assert build_method("hs", TEACHER, STUDENT, layer_map=None, temperature=None).layer_map == "uniform"


def test_hs_pair_losses_sum_to_the_loss():
    method = build_method("hs", TEACHER, STUDENT, layer_map="uniform+last")
    assert isinstance(method, HSMethod)
    teacher, student = activations(TEACHER, method.teacher_needs()), activations(STUDENT, method.student_needs())
    pairs = method.pair_losses(student, teacher, padding_mask())
    assert pairs.shape == (len(method.pairs),)
    assert method(student, teacher, padding_mask()).item() == pytest.approx(pairs.sum().item(), rel=1e-6)


def test_od_contract():
    method = build_method("od", TEACHER, STUDENT, temperature=2.0)
    logits_s, logits_t = torch.randn(B, S, VOCAB), torch.randn(B, S, VOCAB)
    masked = torch.zeros(B, S, dtype=torch.long)
    masked[0, 1] = masked[1, 3] = 1
    full = method(Activations(logits=logits_s), Activations(logits=logits_t), masked)
    keep = masked.bool()
    gathered = method(Activations(logits=logits_s[keep]), Activations(logits=logits_t[keep]), None)
    assert full.item() == pytest.approx(gathered.item(), rel=1e-6)
    assert_one_line_error(lambda: method(Activations(logits=logits_s), Activations(), masked), "MLM")


@pytest.mark.parametrize(
    "name, student, options, words",
    [
        ("tinybert", STUDENT, {}, ["'tinybert'", "minilmv2", "xtremedistil"]),
        ("hs", STUDENT, {"temperature": 2.0}, ["'temperature'", "'hs'", "layer_map"]),
        ("minilm", STUDENT, {"layer_map": "last"}, ["'layer_map'", "no options"]),
        ("hs", STUDENT, {"layer_map": "skip"}, ["'skip'", "uniform+last"]),
        ("pkd", STUDENT, {"layer_map": "every"}, ["'every'", "uniform-cons"]),
        ("minilmv2", STUDENT, {"relation_heads": 7}, ["relation_heads=7", "1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 192"]),
        ("minilmv2", STUDENT, {"relation_heads": "48"}, ["relation_heads='48'"]),
        ("direct-minilm", STUDENT, {"relation_heads": 0}, ["relation_heads=0"]),
        ("direct-minilm", ModelDims(4, 160, 10), {}, ["12 heads", "student hidden size 160", "1, 2, 4, 8, 16, 32"]),
        ("minilmv2", STUDENT, {"teacher_layer": "L-3"}, ["'L-3'", "L, L-1, L-2"]),
        ("minilmv2", STUDENT, {"teacher_layer": 5}, ["teacher_layer 5 is invalid: allowed L, L-1, L-2"]),
        ("ckd", STUDENT, {"ckd_overlap": "FO"}, ["'FO'", "NO, PO"]),
        ("alp", STUDENT, {"alp_scope": "some"}, ["'some'", "all, bucket"]),
        ("alp", STUDENT, {"ckd_overlap": "PO"}, ["ckd_overlap='PO'", "alp_scope='bucket'"]),
        ("alp", STUDENT, {"alp_scope": "bucket", "ckd_overlap": "X"}, ["'X'", "NO, PO"]),
        ("od", STUDENT, {"temperature": 0}, ["temperature=0", "> 0"]),
        ("od", STUDENT, {"temperature": -1.5}, ["temperature=-1.5"]),
        ("od", STUDENT, {"temperature": float("nan")}, ["temperature=nan"]),
        ("od", STUDENT, {"temperature": "hot"}, ["temperature='hot'"]),
        ("minilm", STUDENT_8_HEADS, {}, ["equal attention heads", "12", "8", "minilmv2"]),
        ("xtremedistil", STUDENT_8_HEADS, {}, ["equal attention heads", "minilmv2"]),
        ("hs", ModelDims(4, 190, 12), {}, ["hidden=190", "heads=12"]),
        ("hs", ModelDims(0, 192, 12), {}, ["layers=0"]),
    ],
)
def test_bad_options_raise_one_line_errors(name, student, options, words):
    assert_one_line_error(lambda: build_method(name, TEACHER, student, **options), *words)


def test_teacher_layer_needs_a_deep_enough_teacher():
    shallow = ModelDims(layers=2, hidden=384, heads=12)
    assert_one_line_error(
        lambda: build_method("minilmv2", shallow, STUDENT, teacher_layer="L-2"), "'L-2'", "2 teacher layers", "L, L-1"
    )


def test_method_options_and_teacher_assistant():
    assert set(method_options("hs")) == {"layer_map"}
    assert method_options("od") == {"temperature": 1.0}
    assert method_options("minilm") == {}
    for name in METHODS:
        method_options(name)
    assert_one_line_error(lambda: method_options("nope"), "'nope'")
    assert teacher_assistant_advised(ModelDims(12, 768, 12), ModelDims(4, 384, 12))
    assert not teacher_assistant_advised(ModelDims(12, 768, 12), ModelDims(4, 576, 12))
