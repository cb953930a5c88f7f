"""Teacher-inherited students: keep some of the teacher's layers, heads, neurons and channels.

A student `L_S × A_S × H_S × F_S` starts from the teacher's own weights instead of random ones
(DistilBERT, PKD/ALP-KD init, XtremeDistil §3; docs/methods.md "Teacher-inherited students"):

- **Depth** (`layer_rule`): which `L_S` teacher layers are kept, in order — `first` (PKD, ALP-KD),
  `even` (evenly spaced, first and last included) or `bi` (ShortGPT's Block Influence
  `BI_j = 1 − E_tokens[cos(x_j^in, x_j^out)]`, the `L_S` largest kept).
- **Width** (Minitron §3): importance from activations on a calibration batch, each the mean over
  the batch of the L2 norm over the (non-padded) sequence — head `h`: its context vector before the
  output projection; FFN neuron `n`: `GELU(x W_1 + b_1)_n`; hidden channel `c`: the sum over every
  LayerNorm output. The top-ranked ones are kept, in their original order, and every tensor that
  reads or writes them is sliced the same way.
- **Heads of another size** (`d_S = H_S/A_S` vs the teacher's `d_T`): the top `A_S·⌈d_S/d_T⌉`
  teacher heads are kept and grouped, in rank order, `⌈d_S/d_T⌉` per student head; a student head
  takes whole teacher heads and, for the rest, the most important dimensions of the next one (Q/K
  dimensions ranked by `‖q_m‖·‖k_m‖`, V dimensions by the context norm). Q is scaled by
  `sqrt(d_S/d_T)` so every kept teacher head's scores keep their scale under the student's
  `1/sqrt(d_S)`. A grouped head shares one softmax: that part is an approximation, made good by
  distillation.
- **The teacher's own family** (core.families): a student is the teacher's model class, so every
  tensor maps to its own kind — BERT, RoBERTa / XLM-R / CamemBERT and ELECTRA by BERT's layer layout,
  MPNet by its own, its relative position bias included. MPNet keeps one bias table `[buckets, A]` in
  its encoder that every layer adds to its scores, so an MPNet student keeps the same teacher heads,
  in the same order, in every layer (ranked by their importance summed over the kept layers, each
  layer's share normalised), and student head `h` takes the bias column of the first teacher head of
  its group.

At the teacher's own shape (every layer, head, neuron and channel kept) the student reproduces the
teacher, for every family; `tests/test_inherit.py` and `tests/test_families.py` check it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from kdnas.core.errors import InputError, check_choice
from kdnas.core.families import FAMILIES
from kdnas.core.spec import StudentSpec, build_student
from .teachers import Teacher, base_model

LAYER_RULES: tuple[str, ...] = ("first", "even", "bi")
# Rows of the transfer set that importance is measured on (Minitron uses a calibration set of ~1k).
CALIBRATION_ROWS = 256


@dataclass(frozen=True)
class _Parts:
    """Where one family keeps the modules an inherited student reads and writes (paths from a layer)."""

    query: str
    key: str
    value: str
    attn_out: str
    attn_norm: str
    ffn_in: str
    ffn_out: str
    ffn_norm: str


_BERT_LAYOUT = _Parts("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                      "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
_MPNET_LAYOUT = _Parts("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                       "attention.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
# Every student family but MPNet keeps BERT's module names (core.families).
_PARTS = {name: _MPNET_LAYOUT if name == "mpnet" else _BERT_LAYOUT for name in FAMILIES}


def _get(module: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _parts(teacher: Teacher) -> _Parts:
    model_type = teacher.model.config.model_type
    if model_type not in _PARTS:
        raise InputError(f"init inherit: teacher model type {model_type!r} has no weight map; "
                         f"supported: {', '.join(_PARTS)} (use --init svd)")
    return _PARTS[model_type]


def family_reason(teacher: Teacher) -> str | None:
    """Why no student can inherit from `teacher` (None when students of its family can)."""
    config = teacher.model.config
    if config.model_type not in _PARTS:
        return f"teacher model type {config.model_type!r} has no weight map (supported: {', '.join(_PARTS)})"
    if getattr(config, "embedding_size", config.hidden_size) != config.hidden_size:
        return (f"the teacher's embeddings ({config.embedding_size}) are projected to its hidden size "
                f"({config.hidden_size}), which a student does not keep")
    return None


def inherit_reason(teacher: Teacher, spec: StudentSpec) -> str | None:
    """Why `spec` cannot inherit from `teacher` (None when it can): the one-line user error."""
    t, config = teacher.dims, teacher.model.config
    if (reason := family_reason(teacher)) is not None:
        return reason
    if spec.family != config.model_type:
        return f"a {spec.family} student cannot inherit from a {config.model_type} teacher (students keep the teacher's family)"
    for name, mine, theirs in (("layers", spec.layers, t.layers), ("hidden", spec.hidden, t.hidden),
                               ("ffn", spec.ffn, t.ffn), ("heads", spec.heads, t.heads)):
        if mine > theirs:
            return f"student {name}={mine} exceeds the teacher's {theirs}: a student can only keep what the teacher has"
    if spec.vocab_size != config.vocab_size:
        return f"student vocabulary {spec.vocab_size} differs from the teacher's {config.vocab_size}"
    if spec.position_table > config.max_position_embeddings:
        return f"student positions {spec.max_position} exceed the teacher's"
    d_s, d_t = spec.hidden // spec.heads, t.hidden // t.heads
    if spec.heads * math.ceil(d_s / d_t) > t.heads:
        return (f"{spec.heads} heads of size {d_s} need {spec.heads * math.ceil(d_s / d_t)} teacher heads of size "
                f"{d_t}; the teacher has {t.heads}")
    return None


# --------------------------------------------------------------------------------------------
# importance, measured once per teacher and calibration batch


@dataclass(frozen=True)
class Importance:
    """Activation importances of one teacher on one calibration batch (all 0-based indices)."""

    channels: torch.Tensor  # [H_T]
    heads: tuple[torch.Tensor, ...]  # per layer [A_T]
    qk_dims: tuple[torch.Tensor, ...]  # per layer [H_T]: ‖q_m‖·‖k_m‖
    v_dims: tuple[torch.Tensor, ...]  # per layer [H_T]: context norm per dimension
    neurons: tuple[torch.Tensor, ...]  # per layer [F_T]
    block_influence: tuple[float, ...]  # per layer, ShortGPT BI
    rows: int


def _seq_norm(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of the L2 norm over the non-padded sequence: `[b, s, d]` -> `[d]`."""
    x = x.float() * mask[..., None]
    return x.pow(2).sum(1).sqrt().mean(0)


