"""ONNX export of BERT-family encoders: parity-checked, fused, optionally INT8, shipped as a folder.

    from kdnas.export import export_model
    report = export_model("runs/student", "runs/student-onnx", int8=True)
    report.parity.max_abs, report.fused, report.attention_fused, report.int8_cosine

    # make an HF student folder a sentence-transformers drop-in for its teacher
    write_sentence_transformers("runs/student", teacher_dir, hidden_size=384)
"""

from kdnas.core.sentence import read_sentence_pipeline, write_sentence_transformers  # a basic, named here as before

from ._export import ExportReport, export_model
from ._graph import GraphInfo, check_pooling, export_onnx, int8_recipe, quantize_int8
from ._last_layer import LastLayerGraph
from ._parity import Parity, onnx_sentence_embeddings

__all__ = ["export_model", "ExportReport", "Parity", "export_onnx", "quantize_int8", "int8_recipe", "GraphInfo", "check_pooling",
           "read_sentence_pipeline", "write_sentence_transformers",
           "onnx_sentence_embeddings", "LastLayerGraph"]
