"""The model card (README.md) of a finished student: what it is, what it costs, how it was made.

Users meet `best/` through this page (and the hubs show it), so it carries the measured facts from
the search's entry, not claims, and the exact command that reproduces the folder.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from kdnas.core.files import atomic_write_text
from kdnas.core.sentence import SentencePipeline
from kdnas.evaluation.precision import FP32_GRAPH

from .neighbours import shape_label
from .records import steps_label
from .schema import Fidelity, FinalRecord, LatencyRecord, Quality

CARD = "README.md"
# Settings (by their flag names, SearchConfig.flags) that only steer this process and have no `kdnas search` flag.
_NO_FLAG = ("stale_after_s",)
# Boolean settings whose flag says the opposite of the setting.
_NEGATED = {"prune": "--no-prune", "progress": "--no-progress", "latency_model": "--no-latency-model"}


def write_model_card(dest: str | Path, entry: FinalRecord, config: Any) -> Path:
    """Write `dest/README.md` for the final entry `entry` of a search run with SearchConfig `config`."""
    path = Path(dest) / CARD
    atomic_write_text(path, model_card(entry, config))
    return path


def model_card(entry: FinalRecord, config: Any) -> str:
    """The card's text (see `write_model_card`)."""
    facts = [
        ("shape (layers x heads x hidden x ffn)", shape_label(entry)),
        ("parameters", f"{int(entry.params):,}"),
        *_latencies(entry, config),
        ("held-out normalized L_HS (0 = the teacher's hidden states)", _number(entry.l_hs_norm)),
        ("quality", _quality(entry.quality, entry.train_rows)),
        ("teacher", _teacher(config.teacher)),
        ("sentence embedding", _pipeline(entry.sentence_transformers)),
        ("distillation", _distillation(entry)),
    ]
    rows = "\n".join(f"| {name} | {value} |" for name, value in facts)
    return f"""---
{_origin(config.teacher)}library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags: [sentence-transformers, feature-extraction, knowledge-distillation, kdnas]
---

# {entry.arch} student of {config.teacher}

A student in its teacher's own architecture, found by a latency-constrained architecture search
(KD-NAS), started from the teacher's own weights and distilled on the teacher's token states, sentence embeddings and
similarities by kdnas. Its embeddings are meant to replace the teacher's.

| | |
|---|---|
{rows}

## How it was made

```bash
{search_command(config)}
```

## Use

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/this/folder", device="cpu")
embeddings = model.encode(["A sentence to embed."])
```

`model.onnx` (fp32, fused or plain, the faster where it was made; `export.json` says which),
`model.int8.onnx` (dynamic INT8) and, where the search grew a precision plan, `model.mixed.onnx` (INT8 but for the
weight groups `export.json`'s `precision` keeps fp32) take `input_ids`, `attention_mask` (and `token_type_ids`
where present) from this folder's tokenizer and return `sentence_embedding`, the same vector as `encode`
(up to the quantized graphs' error). The graph the budget judged is the one to deploy (the table above). `export.json`, `distill.json` and `search.json` hold every measured fact.
"""


def _teacher(teacher: str) -> str:
    from kdnas.core.assets import TEACHERS

    bundled = TEACHERS.get(teacher)
    origin = f" (bundled copy of {bundled.hub_id}, licence {bundled.license})" if bundled and bundled.hub_id else ""
    return f"`{teacher}`{origin}"


def _origin(teacher: str) -> str:
    """Front-matter lines naming a bundled teacher's original model and licence: the student starts from
    its weights (distill.inherit), so it is a derivative of that model and ships under its licence. A
    teacher of the user's own is named in the card's text only."""
    from kdnas.core.assets import TEACHERS

    bundled = TEACHERS.get(teacher)
    if bundled is None:
        return ""
    return (f"base_model: {bundled.hub_id}\n" if bundled.hub_id else "") + \
        (f"license: {bundled.license}\n" if bundled.license else "")


def search_command(config: Any) -> str:
    """The `kdnas search` command line that reproduces `config`: the three named options, then every
    option that differs from its default. A setting with no flag (a `space` given in Python) is named
    on a comment line below, so the command never claims more than it reproduces."""
    flags = ["kdnas", "search", "--teacher", config.teacher, "--corpus", config.corpus, "--out", config.run.out]
    notes = []
    defaults = type(config)().flags()
    for name, value in config.flags().items():
        if name in ("teacher", "corpus", "out") + _NO_FLAG or value == defaults[name]:
            continue
        flag = f"--{name.replace('_', '-')}"
        if name == "space_overrides":
            for dim, choices in value:
                flags += [f"--{dim}", _choices(choices)]
        elif name in _NEGATED or isinstance(value, bool):
            flags.append(_NEGATED.get(name, flag))  # differs from the default, so the flag is set
        elif name == "space" or value is None:
            notes.append(f"# {name}={value!r} was set in Python and has no flag")
        else:
            flags += [flag, str(value)]
    return " ".join(shlex.quote(str(p)) for p in flags) + "".join(f"\n{n}" for n in notes)


def _choices(choices: Any) -> str:
    if isinstance(choices, (list, tuple)):
        return ",".join(str(c) for c in choices)
    return str(choices)


