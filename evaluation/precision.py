"""A precision plan chosen by measurement: the fidelity of a graph's sentence embeddings on held-out
sentences (against the model's own fp32 graph, and against its teacher where one is given) and the graph's
latency, read by the caller's judge, for the plans `export.Planner` grows.

`choose_precision` runs the planner on an exported folder's `model.onnx`, writes the chosen plan as
`model.mixed.onnx` when it is neither the fp32 graph nor the all-INT8 one, and records the plan, each
group's measured effect and the plan's latency under `precision` in the folder's `export.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kdnas.core.files import atomic_write_text

from .fidelity import embedding_fidelity

MIXED_GRAPH = "model.mixed.onnx"
FP32_GRAPH, INT8_GRAPH = "model.onnx", "model.int8.onnx"
PLAN_SENTENCES = 300  # held-out sentences a plan is chosen on (MPNet: about 4 s a graph on 2 cores)
PLAN_PAIRS = 4000


@dataclass
class FidelityScorer:
    """A graph's fidelity on `sentences` against each reference embedding (`references`, by name); calling it
    gives the `primary` one. Each graph is run once, however many references score it."""

    tokenizer: Any
    sentences: Sequence[str]
    references: dict[str, torch.Tensor]
    primary: str
    max_len: int = 128
    seed: int = 0
    _seen: dict[str, dict[str, float]] = field(default_factory=dict)
    _last: dict[str, dict[str, float]] = field(default_factory=dict)  # by path: the latest file scored there

    def __call__(self, graph: Path) -> float:
        return self.all(graph)[self.primary]

    def all(self, graph: Path) -> dict[str, float]:
        from kdnas.export import onnx_sentence_embeddings

        key = f"{graph}:{os.stat(graph).st_mtime_ns}"
        if key not in self._seen:
            emb = torch.from_numpy(onnx_sentence_embeddings(graph, self.tokenizer, self.sentences, max_len=self.max_len))
            self._seen[key] = {name: float(embedding_fidelity(ref, emb, pairs=PLAN_PAIRS, seed=self.seed)["spearman"])
                               for name, ref in self.references.items()}
            self._last[str(graph)] = self._seen[key]
        return self._seen[key]

    def last(self, graph: Path) -> dict[str, float] | None:
        """The scores of the latest graph scored at `graph`'s path, though it was since removed (a sensitivity
        pass removes each group's graph once scored); None where none was."""
        return self._last.get(str(graph))


@dataclass(frozen=True)
class PrecisionChoice:
    """The plan chosen for one exported graph, and what it was chosen on."""

    goal: dict[str, float]  # {"budget_ms": M} or {"target_fidelity": F}
    reference: str  # what `fidelity` is measured against: "fp32" (the model's own graph) or "teacher"
    plan: dict[str, Any]  # export.Plan.to_dict()
    label: str
    graph: str  # the file of the folder that holds the plan
    fidelity: dict[str, float]  # against each reference, on the plan sentences
    latency_ms: float
    int8_fidelity: dict[str, float]  # the all-INT8 graph's, for comparison
    int8_latency_ms: float | None
    effects: list[dict[str, Any]]  # every group's gain, in the order plans grow
    path: list[dict[str, Any]]  # the plans measured while growing
    range_reason: str
    sentences: int
    seconds: float
    cut_short: bool = False  # its growth stopped at its time limit (`until`): the all-INT8 graph stood

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def choose_precision(folder: str | os.PathLike, scorer: FidelityScorer, latency: Callable[[Path], float], *,
                     budget_ms: float | None = None, target_fidelity: float | None = None,
                     write: bool = True, until: float | None = None) -> PrecisionChoice | None:
    """Grow a plan for `folder/model.onnx` to `budget_ms` (best fidelity within it) or `target_fidelity` (the
    fastest plan holding it), scored by `scorer` and timed by `latency`; the plans' INT8 groups are those of
    the folder's `model.int8.onnx` (its weight range: export.json's `int8_full_range`). With `write`, a mixed
    plan is saved as `model.mixed.onnx` and the choice under `precision` in `export.json`. None when no plan
    meets the goal (nothing is written). `until` (a `time.monotonic()` value): past it a budget's plan stops growing
    and the all-INT8 graph stands (`Planner.until`; `cut_short` says so)."""
    from kdnas.export import Planner, check_goal

    check_goal(target_fidelity, budget_ms)
    folder = Path(folder)
    manifest = json.loads((folder / "export.json").read_text())
    full, why = bool(manifest.get("int8_full_range")), manifest.get("int8_range_reason") or "7-bit (an older export)"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".plans-", dir=folder) as tmp:
        planner = Planner(folder / FP32_GRAPH, Path(tmp), scorer, latency, full_range=full, int8=folder / INT8_GRAPH,
                          until=until)
        point = planner.within_budget(budget_ms) if budget_ms is not None else planner.to_target(target_fidelity)
        if point is None:
            return None
        effects = _effects(planner, scorer)
        all_int8 = planner.along(0)
        graph = planner.graph(point.plan)
        name = FP32_GRAPH if graph == folder / FP32_GRAPH else (INT8_GRAPH if not point.plan.fp32 else MIXED_GRAPH)
        choice = PrecisionChoice(
            goal={"budget_ms": budget_ms} if budget_ms is not None else {"target_fidelity": target_fidelity},
            reference=scorer.primary, plan=point.plan.to_dict(), label=point.label, graph=name,
            fidelity=scorer.all(graph), latency_ms=float(point.latency_ms),
            int8_fidelity=scorer.all(planner.graph(all_int8)),
            int8_latency_ms=planner.known_latency(all_int8), effects=effects,
            path=[p.to_dict() for p in planner.measured()], range_reason=why, sentences=len(scorer.sentences),
            seconds=round(time.perf_counter() - started, 2), cut_short=planner.cut_short)
        if write:
            _write(folder, graph, name, choice)
    return choice


