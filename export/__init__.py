"""ONNX export of BERT-family encoders: parity-checked, fused, optionally INT8, shipped as a folder.

    from export import export_model
    report = export_model("runs/student", "runs/student-onnx", int8=True)
    report.parity.max_abs, report.fused, report.attention_fused, report.int8_cosine
"""

from ._export import ExportReport, export_model
from ._graph import GraphInfo, export_onnx, quantize_int8
from ._parity import Parity

__all__ = ["export_model", "ExportReport", "Parity", "export_onnx", "quantize_int8", "GraphInfo"]
