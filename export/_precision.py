"""Precision plans: which weight groups of an exported encoder stay fp32 and which run INT8.

A graph users deploy is a shape *and* a precision. All-INT8 is the fastest and loses most; a few groups
kept fp32 can give most of it back (MPNet's all-INT8 graph: ρ 0.87 to its fp32 graph; two FFN-output
MatMuls of its 96 kept fp32: ρ 0.96 at nearly the same speed). A plan names, per group, INT8 or fp32:

- per layer `L.qkv` (the attention's Q/K/V projections, or the fused `Attention` node that holds them),
  `L.attn_out`, `L.ffn_in`, `L.ffn_out` — each a weight MatMul (or three, for Q/K/V unfused);
- `embeddings`: the embedding tables (the fused `EmbedLayerNormalization`, or each table's `Gather`).

`weight_groups` reads the groups off the fp32 graph's node names (what the TorchScript exporter writes for
every supported family); `plan_graph` writes a plan's graph from the fp32 graph and its all-INT8 twin: the
INT8 graph, with the nodes of the plan's fp32 groups put back as they are in the fp32 graph. That is what
onnxruntime's `quantize_dynamic(nodes_to_exclude=...)` gives (tests/test_precision.py compares the two),
in about a fifth of its time (MPNet: 1.5 s against 7.7 s), which a sensitivity pass over 49 groups needs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from kdnas.core.errors import InputError

EMBEDDINGS = "embeddings"
ROLES = ("qkv", "attn_out", "ffn_in", "ffn_out")
# Node-name patterns of each role, in the TorchScript exporter's names: BERT-style families
# (`attention/self/query`, `attention/output/dense`, `intermediate/dense`, `output/dense`) and MPNet
# (`attention/attn/q`, `attention/attn/o`). Checked in this order: `output/dense` alone is the FFN's.
_ROLE_PATTERNS = (
    ("qkv", re.compile(r"/attention/(self/(query|key|value)|attn/[qkv])/")),
    ("attn_out", re.compile(r"/attention/(output/dense|attn/o)/")),
    ("ffn_in", re.compile(r"/intermediate/dense/")),
    ("ffn_out", re.compile(r"/output/dense/")),
)
_LAYER = re.compile(r"layer\.(\d+)/")


@dataclass(frozen=True)
class Group:
    """One group of weight nodes a plan keeps fp32 or quantizes together."""

    name: str  # "3.ffn_out", "embeddings"
    layer: int | None
    role: str
    nodes: tuple[str, ...]  # node names in the fp32 graph


@dataclass(frozen=True)
class Plan:
    """The groups kept fp32 (every other group INT8), and the weights' range: `full_range` uses all 8 bits,
    right only on CPUs with VNNI/AMX (export.quantize_int8), else 7."""

    fp32: tuple[str, ...] = ()
    full_range: bool = False

    def label(self, groups: int | None = None) -> str:
        """`all-INT8`, `fp32` (every one of `groups` kept) or `INT8, fp32: 7.ffn_out, 8.ffn_out`."""
        if not self.fp32:
            return "all-INT8"
        if groups is not None and len(self.fp32) >= groups:
            return "fp32"
        return "INT8, fp32: " + ", ".join(self.fp32)

    def to_dict(self) -> dict:
        return {"fp32_groups": list(self.fp32), "full_range": self.full_range}


def weight_groups(graph: str | os.PathLike) -> list[Group]:
    """The plan groups of an fp32 graph (`export_onnx`'s, fused or plain): the embedding tables first, then
    each layer's groups in ROLES order. A weight MatMul of no known role is a group of its own (named by
    its node), so every quantizable weight is in exactly one group."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    found: dict[tuple[int | None, str], list[str]] = {}
    for node in model.graph.node:
        key = _group_key(node, weights)
        if key is not None:
            found.setdefault(key, []).append(node.name)
    if not found:
        raise InputError(f"{graph} has no weight MatMul to quantize")
    order = {role: i for i, role in enumerate((EMBEDDINGS,) + ROLES)}
    keys = sorted(found, key=lambda k: (k[0] is not None, k[0] or 0, order.get(k[1], len(order)), k[1]))
    return [Group(_name(layer, role), layer, role, tuple(found[(layer, role)])) for layer, role in keys]


