"""Torch encoder -> ONNX graph -> fused graph -> INT8 graph, each step checked.

Exporter choice (measured with torch 2.13, onnxruntime 1.31): the TorchScript exporter
(`dynamo=False`) yields a graph whose attention onnxruntime's BERT optimizer fuses into `Attention`
nodes; the dynamo exporter's graph gets SkipLayerNorm/BiasGelu but 0 Attention. Fused attention is
most of the CPU speed-up, so the TorchScript exporter is used and the fusion is counted, not assumed.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kdnas.core.errors import InputError
from kdnas.core.host import int8_extensions

DEFAULT_OPSET = 17
EXPORTER = "torchscript"
OUTPUT_NAMES = ("last_hidden_state", "sentence_embedding")
TRACE_TOKENS = 8  # the sequence length the graph is traced at (its axes stay dynamic)
# Pooling modes the graph can compute, named as sentence-transformers names them (1_Pooling/config.json).
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens")
# Fused op types onnxruntime's transformer optimizer can produce for a BERT-style encoder.
FUSED_OPS = (
    "EmbedLayerNormalization",
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "Gelu",
    "FastGelu",
    "BiasGelu",
)


@dataclass(frozen=True)
class GraphInfo:
    """What was written and what the optimizer fused (counted in the saved graph)."""

    path: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opset: int
    optimized: bool
    layers: int
    fused: dict[str, int] = field(default_factory=dict)

    @property
    def attention_fused(self) -> bool:
        """True only when every layer's attention became one fused node."""
        return self.fused.get("Attention", 0) + self.fused.get("MultiHeadAttention", 0) >= self.layers

    def fusion_summary(self) -> str:
        counts = ", ".join(f"{op}={n}" for op, n in self.fused.items() if n) or "nothing fused"
        if not self.optimized:
            return "not optimized"
        if self.attention_fused:
            return f"attention fused in all {self.layers} layers ({counts})"
        return (
            f"ATTENTION NOT FUSED ({self.fused.get('Attention', 0)}/{self.layers} layers; {counts}): "
            "onnxruntime's BERT optimizer did not recognise this model's attention, so the graph runs "
            "unfused attention and is slower than a fused BERT of the same size"
        )


def uses_token_type_ids(model) -> bool:
    """MPNet/RoBERTa-style encoders have no segment embedding (or a single one); BERT has two."""
    return getattr(model.config, "type_vocab_size", 0) > 1 and "token_type_ids" in _forward_params(model)


def ensure_eager(model):
    """transformers 5 defaults to SDPA, whose export the ORT optimizer cannot fuse: switch to eager."""
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        model.set_attn_implementation("eager")
    if model.config._attn_implementation != "eager":
        raise InputError(f"could not switch {type(model).__name__} to eager attention, which the fused export needs")
    return model


def export_onnx(
    model, path: str | os.PathLike, *, opset: int | None = None, optimize: bool = True,
    pooling: str = "mean", normalize: bool = False,
) -> GraphInfo:
    """Export a transformers encoder to `path` with dynamic batch/sequence axes.

    Inputs: input_ids, attention_mask (+ token_type_ids where the model has them). Outputs:
    last_hidden_state [batch, seq, hidden] and sentence_embedding [batch, hidden]: mask-aware
    `pooling` (default mean, the bundled teachers' convention), L2-normalized inside the graph when
    `normalize`, so it equals what sentence-transformers' `encode` returns for the same pipeline.
    With `optimize`, the graph is rewritten by onnxruntime's transformer optimizer and the fused
    nodes are counted.
    """
    opset = check_opset(opset)
    check_pooling(pooling)
    model = ensure_eager(model).eval()
    with_tt = uses_token_type_ids(model)
    inputs = ("input_ids", "attention_mask") + (("token_type_ids",) if with_tt else ())
    wrapper = _Encoder(model, with_tt, pooling, normalize).eval()
    dummy = torch.ones(2, TRACE_TOKENS, dtype=torch.long)
    args = (dummy, torch.ones_like(dummy)) + ((torch.zeros_like(dummy),) if with_tt else ())
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs + ("last_hidden_state",)}
    axes["sentence_embedding"] = {0: "batch"}
    path = Path(path)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".onnx-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        # The TorchScript exporter is chatty and deprecated-warns on every call; the result is checked below.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper, args, str(raw), input_names=list(inputs), output_names=list(OUTPUT_NAMES),
                dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False,
            )
        layers = int(model.config.num_hidden_layers)
        if optimize:
            from onnxruntime.transformers.optimizer import optimize_model

            with contextlib.redirect_stdout(io.StringIO()):
                optimized = optimize_model(
                    str(raw), model_type="bert", num_heads=int(model.config.num_attention_heads),
                    hidden_size=int(model.config.hidden_size), opt_level=0,
                )
            optimized.save_model_to_file(str(raw))
        os.replace(raw, path)
    fused = count_ops(path) if optimize else {}
    return GraphInfo(str(path), inputs, OUTPUT_NAMES, opset, optimize, layers, fused)


