"""`export_model`: a deployable ONNX folder, written atomically, with every claim in it measured."""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kdnas.core import sentence as _sentence
from kdnas.core.errors import InputError, ParityError
from kdnas.core.files import check_out_folder, staged_folder
from kdnas.core.spec import StudentSpec, build_student

from . import _graph, _parity

MANIFEST = "export.json"
MODEL_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"


@dataclass(frozen=True)
class ExportReport:
    """What `export_model` wrote and verified; `export.json` holds the same facts."""

    out_dir: str
    source: str
    model_type: str
    arch: str
    opset: int
    exporter: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optimized: bool
    fused: dict[str, int]
    attention_fused: bool
    fusion: str
    parity: _parity.Parity
    pooling: str = "mean"  # how `sentence_embedding` pools the token states
    normalize: bool = False  # whether `sentence_embedding` is L2-normalized in the graph
    int8_cosine: float | None = None  # min over the check sentences; None without --int8
    int8_mean_cosine: float | None = None  # the quality check's figure (warns under 0.99)
    int8_recipe: str | None = None
    # whether INT8 weights use all 8 bits, and why (`int8_range`: this CPU's VNNI/AMX, or asked for)
    int8_full_range: bool | None = None
    int8_range_reason: str | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["parity"] = self.parity.to_dict()
        out["inputs"], out["outputs"], out["warnings"] = list(self.inputs), list(self.outputs), list(self.warnings)
        return out


def export_model(
    model_or_dir,
    out_dir: str | os.PathLike,
    *,
    int8: bool = False,
    int8_fp32_attention: bool = False,
    int8_fp32_embeddings: bool = False,
    int8_full_range: bool | None = None,
    opset: int | None = None,
    optimize: bool = True,
    tokenizer=None,
    normalize: bool | None = None,
    pooling: str | None = None,
) -> ExportReport:
    """Export an encoder to a deployable folder and verify it.

    `model_or_dir`: a transformers model, a `StudentSpec` (random weights), a model folder, or a
    bundled teacher name (minilm-l6, mpnet-base). `tokenizer`: a tokenizer, or a folder/teacher name
    to load one from; by default the model folder's own. `model.onnx` is the optimized (fused)
    graph when `optimize`, since that is what runs fastest and it passes the same parity check.
    `int8_fp32_attention` / `int8_fp32_embeddings` / `int8_full_range`: see `quantize_int8` (None: full-range
    weights where this CPU has VNNI or AMX, `int8_range`); per-group plans: `evaluation.choose_precision`.
    `normalize` / `pooling`: how the graph's `sentence_embedding` is made, so it equals
    `SentenceTransformer(folder).encode`; None reads them from the model folder's sentence-transformers
    modules (modules.json: a Normalize module -> normalized), else mean pooling, not normalized.
    Raises `InputError` on bad input and `ParityError` on a parity failure, writing nothing.
    """
    started = time.perf_counter()
    out = Path(out_dir).expanduser()
    asked = {"fp32_attention": int8_fp32_attention, "fp32_embeddings": int8_fp32_embeddings, "full_range": int8_full_range}
    _check_arguments(out, opset, int8, {**asked, "full_range": int8_full_range is not None}, pooling)
    full_range, range_reason = _graph.int8_range(int8_full_range)
    recipe_options = {**asked, "full_range": full_range}
    model, source, tok_source = _load_model(model_or_dir)
    parity_tokens = min(256, _positions(model, source))  # a model with fewer positions is checked at its own
    pooling, normalize = _embedding_pipeline(tok_source, pooling, normalize)
    tok = _matching_tokenizer(tokenizer if tokenizer is not None else tok_source, source, model)

    notes: list[str] = []
    with staged_folder(out) as stage:  # an earlier export is replaced only once the new one is whole
        graph = _fused_graph(model, stage / MODEL_FILE, opset, optimize, pooling, normalize, notes)
        batches = _parity.tokenized_batches(tok, graph.inputs, max_length=parity_tokens)
        reference = [_graph.torch_encode(model, b, pooling=pooling, normalize=normalize) for b in batches]
        parity = _check_parity(graph.path, batches, reference)
        if int8:
            int8_min, int8_mean, recipe = _quantize(stage, batches, reference, notes, **recipe_options)
        tok.save_pretrained(stage)
        model.config.save_pretrained(stage)
        int8_facts = {"int8_cosine": int8_min, "int8_mean_cosine": int8_mean, "int8_recipe": recipe,
                      "int8_full_range": full_range, "int8_range_reason": range_reason} if int8 else {}
        report = ExportReport(
            out_dir=str(out), source=source, model_type=str(model.config.model_type), arch=_arch(model.config),
            opset=graph.opset, exporter=_graph.EXPORTER, inputs=graph.inputs, outputs=graph.outputs,
            optimized=graph.optimized, fused=graph.fused, attention_fused=graph.attention_fused,
            fusion=graph.fusion_summary(), parity=parity, pooling=pooling, normalize=normalize, **int8_facts,
            sizes={p.name: p.stat().st_size for p in sorted(stage.glob("*.onnx"))}, versions=_versions(),
            warnings=tuple(notes), seconds=round(time.perf_counter() - started, 2),
        )
        (stage / MANIFEST).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def _positions(model, source: str) -> int:
    """The longest parity sentence the model takes; the graph is traced at 8 tokens, so fewer is refused."""
    positions = _sentence.usable_positions(model.config.to_dict())
    if positions < _graph.TRACE_TOKENS:
        raise InputError(f"{source} takes {positions} tokens (max_position_embeddings); an export needs at least "
                         f"{_graph.TRACE_TOKENS}")
    return positions