def _group_key(node, weights: set[str]) -> tuple[int | None, str] | None:
    """(layer, role) of a node a quantizer touches, None for the others."""
    if node.op_type in ("EmbedLayerNormalization",):
        return None, EMBEDDINGS
    if node.op_type == "Gather" and node.input and node.input[0] in weights:
        return None, EMBEDDINGS  # a table read by index: word, position, segment, relative position bias
    if node.op_type == "Attention":  # fused: its Q/K/V weights are one initializer; the layer is in its output
        return _layer_of(" ".join(node.output), node.name), "qkv"
    if node.op_type != "MatMul" or not any(name in weights for name in node.input):
        return None  # activation x activation (attention scores): never quantized
    for role, pattern in _ROLE_PATTERNS:
        if pattern.search(node.name):
            return _layer_of(node.name, node.name), role
    return None, node.name


def _layer_of(text: str, node_name: str) -> int:
    match = _LAYER.search(text)
    if match is None:
        raise InputError(f"cannot tell which layer the graph node {node_name!r} belongs to")
    return int(match.group(1))


def _name(layer: int | None, role: str) -> str:
    return role if layer is None else f"{layer}.{role}"


def check_plan(plan: Plan, groups: Iterable[Group]) -> None:
    """Every group the plan names exists in the graph, else one line naming the first that does not."""
    names = [g.name for g in groups]
    for name in plan.fp32:
        if name not in names:
            raise InputError(f"precision plan group {name!r} is not in this graph; its groups: {', '.join(names)}")


def plan_graph(fp32: str | os.PathLike, int8: str | os.PathLike, dst: str | os.PathLike, plan: Plan,
               groups: Iterable[Group]) -> Path:
    """Write `plan`'s graph to `dst`: `int8` (the all-INT8 graph of `fp32`, quantized with the plan's
    range) with the nodes of the plan's fp32 groups as they are in `fp32`. Returns `dst`."""
    import onnx

    groups = list(groups)
    check_plan(plan, groups)
    keep = {node for g in groups if g.name in plan.fp32 for node in g.nodes}
    mixed = restore_nodes(onnx.load(str(fp32)), onnx.load(str(int8)), keep)
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.tmp")
    try:
        onnx.save(mixed, str(tmp))
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def restore_nodes(fp32, int8, keep: Collection[str]):
    """A copy of the quantized model `int8` whose nodes named in `keep` are the fp32 model's own again.

    Each kept node takes the place of whatever produced its outputs in `int8` (a MatMul's
    DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul chain ends in a node writing the MatMul's own
    output name; a QAttention or QEmbedLayerNormalization writes its original's outputs), with its fp32
    weights; what then feeds nothing (the chain, the int8 weights) is dropped."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(int8)
    originals = [n for n in fp32.graph.node if n.name in keep]
    missing = set(keep) - {n.name for n in originals}
    if missing:
        raise InputError(f"nodes not in the fp32 graph: {', '.join(sorted(missing))}")
    by_output = {name: node for node in originals for name in node.output}
    nodes, placed = [], set()
    for node in out.graph.node:
        replaced = [by_output[name] for name in node.output if name in by_output]
        if not replaced:
            nodes.append(node)
            continue
        for original in replaced:
            if original.name not in placed:
                placed.add(original.name)
                nodes.append(original)
    if placed != set(keep):
        raise InputError(f"the INT8 graph does not compute {', '.join(sorted(set(keep) - placed))} as its fp32 "
                         "graph names it: quantize the same graph")
    have = {i.name for i in out.graph.initializer}
    fp32_weights = {i.name: i for i in fp32.graph.initializer}
    needed = {name for node in originals for name in node.input if name in fp32_weights and name not in have}
    # A weight the INT8 graph reads through a DequantizeLinear (one the exporter shared between a quantized
    # node and others) is fp32 again for every reader, as it is when the quantizer leaves its node alone.
    nodes = [n for n in nodes if not (n.op_type == "DequantizeLinear" and set(n.output) & needed)]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(fp32_weights[name] for name in sorted(needed))
    _drop_dead(out.graph)
    return out


def _drop_dead(graph) -> None:
    """Remove nodes whose outputs nothing reads (repeatedly), then unread initializers and stale shapes."""
    outputs = {o.name for o in graph.output}
    while True:
        read = outputs | {name for node in graph.node for name in node.input}
        live = [n for n in graph.node if any(name in read for name in n.output)]
        if len(live) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(live)
    read = outputs | {name for node in graph.node for name in node.input}
    weights = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(weights)
    made = {name for node in graph.node for name in node.output} | {i.name for i in graph.input}
    shapes = [v for v in graph.value_info if v.name in made]
    del graph.value_info[:]
    graph.value_info.extend(shapes)
