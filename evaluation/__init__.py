"""kdnas.evaluation — how good is a student for the user: downstream tasks, embedding fidelity,
linear probes, fine-tuning, task-specific transfer, and the `kdnas evaluate` / `kdnas transfer`
commands. It sits above `distill` and `latency` (it trains classifiers with their parts and times
what it scores) and below `nas`.

Public API:
    QualityConfig, measure_model, embedding_fidelity, probe_scores   fidelity and MTEB-style probes
    FinetuneConfig, evaluate, format_table                           fine-tuning table, with latency
    load_task, Task                                                  bundled or local labelled tasks
    TransferConfig, task_transfer                                    task-specific distillation
"""

from .finetune import FinetuneConfig, evaluate, format_table
from .quality import QualityConfig, embedding_fidelity, measure_model, probe_scores
from .task_transfer import TransferConfig, task_transfer
from .tasks import Task, load_task

__all__ = [
    "FinetuneConfig", "QualityConfig", "Task", "TransferConfig", "embedding_fidelity", "evaluate", "format_table",
    "load_task", "measure_model", "probe_scores", "task_transfer",
]