def _fused_graph(model, path: Path, opset: int | None, optimize: bool, pooling: str, normalize: bool,
                 notes: list[str]) -> "_graph.GraphInfo":
    """model.onnx, and a note (and warning) when optimisation did not fuse attention."""
    graph = _graph.export_onnx(model, path, opset=opset, optimize=optimize, pooling=pooling, normalize=normalize)
    if optimize and not graph.attention_fused:
        notes.append(graph.fusion_summary())
        warnings.warn(graph.fusion_summary(), stacklevel=2)
    return graph


def _matching_tokenizer(tokenizer_or_source, source: str, model):
    tok = _load_tokenizer(tokenizer_or_source, source)
    vocab = int(model.config.vocab_size)
    if len(tok) > vocab:
        raise InputError(f"tokenizer has {len(tok)} tokens but the model's vocabulary is {vocab}: wrong tokenizer")
    return tok


_OPTION_FLAGS = {"fp32_attention": "--int8-fp32-attention", "fp32_embeddings": "--int8-fp32-embeddings",
                 "full_range": "--int8-range"}


def _check_arguments(out: Path, opset: int | None, int8: bool, recipe_options: dict[str, bool],
                     pooling: str | None) -> None:
    check_out_folder(out, "an earlier kdnas export", MANIFEST)  # never clobber a folder we did not write
    _graph.check_opset(opset)
    given = [_OPTION_FLAGS[name] for name, on in recipe_options.items() if on]
    if given and not int8:
        raise InputError(f"{given[0]} chooses how model.int8.onnx is quantized: add --int8 to write it")
    if pooling is not None:
        _graph.check_pooling(pooling)


def _check_parity(path: str, batches: list, reference: list) -> "_parity.Parity":
    parity = _parity.compare(reference, _parity.run_onnx(path, batches), batches, _parity.FP32_MAX_ABS)
    if not parity.passed:
        raise ParityError(
            f"parity check failed: onnxruntime differs from PyTorch by max-abs {parity.max_abs:.2e} "
            f"(tolerance {parity.tolerance:.0e}, min cosine {parity.cosine:.6f}); nothing was written"
        )
    return parity


