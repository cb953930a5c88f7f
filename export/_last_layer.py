"""A teacher's last-layer token states from onnxruntime: the pass that labels a transfer set, on a CPU.

That pass is compute-bound and is what a base-size teacher's first search waits on: in the cache's own
batches on 2 CPU cores MPNet labels a news sentence in 53.8 ms in fp32 PyTorch and in 43.7 ms from its plain
(unfused) onnxruntime graph (benchmarks/results/teacher_pass.json), the token states within 3.5e-6 (max-abs)
of PyTorch's; the fused graph was slower (docs/design/base-teacher.md). The graph holds the last layer's states only, which is what the final
recipe and the fidelity proxy distil; a pass that needs other layers, Q/K/V or logits runs PyTorch.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch

from ._graph import export_onnx
from ._parity import graph_feed


class LastLayerGraph:
    """`graph(input_ids, attention_mask) -> [batch, seq, hidden]`: `model`'s last token states from its plain
    fp32 onnxruntime graph on `threads` threads (default: torch's). The graph is exported on the first call,
    from a copy of the model (the export switches attention to eager), and held in memory only."""

    def __init__(self, model: torch.nn.Module, threads: int | None = None) -> None:
        self.model, self.threads = model, threads
        self._session = None
        self._inputs: set[str] = set()

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self._session is None:
            self._open()
        feed = graph_feed({"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}, self._inputs)
        return torch.from_numpy(self._session.run(["last_hidden_state"], feed)[0])

    def _open(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads or torch.get_num_threads()
        with tempfile.TemporaryDirectory(prefix="kdnas-teacher-graph-") as tmp:
            path = Path(tmp) / "teacher.onnx"
            export_onnx(copy.deepcopy(self.model), path, optimize=False)
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
