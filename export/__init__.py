"""ONNX export of BERT-family encoders: parity-checked, fused, optionally INT8, shipped as a folder.

    from kdnas.export import export_model
    report = export_model("runs/student", "runs/student-onnx", int8=True)
    report.parity.max_abs, report.fused, report.attention_fused, report.int8_cosine

    # make an HF student folder a sentence-transformers drop-in for its teacher
    write_sentence_transformers("runs/student", teacher_dir, hidden_size=384)

    # precision plans: which weight groups stay fp32 (the rest INT8)
    groups = weight_groups("runs/student-onnx/model.onnx")            # 0.qkv, 0.attn_out, ..., embeddings
    plan_graph(fp32, int8, "mixed.onnx", Plan(("3.ffn_out",)), groups)
    Planner(fp32, workdir, score, latency).within_budget(8.0)         # grown along measured sensitivity
"""

from kdnas.core.sentence import SentencePipeline, read_sentence_pipeline, write_sentence_transformers  # a basic

from ._export import ExportReport, export_model
from ._graph import GraphInfo, check_pooling, export_onnx, int8_range, int8_recipe, quantize_int8
from ._last_layer import LastLayerGraph
from ._parity import Parity, onnx_sentence_embeddings
from ._plans import CONFIRM_STEPS, FIDELITY_TIE, Effect, Planner, PlanPoint, check_goal, growth_order
from ._precision import EMBEDDINGS, ROLES, Group, Plan, plan_graph, restore_nodes, weight_groups

__all__ = ["export_model", "ExportReport", "Parity", "export_onnx", "quantize_int8", "int8_recipe", "int8_range",
           "GraphInfo", "check_pooling", "read_sentence_pipeline", "SentencePipeline",
           "write_sentence_transformers", "onnx_sentence_embeddings", "LastLayerGraph",
           "Group", "Plan", "EMBEDDINGS", "ROLES", "weight_groups", "plan_graph", "restore_nodes",
           "Effect", "PlanPoint", "Planner", "check_goal", "growth_order", "CONFIRM_STEPS", "FIDELITY_TIE"]
