"""kdnas.evaluation — how good is a student for the user: downstream tasks, embedding fidelity,
linear probes, fine-tuning, task-specific transfer, and the `kdnas evaluate` / `kdnas transfer`
commands. It sits above `distill` and `latency` (it trains classifiers with their parts and times
what it scores) and below `nas`.

Modules, one idea each: `models` (a model folder, its encoder, its sentence embedding),
`fidelity` (Spearman ρ of pairwise cosines vs the teacher), `probe` (MTEB-style logistic
regression on frozen embeddings), `finetune` (a classification head trained over seeds),
`report` (the side-by-side comparison with latency), `compare` (is a difference beyond the
noise?), `baselines` (the untrained models a student must beat, and the verdict), `tasks`,
`task_transfer`.

Public API:
    resolve_model, sentence_embeddings                             a model and its embedding
    embedding_fidelity, probe_scores                               fidelity and MTEB-style probes
    FinetuneConfig, QualityConfig, evaluate, format_table          the report, with latency
    compare                                                        two report rows: ahead, behind or a tie
    students_baselines, distinct_refs, with_verdicts               each student's untrained baselines, judged
    load_task, Task                                                bundled or local labelled tasks
    TransferConfig, task_transfer                                  task-specific distillation
    choose_precision, FidelityScorer, PrecisionChoice              a graph's precision plan, chosen by measurement
"""

from .baselines import distinct_refs, students_baselines, with_verdicts
from .compare import compare
from .fidelity import embedding_fidelity
from .finetune import FinetuneConfig
from .models import resolve_model, sentence_embeddings
from .precision import (MIXED_GRAPH, FidelityScorer, PrecisionChoice, choose_precision, graph_embeddings,
                        int8_graph_of)
from .probe import probe_scores
from .report import QualityConfig, evaluate, format_table, measure_model
from .task_transfer import TransferConfig, task_transfer
from .tasks import Task, load_task

__all__ = [
    "MIXED_GRAPH", "FidelityScorer", "PrecisionChoice", "choose_precision", "graph_embeddings", "int8_graph_of",
    "FinetuneConfig", "QualityConfig", "Task", "TransferConfig", "compare", "embedding_fidelity", "evaluate", "format_table",
    "distinct_refs", "load_task", "measure_model", "probe_scores", "resolve_model", "sentence_embeddings",
    "students_baselines", "task_transfer", "with_verdicts",
]