@torch.inference_mode()
def measure_importance(teacher: Teacher, ids: torch.Tensor, mask: torch.Tensor, batch_size: int = 32) -> Importance:
    """Run the teacher over the calibration rows with hooks and aggregate every importance."""
    parts, dims = _parts(teacher), teacher.dims
    encoder = base_model(teacher.model)
    layers = encoder.encoder.layer
    device = next(teacher.model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    bi = torch.zeros(dims.layers, dtype=torch.float64, device=device)  # summed where the teacher runs
    tokens = 0

    def add(key: str, value: torch.Tensor) -> None:
        sums[key] = sums[key] + value if key in sums else value

    for start in range(0, ids.shape[0], batch_size):
        m = mask[start : start + batch_size].to(device).float()
        seen: dict[str, torch.Tensor] = {}
        handles = _hooks(encoder, layers, parts, seen)
        try:
            out = encoder(input_ids=ids[start : start + batch_size].to(device), attention_mask=m.long(),
                          output_hidden_states=True, return_dict=True)
        finally:
            for handle in handles:
                handle.remove()
        weight = m.shape[0]
        for key, value in seen.items():
            add(key, _seq_norm(value, m) * weight)
        real = m.bool()
        for j in range(dims.layers):
            cos = nn.functional.cosine_similarity(out.hidden_states[j][real].float(),
                                                  out.hidden_states[j + 1][real].float(), dim=-1)
            bi[j] += (1 - cos).double().sum()
        tokens += int(real.sum())
    sums = {key: value.cpu() for key, value in sums.items()}  # the rankings and slicing happen on the CPU
    return _importance(sums, bi.cpu() / max(tokens, 1), dims, ids.shape[0])


def _hooks(encoder: nn.Module, layers, parts: _Parts, seen: dict[str, torch.Tensor]) -> list:
    def keep(key: str, pre: bool):
        if pre:
            return lambda _m, args: seen.__setitem__(key, args[0])
        return lambda _m, _args, out: seen.__setitem__(key, out)

    handles = [encoder.embeddings.LayerNorm.register_forward_hook(keep("ln_emb", False))]
    for j, layer in enumerate(layers):
        for name, path, pre in (("q", parts.query, False), ("k", parts.key, False), ("ctx", parts.attn_out, True),
                                ("ffn", parts.ffn_out, True), ("ln_a", parts.attn_norm, False),
                                ("ln_f", parts.ffn_norm, False)):
            module = _get(layer, path)
            hook = module.register_forward_pre_hook if pre else module.register_forward_hook
            handles.append(hook(keep(f"{name}{j}", pre)))
    return handles


def _importance(sums: dict[str, torch.Tensor], bi: torch.Tensor, dims, rows: int) -> Importance:
    L, d_t = dims.layers, dims.hidden // dims.heads
    mean = {k: v / rows for k, v in sums.items()}
    channels = mean["ln_emb"] + sum(mean[f"ln_a{j}"] + mean[f"ln_f{j}"] for j in range(L))
    heads = tuple(mean[f"ctx{j}"].view(dims.heads, d_t).pow(2).sum(-1).sqrt() for j in range(L))
    return Importance(
        channels=channels.cpu(),
        heads=tuple(h.cpu() for h in heads),
        qk_dims=tuple((mean[f"q{j}"] * mean[f"k{j}"]).cpu() for j in range(L)),
        v_dims=tuple(mean[f"ctx{j}"].cpu() for j in range(L)),
        neurons=tuple(mean[f"ffn{j}"].cpu() for j in range(L)),
        block_influence=tuple(float(b) for b in bi),
        rows=rows,
    )


# --------------------------------------------------------------------------------------------
# the plan: which parts are kept


@dataclass(frozen=True)
class InheritPlan:
    """What a student keeps of its teacher (0-based teacher indices), and why (the rule)."""

    layers: tuple[int, ...]
    channels: tuple[int, ...]
    qk: tuple[tuple[int, ...], ...]  # per kept layer: teacher Q/K rows, student head order
    v: tuple[tuple[int, ...], ...]  # per kept layer: teacher V rows, student head order
    neurons: tuple[tuple[int, ...], ...]
    q_scale: float
    layer_rule: str
    bias_heads: tuple[int, ...] = ()  # MPNet: the teacher head whose position-bias column each student head takes

    def selection(self, teacher_hidden: int) -> torch.Tensor:
        """`[H_S, H_T]` with a 1 where student channel c is teacher channel `channels[c]`: the map from
        the student's hidden space back into the teacher's that inheritance implies."""
        out = torch.zeros(len(self.channels), teacher_hidden)
        out[torch.arange(len(self.channels)), torch.as_tensor(self.channels)] = 1.0
        return out

    def describe(self) -> dict:
        return {"layer_rule": self.layer_rule, "teacher_layers": [j + 1 for j in self.layers],
                "hidden_kept": len(self.channels), "q_scale": self.q_scale}


def select_layers(rule: str, n_teacher: int, n_student: int, block_influence: tuple[float, ...] = ()) -> tuple[int, ...]:
    """0-based teacher layers kept by `rule` (see the module docstring)."""
    check_choice("layer rule", rule, LAYER_RULES)
    if not 1 <= n_student <= n_teacher:
        raise InputError(f"a student of {n_student} layers cannot inherit from a teacher of {n_teacher}")
    if rule == "first":
        return tuple(range(n_student))
    if rule == "even":
        if n_student == 1:
            return (0,)
        return tuple(sorted({round(i * (n_teacher - 1) / (n_student - 1)) for i in range(n_student)}))
    ranked = sorted(range(n_teacher), key=lambda j: -block_influence[j])
    return tuple(sorted(ranked[:n_student]))


def _top(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k largest scores (ties: lower index first), in rank order."""
    order = sorted(range(scores.numel()), key=lambda i: (-float(scores[i]), i))
    return order[:k]


def _head_rows(imp: Importance, layer: int, spec: StudentSpec, d_t: int,
               ranked: list[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Teacher Q/K rows and V rows for the student's heads of one layer, student head by head; `ranked`:
    the teacher heads to group, in rank order (by default this layer's own ranking)."""
    d_s = spec.hidden // spec.heads
    per_head = math.ceil(d_s / d_t)
    kept = ranked if ranked is not None else _top(imp.heads[layer], spec.heads * per_head)
    qk, v = [], []
    for h in range(spec.heads):
        group = kept[h * per_head : (h + 1) * per_head]
        for rows, scores in ((qk, imp.qk_dims[layer]), (v, imp.v_dims[layer])):
            need = d_s
            for t_head in group:
                dims = list(range(t_head * d_t, (t_head + 1) * d_t))
                take = min(need, d_t)
                chosen = dims if take == d_t else sorted(dims[i] for i in _top(scores[dims], take))
                rows.extend(chosen)
                need -= take
    return tuple(qk), tuple(v)


def _shared_heads(imp: Importance, layers: tuple[int, ...], count: int) -> list[int]:
    """One head ranking for every kept layer (a family whose layers share one position bias): each
    layer's head importances as shares of that layer's total, summed over the kept layers."""
    score = sum(imp.heads[j] / imp.heads[j].sum().clamp_min(1e-12) for j in layers)
    return _top(score, count)


def plan(teacher: Teacher, spec: StudentSpec, importance: Importance, layer_rule: str = "even") -> InheritPlan:
    """Decide what `spec` keeps of `teacher`; raises `InputError` when it cannot inherit."""
    reason = inherit_reason(teacher, spec)
    if reason is not None:
        raise InputError(f"init inherit: {reason}")
    t = teacher.dims
    d_t = t.hidden // t.heads
    per_head = math.ceil((spec.hidden // spec.heads) / d_t)
    layers = select_layers(layer_rule, t.layers, spec.layers, importance.block_influence)
    shared = (_shared_heads(importance, layers, spec.heads * per_head)
              if FAMILIES[spec.family].shared_position_bias else None)
    heads = [_head_rows(importance, j, spec, d_t, shared) for j in layers]
    return InheritPlan(
        layers=layers,
        channels=tuple(sorted(_top(importance.channels, spec.hidden))),
        qk=tuple(h[0] for h in heads), v=tuple(h[1] for h in heads),
        neurons=tuple(tuple(sorted(_top(importance.neurons[j], spec.ffn))) for j in layers),
        q_scale=math.sqrt((spec.hidden // spec.heads) / d_t),
        layer_rule=layer_rule,
        bias_heads=tuple(shared[::per_head]) if shared is not None else (),
    )


# --------------------------------------------------------------------------------------------
# building the student


def _copy_linear(dst: nn.Linear, src: nn.Linear, rows, cols, scale: float = 1.0) -> None:
    rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
    dst.weight.copy_(src.weight.detach()[rows][:, cols] * scale)
    dst.bias.copy_(src.bias.detach()[rows] * scale)


def _copy_norm(dst: nn.LayerNorm, src: nn.LayerNorm, channels) -> None:
    index = torch.as_tensor(channels)
    dst.weight.copy_(src.weight.detach()[index])
    dst.bias.copy_(src.bias.detach()[index])


# Config fields an inherited student takes from its teacher, where the teacher's config has them: without
# the same eps, activation and position buckets the full-shape student would not be the teacher.
_TEACHER_FIELDS = ("layer_norm_eps", "hidden_act", "relative_attention_num_buckets", "position_embedding_type")


@torch.no_grad()
def build_inherited(teacher: Teacher, spec: StudentSpec, chosen: InheritPlan) -> nn.Module:
    """A model of the teacher's family and shape `spec` holding the teacher's kept weights (eager attention)."""
    parts = _parts(teacher)
    source = base_model(teacher.model)
    fields = {k: getattr(teacher.model.config, k) for k in _TEACHER_FIELDS if hasattr(teacher.model.config, k)}
    student = build_student(spec, seed=None, **fields).eval()
    ch = torch.as_tensor(chosen.channels)
    _copy_embeddings(student.embeddings, source.embeddings, ch)
    for s_layer, j, qk, v, neurons in zip(student.encoder.layer, chosen.layers, chosen.qk, chosen.v, chosen.neurons):
        t_layer = source.encoder.layer[j]
        for path, rows, cols, scale in ((parts.query, qk, ch, chosen.q_scale), (parts.key, qk, ch, 1.0),
                                        (parts.value, v, ch, 1.0), (parts.attn_out, ch, v, 1.0),
                                        (parts.ffn_in, neurons, ch, 1.0), (parts.ffn_out, ch, neurons, 1.0)):
            _copy_linear(_get(s_layer, path), _get(t_layer, path), rows, cols, scale)
        for path in (parts.attn_norm, parts.ffn_norm):
            _copy_norm(_get(s_layer, path), _get(t_layer, path), ch)
    if chosen.bias_heads:
        bias = source.encoder.relative_attention_bias.weight.detach()
        student.encoder.relative_attention_bias.weight.copy_(bias[:, torch.as_tensor(chosen.bias_heads)])
    pooler = getattr(source, "pooler", None)
    if pooler is not None and getattr(student, "pooler", None) is not None:
        _copy_linear(student.pooler.dense, pooler.dense, ch, ch)
    return student


def _copy_embeddings(dst: nn.Module, src: nn.Module, ch: torch.Tensor) -> None:
    """Word, position and segment tables (the student's rows of each, the kept channels) and their LayerNorm."""
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        table = getattr(dst, name, None)
        if table is not None:
            table.weight.copy_(getattr(src, name).weight.detach()[: table.weight.shape[0]][:, ch])
    _copy_norm(dst.LayerNorm, src.LayerNorm, ch)


def inherit_student(teacher: Teacher, spec: StudentSpec, importance: Importance,
                    layer_rule: str = "even") -> tuple[nn.Module, InheritPlan]:
    """The inherited student of shape `spec` and the plan it was cut by."""
    chosen = plan(teacher, spec, importance, layer_rule)
    return build_inherited(teacher, spec, chosen), chosen


def narrowed(model: nn.Module, tokenizer: object, spec: StudentSpec, ids: torch.Tensor,
             mask: torch.Tensor) -> tuple[nn.Module, InheritPlan]:
    """A trained student cut down to the narrower `spec` as a teacher is (every layer kept in order,
    heads, FFN neurons and channels ranked by their activations on the first CALIBRATION_ROWS rows
    of `ids`/`mask`, the calibration batch `TeacherCache.importance` uses): Minitron's
    prune-then-distil applied to a student already distilled, so a finalist refused over the budget
    hands its training on to its narrower neighbour (nas.final)."""
    source = Teacher(name="trained student", model=model.eval(), tokenizer=tokenizer, fingerprint="",
                     has_mlm_head=False)
    reason = inherit_reason(source, spec)
    if reason is not None or spec.layers != source.dims.layers:
        raise InputError(f"cannot narrow {model.config.num_hidden_layers} layers to {spec.arch}: "
                         f"{reason or 'narrowing keeps every layer'}")
    importance = measure_importance(source, ids[:CALIBRATION_ROWS], mask[:CALIBRATION_ROWS])
    return inherit_student(source, spec, importance, "first")


def narrowed_from(folder: object, tokenizer: object, spec: StudentSpec, ids: torch.Tensor,
                  mask: torch.Tensor) -> nn.Module:
    """The trained student saved in `folder` read back and `narrowed` to `spec`, in training mode: the start
    of a run that goes on from a wider student (nas.final's refused finalist)."""
    from transformers import AutoModel

    trained = AutoModel.from_pretrained(folder, attn_implementation="eager")
    return narrowed(trained, tokenizer, spec, ids, mask)[0].train()


def first_layers(teacher: Teacher, layers: int, importance: Importance) -> nn.Module:
    """The teacher's first `layers` layers at full width, untrained: the cheapest honest baseline."""
    t = teacher.dims
    spec = StudentSpec(layers=layers, heads=t.heads, hidden=t.hidden, ffn=t.ffn, **teacher.student_sizes())
    return inherit_student(teacher, spec, importance, "first")[0]