def _drift(entry: FinalRecord) -> str:
    """How the fp32 reading stands to the teacher's: timed side by side (a ratio budget, nas.final), or
    scaled to the host's speed when the budget was set (a study of an earlier version)."""
    if entry.ratio_to_teacher is not None:
        return (f"; {entry.ratio_to_teacher:.3f}x the teacher, the two timed side by side in alternating "
                f"rounds (here {entry.read_ms:.2f} and {entry.teacher_latency_now_ms:.2f} ms), stated on "
                "the scale of the teacher reading that set the budget")
    scale = 1.0 if entry.latency_scaled_by is None else entry.latency_scaled_by
    if scale >= 1.0:
        return ""
    return (f"; scaled by {scale:.3f}: the host had slowed, the teacher read {entry.teacher_latency_now_ms:.2f} ms "
            "beside it instead of its reading when the budget was set")


def _distillation(entry: FinalRecord) -> str:
    """Steps, rows, and what the training ran in: the same steps differ in time, not in fidelity,
    between bf16 and fp32 (docs/design/final-recipe.md)."""
    text = f"{steps_label(entry)} on {entry.train if entry.train_rows is None else entry.train_rows} sequences"
    if entry.augment:  # distill.augment: the corpus ran short of rows for the steps, or --final-augment
        text += f", {entry.augment:.0%} of the batches perturbed"
    if entry.embed_terms:  # --final-embed-terms
        text += f", embed terms {entry.embed_terms}"
    seconds = (entry.seconds or {}).get("distill")
    took = None if not seconds else f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
    how = [p for p in (entry.precision, took) if p]
    return f"{text} ({', '.join(how)})" if how else text


def _latencies(entry: FinalRecord, config: Any) -> list[tuple[str, str]]:
    """The card's rows for the shipped graphs — fp32, all-INT8 and a precision plan where one was grown — the
    one the budget judged first (nas.final: the runtime's graph, or the plan chosen on onnxruntime-auto)."""
    judged = entry.budget_graph or FP32_GRAPH
    runtime = "onnxruntime" if config.latency.runtime != "torch" else "torch"
    quality = entry.quality or Quality()
    plan = (entry.precision_plan or {}).get("label")
    rows = [("model.onnx", "latency, fp32 (model.onnx)", entry.latency_fp32_onnx or entry.latency, None),
            ("model.int8.onnx", "latency, int8 (model.int8.onnx)", entry.latency_int8_onnx, quality.int8),
            ("model.mixed.onnx", f"latency, precision plan {plan} (model.mixed.onnx)", entry.latency_mixed_onnx,
             quality.mixed)]
    shown = [(name, label, _latency(record, config, runtime if name == "model.onnx" else "onnxruntime")
              + _graph_fidelity(rho, quality)) for name, label, record, rho in rows if record or name != "model.mixed.onnx"]
    shown.sort(key=lambda row: row[0] != judged)
    return [(label + (", the graph the budget judged" if name == judged else ""),
             text + (_drift(entry) if name == judged else "")) for name, label, text in shown]


def _latency(record: LatencyRecord | None, config: Any, runtime: str) -> str:
    if record is None:
        return "not measured"
    p90 = float("nan") if record.p90_ms is None else record.p90_ms
    return (f"{record.median_ms:.2f} ms median (p90 {p90:.2f}; batch "
            f"{config.latency.batch}, {config.latency.seq} tokens, {config.latency.threads} threads, {runtime})")


def _quality(quality: Quality | None, train_rows: int | None) -> str:
    """Embedding fidelity of the student beside the untrained baselines, and on its own training text, of
    `train_rows` rows (nas.baselines)."""
    from .baselines import fit_line

    if quality is None or not quality.fidelity:
        return (quality.skipped if quality is not None else None) or "not measured"
    rows = "; ".join(f"{name} {r.spearman:.3f}" for name, r in quality.fidelity.items())
    verdict = "beats both untrained baselines on fidelity" if quality.beats_baselines else \
        "does NOT beat the untrained baselines on fidelity: the recipe failed for this shape"
    fit = fit_line(quality, train_rows)
    return (f"embedding fidelity (Spearman ρ of pairwise cosines vs the teacher, {quality.sentences} held-out "
            f"sentences): {rows} — {verdict}" + (f"; {fit}" if fit else "") + ". Linear probes take minutes more "
            "than a search spends: `kdnas evaluate path/to/this/folder --baselines --measures fidelity,probe --card` "
            "adds their table, beside the untrained baselines, below (without --measures, fine-tuning too: an hour or "
            "more on a CPU)")


def _graph_fidelity(rho: Fidelity | None, quality: Quality) -> str:
    """A quantized graph's embedding fidelity beside the fp32 student's (nas.baselines.int8_fidelity), where measured."""
    fp32 = quality.student
    if rho is None or fp32 is None:
        return ""
    return f"; embedding fidelity ρ {rho.spearman:.3f} on the same held-out sentences (fp32: {fp32.spearman:.3f})"


def _pipeline(written: dict[str, Any] | None) -> str:
    """The sentence-transformers pipeline its folder was written with (`write_sentence_transformers`' facts)."""
    if not written:
        return "see modules.json"
    pipe = SentencePipeline.from_dict(written)
    norm = "L2-normalized" if pipe.normalize else "not normalized"
    dropped = f" (the teacher's {', '.join(pipe.dropped)} not copied)" if pipe.dropped else ""
    return f"{pipe.pooling} pooling, {norm}, max_seq_length {pipe.max_seq_length}{dropped}"


def _number(value: Any) -> str:
    if value is None:
        return "not measured"
    return f"{value:.4f}" if isinstance(value, float) else str(value)