def check_opset(opset: int | None) -> int:
    # 14: the lowest with the ops the optimizer fuses; 20: the highest the TorchScript exporter emits.
    opset = DEFAULT_OPSET if opset is None else opset
    if not isinstance(opset, int) or not 14 <= opset <= 20:
        raise InputError(f"opset {opset} is not supported: use 14..20 (default {DEFAULT_OPSET})")
    return opset


def check_pooling(pooling: str) -> str:
    """Only modes the graph computes exactly as sentence-transformers does; anything else is refused."""
    if pooling not in POOLING_MODES:
        raise InputError(f"pooling mode {pooling!r} is not supported by the ONNX export: use one of "
                         f"{', '.join(POOLING_MODES)}")
    return pooling


def count_ops(path: str | os.PathLike) -> dict[str, int]:
    """Fused-node counts read back from the saved graph, not from the optimizer's own claim."""
    import onnx

    counts = Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)
    return {op: counts.get(op, 0) for op in FUSED_OPS}


# Ops that hold the embedding tables: the fused graph's EmbedLayerNormalization (word, position and
# segment tables) and, in a plain graph, the Gather that reads each table. Together they are 70-90 %
# of a small student's weights, so an INT8 graph that left them fp32 kept most of the fp32 file.
EMBEDDING_OPS = ("EmbedLayerNormalization", "Gather")


def int8_range(full_range: bool | None = None) -> tuple[bool, str]:
    """Whether INT8 weights use their full 8-bit range, and why: `full_range` where given, else full where this
    CPU has an int8 dot-product extension (VNNI, AMX), 7 bits where it has none (`quantize_int8` says why)."""
    if full_range is not None:
        return bool(full_range), "asked for"
    found = int8_extensions()
    if found:
        return True, f"this CPU has {', '.join(found)}"
    return False, "this CPU has no VNNI/AMX, whose absence makes full-range int8 weights saturate"


def int8_recipe(*, fp32_attention: bool = False, fp32_embeddings: bool = False, full_range: bool | None = None) -> str:
    """What `quantize_int8` does with these options, in words (export.json's `int8_recipe`)."""
    full = int8_range(full_range)[0]
    return ("dynamic, per-channel int8 weights"
            + (", full 8-bit range (VNNI CPUs only)" if full else " in a 7-bit range")
            + (", fused attention fp32" if fp32_attention else ", attention quantized too")
            + (", embedding tables fp32" if fp32_embeddings else ", embedding tables int8"))


