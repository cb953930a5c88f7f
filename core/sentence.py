"""The sentence-transformers files that make a student folder a drop-in for its teacher.

A basic (file I/O only) because every command that writes a student writes them: `kdnas distill`
(distill.trainer), `kdnas search`'s best/ (beside its ONNX graphs, export), the benchmarks.

`SentenceTransformer(folder)` on a folder without `modules.json` builds plain mean pooling with no
normalization (sentence-transformers 6), whatever the teacher did. The bundled teachers normalize,
so a student shipped without these files would silently give different embeddings (and a different
`sentence_embedding` from its own ONNX graph). The pipeline is therefore read from the teacher's
module files and written explicitly, with the pooling dimension set to the student's hidden size.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .errors import InputError
from .families import FAMILIES
from .files import atomic_write_text

MODULES = "modules.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
ST_CONFIG = "sentence_bert_config.json"
ST_MODEL_CONFIG = "config_sentence_transformers.json"
# The format written is the one sentence-transformers has read since 2.0 (what the bundled teachers carry).
FORMAT_VERSION = "2.0.0"
_TYPE = "sentence_transformers.models."
# Legacy boolean keys of 1_Pooling/config.json -> sentence-transformers' mode names.
_LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Position embeddings these model types reserve for padding (usable positions = max - pad_token_id - 1).
_OFFSET_POSITIONS = tuple(name for name, f in FAMILIES.items() if f.offset_positions)


@dataclass(frozen=True)
class SentencePipeline:
    """How a (teacher) folder turns token states into a sentence embedding (`read_sentence_pipeline`): its pooling,
    whether it normalizes, its max_seq_length (None when the folder does not say) and do_lower_case, the module
    types a student cannot copy (`dropped`, e.g. Dense: it has no weights for them) and where the facts came from.
    The defaults are sentence-transformers' own for a folder without modules.json."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    do_lower_case: bool = False
    dropped: tuple[str, ...] = ()
    source: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "dropped": list(self.dropped)}

    @classmethod
    def from_dict(cls, facts: dict) -> SentencePipeline:
        """The pipeline as a manifest stores it (`to_dict`, or what `write_sentence_transformers` returned)."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: tuple(value) if key == "dropped" else value for key, value in facts.items() if key in known})


def has_sentence_modules(model_dir: str | os.PathLike | None) -> bool:
    """Whether `model_dir` is a sentence-transformers model (it has a modules.json)."""
    return _find(model_dir, MODULES) is not None


def read_sentence_pipeline(model_dir: str | os.PathLike | None) -> SentencePipeline:
    """How a (teacher) folder turns token states into a sentence embedding, from its module files. A folder
    without modules.json gets sentence-transformers' own default for such a folder: mean pooling, no normalization.
    """
    modules_file = _find(model_dir, MODULES)
    if modules_file is None:
        return SentencePipeline(source=f"default (no {MODULES} for {model_dir}): mean pooling, not normalized")
    modules = _read_json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(module, dict) for module in modules):
        raise InputError(f"{modules_file} is not a list of modules; expected sentence-transformers' {MODULES}")
    pooling, normalize, dropped = "mean", False, []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooling = _pooling_mode(_find(model_dir, f"{module.get('path') or POOLING_DIR}/config.json"))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            dropped.append(kind)
    settings = _find(model_dir, ST_CONFIG)
    config = _read_json(settings) if settings is not None else {}
    return SentencePipeline(pooling=pooling, normalize=normalize, max_seq_length=config.get("max_seq_length"),
                            do_lower_case=bool(config.get("do_lower_case", False)), dropped=tuple(dropped),
                            source=f"{modules_file}")


def write_sentence_transformers(dest: str | os.PathLike, teacher_dir: str | os.PathLike | None,
                                hidden_size: int) -> dict:
    """Write modules.json, 1_Pooling/, 2_Normalize/ (if the teacher normalizes), sentence_bert_config.json
    and config_sentence_transformers.json into the HF model folder `dest`, copying the teacher's choices.

    The pooling dimension is the student's `hidden_size`; max_seq_length is the teacher's, capped by
    the student's usable positions (read from dest/config.json). Returns the pipeline facts written.
    """
    dest = Path(dest)
    config = _student_config(dest, hidden_size)
    pipeline = read_sentence_pipeline(teacher_dir)
    positions = usable_positions(config)
    teacher_len = pipeline.max_seq_length
    max_len = min(int(teacher_len), positions) if teacher_len else positions
    modules = [{"idx": 0, "name": "0", "path": "", "type": _TYPE + "Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": _TYPE + "Pooling"}]
    # The legacy keys, as the teachers write them: every sentence-transformers release reads them.
    pooling = {"word_embedding_dimension": int(hidden_size),
               **{key: mode == pipeline.pooling for key, mode in _LEGACY_MODES.items()}}
    _write_json(dest / POOLING_DIR / "config.json", pooling)
    files = [MODULES, f"{POOLING_DIR}/config.json", ST_CONFIG, ST_MODEL_CONFIG]
    if pipeline.normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": _TYPE + "Normalize"})
        _write_json(dest / NORMALIZE_DIR / "config.json", {})  # a folder git and hubs keep; no settings
        files.append(f"{NORMALIZE_DIR}/config.json")
    _write_json(dest / ST_CONFIG, {"max_seq_length": max_len, "do_lower_case": pipeline.do_lower_case})
    _write_json(dest / ST_MODEL_CONFIG, _model_config(teacher_dir))
    _write_json(dest / MODULES, modules)  # last: a folder with modules.json has all the files it names
    return {**pipeline.to_dict(), "max_seq_length": max_len, "files": files}


def _pooling_mode(config_file: Path | None) -> str:
    if config_file is None:
        return "mean"  # sentence-transformers' Pooling default
    config = _read_json(config_file)
    mode = config.get("pooling_mode")
    modes = [mode] if isinstance(mode, str) else list(mode or [])
    modes = modes or [name for key, name in _LEGACY_MODES.items() if config.get(key)] or ["mean"]
    if len(modes) != 1 or modes[0] not in _LEGACY_MODES.values():
        raise InputError(f"{config_file}: pooling {modes} is not supported: use one of "
                         f"{', '.join(_LEGACY_MODES.values())}")
    return str(modes[0])


def _student_config(dest: Path, hidden_size: int) -> dict:
    config_file = dest / "config.json"
    if not config_file.is_file():
        raise InputError(f"{dest} has no config.json: write the model folder before its sentence-transformers files")
    config = _read_json(config_file)
    if int(config.get("hidden_size", hidden_size)) != int(hidden_size):
        raise InputError(f"hidden_size {hidden_size} does not match {config_file} ({config['hidden_size']})")
    return config


def usable_positions(config: dict) -> int:
    """The sequence length a model's config allows: its position embeddings, less those RoBERTa-style
    models (MPNet too) reserve for padding. Raises ValueError/TypeError where a field is not a number."""
    positions = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in _OFFSET_POSITIONS:
        positions -= int(config.get("pad_token_id", 1) or 0) + 1
    return positions


def _model_config(teacher_dir) -> dict:
    """The teacher's settings (prompts, similarity), stamped with the versions that wrote the student."""
    import torch
    import transformers

    found = _find(teacher_dir, ST_MODEL_CONFIG)
    config = _read_json(found) if found is not None else {}
    teacher_format = (config.get("__version__") or {}).get("sentence_transformers", FORMAT_VERSION)
    config["__version__"] = {"sentence_transformers": teacher_format, "transformers": transformers.__version__,
                             "pytorch": torch.__version__}
    config.setdefault("model_type", "SentenceTransformer")
    config.setdefault("prompts", {})
    config.setdefault("default_prompt_name", None)
    config.setdefault("similarity_fn_name", "cosine")
    return config


def _find(model_dir, name: str) -> Path | None:
    """A file of a local folder, or of a hub model already in (or reachable for) the local cache."""
    if model_dir is None:
        return None
    folder = Path(model_dir).expanduser()
    if folder.is_dir():
        return folder / name if (folder / name).is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(str(model_dir), name))
    except Exception:  # not a hub name, no such file, or offline without it cached: the folder does not say
        return None


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {path}: {err}") from None


def _write_json(path: Path, value) -> None:
    """Atomic, so a reader never sees half a config."""
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")