def _quantize(stage: Path, batches: list, reference: list, notes: list[str], **recipe_options: bool
              ) -> tuple[float, float, str]:
    """model.int8.onnx beside model.onnx, and its embeddings' cosines to the fp32 reference (a note
    when the mean falls under the quality bar). `recipe_options`: `quantize_int8`'s switches."""
    _graph.quantize_int8(stage / MODEL_FILE, stage / INT8_FILE, **recipe_options)
    recipe = _graph.int8_recipe(**recipe_options)
    cosines = _embedding_cosines(reference, _parity.run_onnx(str(stage / INT8_FILE), batches))
    int8_min, int8_mean = min(cosines), float(np.mean(cosines))
    if int8_mean < _parity.INT8_MEAN_COSINE:
        msg = (f"INT8 quality: mean cosine to fp32 {int8_mean:.4f} < {_parity.INT8_MEAN_COSINE} "
               f"(min {int8_min:.4f}); prefer model.onnx if embedding quality matters")
        notes.append(msg)
        warnings.warn(msg, stacklevel=2)
    return int8_min, int8_mean, recipe


def _load_model(model_or_dir):
    """-> (model, source description, where its tokenizer would be)."""
    from transformers import PreTrainedModel

    if isinstance(model_or_dir, PreTrainedModel):
        tokenizer_home = getattr(model_or_dir, "name_or_path", None) or None
        return _graph.ensure_eager(model_or_dir), type(model_or_dir).__name__, tokenizer_home
    if isinstance(model_or_dir, StudentSpec):
        return build_student(model_or_dir, seed=0).eval(), f"random {model_or_dir.arch}", None
    from kdnas.core.assets import TEACHERS, teacher_path

    name = str(model_or_dir)
    folder = Path(teacher_path(name)) if name in TEACHERS else Path(name).expanduser()
    if not folder.is_dir():
        raise InputError(f"model {name!r} is not a folder or a bundled teacher ({', '.join(TEACHERS)})")
    if not (folder / "config.json").is_file():
        raise InputError(f"model folder {folder} has no config.json (not a transformers model folder)")
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(str(folder), attn_implementation="eager")
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"cannot load a model from {folder}: {_one_line(err)}") from None
    return _graph.ensure_eager(model).eval(), name, str(folder)


def _embedding_pipeline(model_home, pooling: str | None, normalize: bool | None) -> tuple[str, bool]:
    """Explicit choices win; else the model folder's own sentence-transformers modules; else plain mean."""
    if pooling is None or normalize is None:
        home = Path(model_home).expanduser() if model_home else None
        local = home is not None and (home / _sentence.MODULES).is_file()
        found = _sentence.read_sentence_pipeline(home) if local else _sentence.SentencePipeline()
        pooling = found.pooling if pooling is None else pooling
        normalize = found.normalize if normalize is None else normalize
    return _graph.check_pooling(pooling), bool(normalize)


def _load_tokenizer(tokenizer, source: str):
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    if tokenizer is None:
        raise InputError(
            f"no tokenizer for {source}: the parity check needs one; pass tokenizer= (CLI: --tokenizer) "
            "a folder with tokenizer files or a bundled teacher name"
        )
    from kdnas.core.assets import TEACHERS, teacher_path
    from transformers import AutoTokenizer

    folder = teacher_path(str(tokenizer)) if str(tokenizer) in TEACHERS else str(Path(tokenizer).expanduser())
    has_files = any((Path(folder) / f).is_file() for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"))
    if not has_files:
        raise InputError(
            f"no tokenizer files in {folder}; pass --tokenizer with a folder holding them or a bundled teacher name"
        )
    return AutoTokenizer.from_pretrained(folder)


def _embedding_cosines(reference, candidate) -> list[float]:
    return [float(c) for (_, a), (_, b) in zip(reference, candidate) for c in _parity._cosine(a, b)]


def _arch(config) -> str:
    return (f"{config.num_hidden_layers}x{config.num_attention_heads}x{config.hidden_size}"
            f"x{config.intermediate_size}")


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]