def _effects(planner: Any, scorer: FidelityScorer) -> list[dict[str, Any]]:
    """Each group's effect in growth order, with its fidelity against every reference (the sensitivity pass
    is skipped when the fp32 graph or the all-INT8 one met the goal: then there are none)."""
    if planner.order is None:
        return []
    def by_reference(group: str) -> dict[str, float]:  # scored by the pass: not built and run a second time
        plan = planner.plan((group,))
        return scorer.last(planner.graph_path(plan)) or scorer.all(planner.graph(plan))

    return [{**e.to_dict(), "fidelity_by_reference": by_reference(e.group)} for e in planner.effects()]


def _write(folder: Path, graph: Path, name: str, choice: PrecisionChoice) -> None:
    (folder / MIXED_GRAPH).unlink(missing_ok=True)
    if name == MIXED_GRAPH:
        shutil.copyfile(graph, folder / f".{MIXED_GRAPH}.tmp")
        os.replace(folder / f".{MIXED_GRAPH}.tmp", folder / MIXED_GRAPH)
    manifest_file = folder / "export.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
    manifest["precision"] = choice.to_dict()
    manifest.setdefault("sizes", {})
    for path in sorted(folder.glob("*.onnx")):
        manifest["sizes"][path.name] = path.stat().st_size
    atomic_write_text(manifest_file, json.dumps(manifest, indent=2) + "\n")


def graph_embeddings(graph: str | os.PathLike, tokenizer: Any, sentences: Sequence[str], max_len: int = 128) -> torch.Tensor:
    """The `sentence_embedding` of an exported graph for `sentences`, as a tensor (a reference for a scorer)."""
    from kdnas.export import onnx_sentence_embeddings

    return torch.from_numpy(np.asarray(onnx_sentence_embeddings(graph, tokenizer, sentences, max_len=max_len)))


def int8_graph_of(model: Any, folder: str | os.PathLike) -> Path:
    """`model` (a PyTorch encoder) as its fused graph and all-INT8 twin in `folder` (mean-pooled
    `sentence_embedding`, this CPU's weight range); returns the INT8 graph's path. No parity check: what a
    search scores a trial's INT8 graph by, in a few seconds."""
    from kdnas.export import export_onnx, quantize_int8

    folder = Path(folder)
    graph = export_onnx(model, folder / FP32_GRAPH)
    quantize_int8(graph.path, folder / INT8_GRAPH)
    return folder / INT8_GRAPH