def quantize_int8(src: str | os.PathLike, dst: str | os.PathLike, *, fp32_attention: bool = False,
                  fp32_embeddings: bool = False, full_range: bool | None = None) -> None:
    """Dynamic INT8 quantization: per-channel int8 weights, activations quantized at run time.

    Every weight MatMul is quantized, and a fused `Attention` becomes `QAttention`: on this kind of
    CPU the fp32 Attention kernel is half the time of an otherwise-int8 BERT-base graph, so keeping
    it (`fp32_attention=True`) costs most of the speed-up (measured, BERT-base shape, 2 threads:
    about 1.6x vs 2.5x over fp32) for a small quality gain (MiniLM-L6, 256 news sentences: min
    cosine 0.986 vs 0.982). Per-channel scales matter more: per-tensor gives 0.95 (README).
    The embedding tables are stored int8 too (one scale per table; `QEmbedLayerNormalization` in a
    fused graph): the file is a third of what it was with them fp32 and a quarter of fp32's, for a mean
    cosine 0.0003-0.0004 lower and the same speed (one-off benchmark, in git history; docs/export.md);
    `fp32_embeddings=True` keeps them fp32. Which groups of a graph stay fp32 beyond these is a
    precision plan's choice (export.plan_graph).

    Weights use 7 of their 8 bits (onnxruntime's `reduce_range`) unless `full_range`, which by default
    (None) holds where the CPU has VNNI or AMX (`int8_range`): on an x86 CPU without them (AVX2, or
    AVX-512 without VNNI) onnxruntime multiplies uint8 activations by int8 weights with an instruction
    that adds pairs of products into int16 and saturates there, so a layer with large inputs returns
    wrong sums on exactly the CPUs many deploy to. Measured (benchmarks/int8_recipes.py): an MPNet
    student's INT8 graph fell to mean cosine 0.51 to its fp32 graph with full-range weights and reached
    0.996 with 7-bit ones, at the same speed. A graph quantized with full-range weights is only right
    on CPUs with VNNI (AVX512-VNNI, AVX-VNNI, AMX): one built for a CPU without them takes
    `full_range=False`.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ops = ["MatMul"] + ([] if fp32_attention else ["Attention"]) + ([] if fp32_embeddings else list(EMBEDDING_OPS))
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.tmp")
    try:
        logger_level = _quiet_root_logger()
        quantize_dynamic(
            str(src), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
            reduce_range=not int8_range(full_range)[0], op_types_to_quantize=ops,
            # A fused graph carries contrib ops without type inference; tell the quantizer they are fp32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        os.replace(tmp, dst)
    finally:
        _restore_root_logger(logger_level)
        tmp.unlink(missing_ok=True)


class _Encoder(torch.nn.Module):
    """Fixed positional signature for the exporter, plus the pooled (optionally L2-normalized) sentence
    embedding, computed as sentence-transformers' Pooling and Normalize modules compute it."""

    def __init__(self, model, with_token_type_ids: bool, pooling: str = "mean", normalize: bool = False) -> None:
        super().__init__()
        self.model = model
        self.with_token_type_ids = with_token_type_ids
        self.pooling = check_pooling(pooling)
        self.normalize = bool(normalize)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {"token_type_ids": token_type_ids} if self.with_token_type_ids else {}
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            pooled = hidden[:, 0]  # right-padded batches: the first token is [CLS]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask == 0, -1e9).max(1).values
        else:
            count = mask.sum(1).clamp(min=1e-9)
            pooled = (hidden * mask).sum(1) / (count if self.pooling == "mean" else count.sqrt())
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
        return hidden, pooled


def torch_encode(model, batch: dict, *, pooling: str = "mean", normalize: bool = False) -> tuple:
    """The same two outputs as the ONNX graph, from PyTorch (for the parity check)."""
    wrapper = _Encoder(ensure_eager(model).eval(), uses_token_type_ids(model), pooling, normalize).eval()
    args = [torch.as_tensor(batch["input_ids"]), torch.as_tensor(batch["attention_mask"])]
    if "token_type_ids" in batch:
        args.append(torch.as_tensor(batch["token_type_ids"]))
    with torch.inference_mode():
        hidden, pooled = wrapper(*args)
    return hidden.numpy(), pooled.numpy()


def _forward_params(model) -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(model.forward).parameters)


def _quiet_root_logger():
    # quantize_dynamic logs a "consider pre-processing" warning on the root logger on every call.
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    return level


def _restore_root_logger(level) -> None:
    import logging

    logging.getLogger().setLevel(level)
