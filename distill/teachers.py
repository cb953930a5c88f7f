"""Teacher (and student) adapters: read hidden states and per-layer Q/K/V from a model.

SDPA attention returns no attention maps, so Q/K/V are captured with forward hooks on the
projection modules; every method that needs attention (MiniLM v1/v2, DirectMiniLM, XtremeDistil)
rebuilds what it needs from them. A new model family is one `_Family` entry: where its layers
and its Q/K/V projections live.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kdnas.core import assets
from kdnas.core.families import student_family
from kdnas.core.sentence import usable_positions
from .activations import Activations, ModelDims, Needs
from kdnas.core.errors import InputError, first_line


@dataclass(frozen=True)
class _Family:
    """Where one model family keeps its encoder layers and attention projections."""

    model_types: tuple[str, ...]
    layers: str  # attribute path from the base model to the layer list
    qkv: tuple[str, str, str]  # attribute paths from one layer to its Q, K, V projections


_FAMILIES = (
    _Family(("bert", "roberta", "xlm-roberta", "camembert", "electra"), "encoder.layer",
            ("attention.self.query", "attention.self.key", "attention.self.value")),
    _Family(("mpnet",), "encoder.layer", ("attention.attn.q", "attention.attn.k", "attention.attn.v")),
    _Family(("distilbert",), "transformer.layer", ("attention.q_lin", "attention.k_lin", "attention.v_lin")),
)


def _family(model_type: str) -> _Family:
    for family in _FAMILIES:
        if model_type in family.model_types:
            return family
    supported = sorted(t for f in _FAMILIES for t in f.model_types)
    raise InputError(f"model type {model_type!r} has no teacher adapter; supported: {', '.join(supported)}")


def _get(obj: nn.Module, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def base_model(model: nn.Module) -> nn.Module:
    """The encoder inside a task model (e.g. BertForMaskedLM.bert), or the model itself."""
    prefix = getattr(model, "base_model_prefix", "")
    inner = getattr(model, prefix, None) if prefix else None
    return inner if isinstance(inner, nn.Module) else model


def model_dims(model: nn.Module) -> ModelDims:
    return config_dims(model.config)


def config_dims(config) -> ModelDims:
    """The shape facts a method needs, from a transformers config."""
    return ModelDims(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=config.num_attention_heads,
        ffn=getattr(config, "intermediate_size", 0),
    )


@contextmanager
def _capture_qkv(model: nn.Module, layers: frozenset[int], into: Activations) -> Iterator[None]:
    family = _family(model.config.model_type)
    encoder_layers = _get(base_model(model), family.layers)
    handles = []
    for i in sorted(layers):
        if not 1 <= i <= len(encoder_layers):
            raise InputError(f"layer {i} requested but the model has {len(encoder_layers)} layers")
        layer = encoder_layers[i - 1]
        for path, store in zip(family.qkv, (into.query, into.key, into.value)):
            def hook(_module, _inputs, output, store=store, i=i):
                store[i] = output

            handles.append(_get(layer, path).register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def activations(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, needs: Needs) -> Activations:
    """One forward pass returning what `needs` asks for (gradients flow if enabled)."""
    out = Activations()
    with _capture_qkv(model, needs.qkv, out):
        result = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=bool(needs.hidden),
            return_dict=True,
        )
    if needs.hidden:
        states = result.hidden_states
        out.hidden = {i: states[i] for i in sorted(needs.hidden)}
    if needs.logits:
        logits = getattr(result, "logits", None)
        if logits is None:
            raise InputError("the model has no masked-LM head, so it has no logits for OD")
        out.logits = logits
    return out


@dataclass
class Teacher:
    """A frozen teacher: model, tokenizer and the facts a student needs to match it."""

    name: str
    model: nn.Module
    tokenizer: object
    fingerprint: str
    has_mlm_head: bool

    @property
    def dims(self) -> ModelDims:
        return model_dims(self.model)

    def student_sizes(self) -> dict[str, object]:
        """Vocabulary/position/segment sizes and the family (core.families) a student needs to share this
        tokenizer and to be this teacher's own model class; a teacher of a family with no student class
        gets a BERT student. A teacher without segment embeddings (MPNet) gives its student one segment:
        its graph then takes no token_type_ids, which the teacher's tokenizer never makes."""
        config = self.model.config
        positions = min(int(getattr(self.tokenizer, "model_max_length", 512) or 512), 512,
                        usable_positions(config.to_dict()))
        return {
            "vocab_size": int(len(self.tokenizer)),
            "max_position": positions,
            "type_vocab_size": max(int(getattr(config, "type_vocab_size", 1) or 1), 1),
            "pad_token_id": int(self.tokenizer.pad_token_id or 0),
            "family": student_family(config.model_type),
        }

    @torch.inference_mode()
    def activations(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, needs: Needs) -> Activations:
        return activations(self.model, input_ids, attention_mask, needs)


