"""What a latency profile reads of a graph: its shape and how its dense work splits between fp32 and INT8.

A precision plan is an INT8 graph with some weight groups put back in fp32 (`export.plan_graph`); its latency
is the all-INT8 graph's plus, for each fp32 group, the fp32 product's cost less the INT8 one's (and less the
activations' quantization that group no longer needs). So one linear model prices every graph the search can
ship — fp32, all-INT8 and any plan — from seven costs of one call (`FEATURES`): a fixed cost per call and per
layer, the fp32 and the INT8 weight products (multiply-adds over T = batch × seq tokens), the quantization of
the INT8 products' inputs, attention's score and mix products (L·batch·seq²·h) and the element-wise work of
LayerNorm, GELU and softmax (L·T·(h + f) and L·batch·heads·seq²).

A `Composition` is read off a shape and a precision (`of_arch`: what a trial proposes) or off an ONNX graph
(`of_graph`: what the final stage and the plans time), so both are priced alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kdnas.core.errors import InputError

from ._model import Shape

FEATURES = ("call", "layer", "dense_fp32", "dense_int8", "quantize", "attention", "elementwise")
ROLE_MACS = {"qkv": lambda h, f: 3 * h * h, "attn_out": lambda h, f: h * h, "ffn_in": lambda h, f: h * f,
             "ffn_out": lambda h, f: f * h}
# The weight products' inputs per token, by role: what dynamic quantization reads before an INT8 product.
ROLE_INPUTS = {"qkv": lambda h, f: h, "attn_out": lambda h, f: h, "ffn_in": lambda h, f: h, "ffn_out": lambda h, f: f}
_FP32_OPS = {"MatMul", "Attention", "Gemm", "FusedMatMul"}
_INT8_OPS = {"MatMulInteger", "DynamicQuantizeMatMul", "QAttention", "MatMulIntegerToFloat"}
_LAYER = re.compile(r"layer\.(\d+)/")


@dataclass(frozen=True)
class Composition:
    """A graph as the profile prices it: its shape, and per token the multiply-adds of its fp32 and INT8 weight
    products and the inputs its INT8 products quantize."""

    shape: Shape
    fp32_macs: int
    int8_macs: int
    int8_inputs: int

    @classmethod
    def of_arch(cls, shape: Shape, *, int8: bool = False, fp32_groups: Iterable[str] = ()) -> "Composition":
        """A shape's fp32 graph, or with `int8` its all-INT8 graph with `fp32_groups` ("3.ffn_out", or a role
        "ffn_out" for every layer's) kept fp32 — a precision plan."""
        kept = set(fp32_groups)
        unknown = {g for g in kept if g != "embeddings" and g.split(".")[-1] not in ROLE_MACS}
        if unknown:
            raise InputError(f"plan group {sorted(unknown)[0]!r} is invalid: allowed LAYER.ROLE or ROLE with a role "
                             f"of {', '.join(ROLE_MACS)}, or embeddings")
        h, f = shape.hidden, shape.ffn
        fp32 = q8 = inputs = 0
        for layer in range(shape.layers):
            for role, macs in ROLE_MACS.items():
                if not int8 or role in kept or f"{layer}.{role}" in kept:
                    fp32 += macs(h, f)
                else:
                    q8 += macs(h, f)
                    inputs += ROLE_INPUTS[role](h, f)
        return cls(shape, fp32, q8, inputs)

    @classmethod
    def of_graph(cls, path: str | Path, *, head_size: int | None = None) -> "Composition":
        """An exported encoder graph (fp32, INT8 or a plan): its products read off its weight initializers, its
        shape off its embedding table, its layers' node names and its attention node (else the `config.json`
        beside it; else `head_size`, the teacher's, which the default search space keeps)."""
        import onnx

        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as err:  # onnx raises DecodeError/ValueError/... for a damaged file
            raise InputError(f"ONNX file {path} cannot be read (corrupt or not ONNX): {' '.join(str(err).split())[:200]}") from None
        dims = {i.name: [int(d) for d in i.dims] for i in model.graph.initializer}
        fp32 = q8 = inputs = 0
        layers: set[int] = set()
        ffn, heads = None, None
        for node in model.graph.node:
            if (m := _LAYER.search(node.name)) is not None:
                layers.add(int(m.group(1)))
            weight = next((dims[i] for i in node.input[1:2] if i in dims and len(dims[i]) == 2), None)
            if node.op_type in ("Attention", "QAttention"):
                heads = next((a.i for a in node.attribute if a.name == "num_heads"), heads)
            if weight is None or node.op_type not in _FP32_OPS | _INT8_OPS:
                continue
            if "intermediate/dense" in node.name:
                ffn = weight[1]
            if node.op_type in _FP32_OPS:
                fp32 += weight[0] * weight[1]
            else:
                q8 += weight[0] * weight[1]
                inputs += weight[0]
        hidden = next((d[1] for name, d in dims.items() if "word_embeddings" in name and len(d) == 2), None)
        config = _config_beside(Path(path))
        hidden = hidden or config.get("hidden_size")
        ffn = ffn or config.get("intermediate_size")
        heads = heads or config.get("num_attention_heads") or (hidden // head_size if hidden and head_size else None)
        count = len(layers) or config.get("num_hidden_layers")
        if not (hidden and ffn and heads and count):
            raise InputError(f"ONNX file {path} does not say its shape (no word_embeddings table, layer.N node names "
                             "or config.json beside it): give its architecture LAYERSxHEADSxHIDDENxFFN instead")
        return cls(Shape(int(count), int(heads), int(hidden), int(ffn)), fp32, q8, inputs)

    def features(self, *, batch: int = 1, seq: int = 128) -> np.ndarray:
        """The costs of `FEATURES` for one call, in units that keep their coefficients near one."""
        s = self.shape
        tokens = batch * seq
        return np.array([
            1.0,
            s.layers,
            tokens * self.fp32_macs / 1e9,
            tokens * self.int8_macs / 1e9,
            tokens * self.int8_inputs / 1e6,
            s.layers * batch * seq * seq * s.hidden * 2 / 1e9,
            s.layers * (tokens * (s.hidden + s.ffn) + batch * s.heads * seq * seq) / 1e6,
        ])

    @property
    def precision(self) -> str:
        """`fp32`, `int8` (every product INT8) or `plan` (some of each)."""
        if not self.int8_macs:
            return "fp32"
        return "int8" if not self.fp32_macs else "plan"


def _config_beside(path: Path) -> dict:
    try:
        config = json.loads((path.parent / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}
