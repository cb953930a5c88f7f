"""Multi-stage recipes built from single runs of `distill`.

- HS then OD (comparative analysis, §5: the best OD recipe starts from the HS checkpoint).
- Teacher assistant (MiniLM, §3.3): teacher -> assistant (L_T layers, d_S hidden) -> student.
Both report held-out L_HS against the original teacher, so their numbers compare with single runs.
"""

from __future__ import annotations

import dataclasses

from .cache import TeacherCache
from .checkpoint import Checkpoints
from .data import TransferSet
from .evaluate import Evaluator
from .methods import build_method, teacher_assistant_advised
from kdnas.core.spec import StudentSpec
from .teachers import Teacher, teacher_from_model
from .trainer import DistillConfig, DistillResult, OnEval, distill, spec_dims

OD_LR = 3e-4  # App. B: OD after HS trains with a lower peak learning rate


def wants_assistant(teacher: Teacher, spec: StudentSpec) -> bool:
    """MiniLM §3.3: use an assistant when the student is at most half as deep and half as wide."""
    return teacher_assistant_advised(teacher.dims, spec_dims(spec))


def hs_then_od(
    spec: StudentSpec, teacher: Teacher, data: TransferSet, config: DistillConfig, *,
    cache: TeacherCache | None = None, on_eval: OnEval | None = None, checkpoints: Checkpoints | None = None,
) -> DistillResult:
    """Stage 1: HS transfer; stage 2: OD on masked-LM logits from that checkpoint (same step count).
    `checkpoints`: each stage saves beside it (`Checkpoints.stage`), so a rerun skips a finished stage."""
    od_config = dataclasses.replace(config.for_method("od"), lr=min(config.lr, OD_LR))
    # The second stage's options (a --temperature) are refused before the first stage trains and saves.
    build_method("od", teacher.dims, spec_dims(spec), **od_config.method_options())
    evaluator = Evaluator(cache or TeacherCache(teacher, data), strategy=config.eval_layer_map)
    first = distill(spec, teacher, data, config.for_method("hs"), cache=cache, evaluator=evaluator, on_eval=on_eval,
                    checkpoints=_stage(checkpoints, 1, final=True))
    second = distill(spec, teacher, data, od_config, cache=cache, evaluator=evaluator,
                     on_eval=on_eval, student=first.student, checkpoints=_stage(checkpoints, 2))
    return _chain(first, second, "hs+od")


def with_assistant(
    spec: StudentSpec, teacher: Teacher, data: TransferSet, config: DistillConfig, *,
    cache: TeacherCache | None = None, on_eval: OnEval | None = None, checkpoints: Checkpoints | None = None,
) -> DistillResult:
    """Distill the teacher into an assistant with the teacher's depth and the student's width,
    then the assistant into the student, both with `config.method` (`checkpoints`: as `hs_then_od`)."""
    cache = cache or TeacherCache(teacher, data)
    evaluator = Evaluator(cache, strategy=config.eval_layer_map)
    assistant_spec = spec.replace(layers=teacher.dims.layers)
    first = distill(assistant_spec, teacher, data, config, cache=cache, evaluator=evaluator, on_eval=on_eval,
                    checkpoints=_stage(checkpoints, 1, final=True))
    assistant = teacher_from_model(f"assistant-{assistant_spec.arch}", first.student, teacher.tokenizer)
    second = distill(spec, assistant, data, config, cache=TeacherCache(assistant, data),
                     evaluator=evaluator, on_eval=on_eval, checkpoints=_stage(checkpoints, 2))
    return _chain(first, second, f"assistant {assistant_spec.arch}")


def _stage(checkpoints: Checkpoints | None, n: int, final: bool = False) -> Checkpoints | None:
    """Stage `n`'s saves. A first stage also saves its last update (`final`), so that a rerun after the
    second stage stopped takes the finished first one as it was instead of training it again."""
    return None if checkpoints is None else dataclasses.replace(checkpoints.stage(n), final=final)


def _chain(first: DistillResult, second: DistillResult, label: str) -> DistillResult:
    history = [{**h, "stage": 1} for h in first.history] + [{**h, "stage": 2} for h in second.history]
    return dataclasses.replace(
        second,
        history=history,
        seconds=first.seconds + second.seconds,
        metrics={**second.metrics, "recipe": label, "stage1": first.metrics},
    )