def load_teacher(name_or_path: str, *, mlm: bool = False, device: str | torch.device = "cpu") -> Teacher:
    """Load a teacher by bundled name (`minilm-l6`, `mpnet-base`), local folder, or hub name.

    With `mlm=True` the masked-LM head is required (OD); a checkpoint without trained head
    weights is an error rather than a randomly initialised head.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    path = assets.teacher_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise InputError(f"teacher {name_or_path!r} could not be loaded: {first_line(err)}") from None
    try:  # a damaged tokenizer file raises the tokenizers library's own Exception, not an OSError
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - any failure here is the folder's, said in one line
        raise InputError(f"teacher {name_or_path!r}: its tokenizer ({_files(path, 'tokenizer')}) does not load: "
                         f"{first_line(err)}") from None
    _family(config.model_type)  # fail early, with the list of supported families

    has_head = any("ForMaskedLM" in a for a in (config.architectures or []))
    try:  # a folder with a config and a tokenizer but no (readable) weights
        # shapes that do not match the config are reported (and refused below), not raised without saying which
        auto = AutoModelForMaskedLM if mlm else AutoModel
        model, info = auto.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as err:  # noqa: BLE001 - a truncated download raises safetensors' own error type
        raise InputError(f"teacher {name_or_path!r}: its weights ({_files(path, 'model')}) could not be loaded: "
                         f"{first_line(err)}") from None
    _check_loaded(name_or_path, path, info, mlm)
    if mlm:
        missing = [k for k in info.get("missing_keys", []) if "lm_head" in k or "cls.predictions" in k]
        if missing or not has_head:
            raise InputError(
                f"OD needs a teacher with a trained masked-LM head; {name_or_path!r} has none "
                "(pass a *ForMaskedLM checkpoint, or use a method such as hs or minilmv2)"
            )
    model.eval().requires_grad_(False).to(device)
    return Teacher(
        name=name_or_path,
        model=model,
        tokenizer=tokenizer,
        fingerprint=_fingerprint(name_or_path, path, mlm),
        has_mlm_head=mlm,
    )


def _files(path: str, stem: str) -> str:
    """The teacher folder's files named `stem*` (model.safetensors, tokenizer.json ...), for an error line."""
    from pathlib import Path

    found = sorted(p.name for p in Path(path).glob(f"{stem}*") if p.is_file())
    return ", ".join(str(Path(path) / name) for name in found) or f"no {stem} file in {path}"


def _check_loaded(name: str, path: str, info: dict, mlm: bool) -> None:
    """Weights whose shapes do not match the config (a config.json edited, or of another model) leave
    tensors freshly initialised: refused, naming the first, rather than a teacher of random layers."""
    problems = [f"{k} {tuple(a)} in the weights, {tuple(b)} in config.json"
                for k, a, b in (info.get("mismatched_keys") or [])]
    missing = [k for k in info.get("missing_keys") or [] if not (mlm and ("lm_head" in k or "cls.predictions" in k))
               and "position_ids" not in k]
    if problems or missing:
        what = problems[0] if problems else f"{missing[0]} is missing from the weights"
        raise InputError(f"teacher {name!r}: its weights ({_files(path, 'model')}) do not match its config.json: "
                         f"{what}" + (f" (and {len(problems) + len(missing) - 1} more)" if len(problems) + len(missing) > 1 else ""))


def teacher_from_model(name: str, model: nn.Module, tokenizer: object) -> Teacher:
    """Wrap an in-memory model (e.g. a trained teacher assistant) as a teacher."""
    model.eval().requires_grad_(False)
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes()[:4096])
    return Teacher(name=name, model=model, tokenizer=tokenizer, fingerprint=digest.hexdigest()[:16],
                   has_mlm_head=hasattr(model, "cls") or hasattr(model, "lm_head"))


def _fingerprint(name: str, path: str, mlm: bool) -> str:
    """Identifies the teacher's weights for the target cache, without hashing gigabytes each run."""
    digest = hashlib.sha256(f"{name}|mlm={mlm}".encode())
    if name in assets.TEACHERS:
        digest.update(json.dumps(assets.TEACHERS[name].files, sort_keys=True).encode())
    else:
        folder = Path(path)
        for file in sorted(folder.glob("*")) if folder.is_dir() else []:
            if file.is_file():
                st = file.stat()
                digest.update(f"{file.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        if not folder.is_dir():
            digest.update(path.encode())
    return digest.hexdigest()[:16]
