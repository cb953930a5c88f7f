"""kdnas.distill — the loss engine: teachers, transfer data, teacher-target cache, losses, trainer.

Public API:
    load_teacher, Teacher                   teachers (bundled names, local folders, hub names)
    load_corpus, make_transfer_set          unlabeled text -> fixed-length sequences
    TeacherCache, targets_dir               teacher targets computed once, reused by every student (and
                                            by later runs, on disk)
    DistillConfig, distill, DistillResult   one method for N steps
    Checkpoints                             save a run every N steps; a stopped run goes on from its save
    hs_then_od, with_assistant              multi-stage recipes
    Evaluator                               held-out L_HS, raw and normalized
    layer_map, minilmv2_loss, METHODS       losses (see distill.losses for all of them)
    StudentSpec, parse_arch, build_student  student shapes
    inherit_student, measure_importance     students cut from the teacher's own weights, in its own family
    family_reason                           why a teacher's family has no inherited students (None: it has)
    narrowed, narrowed_from                 a trained student (or its saved folder) cut to a narrower shape the same way
    KdnasError                              user errors
"""

from .activations import Activations, ModelDims, Needs
from .cache import TeacherCache, targets_dir
from .data import TransferSet, load_corpus, make_transfer_set
from kdnas.core.errors import KdnasError
from .evaluate import Evaluator
from .inherit import family_reason, inherit_student, measure_importance, narrowed, narrowed_from
from .losses import layer_map, minilmv2_loss
from .methods import METHODS, build_method
from .checkpoint import Checkpoints
from .recipes import hs_then_od, wants_assistant, with_assistant
from kdnas.core.spec import StudentSpec, build_student, parse_arch
from .teachers import Teacher, load_teacher
from .trainer import DistillConfig, DistillResult, distill

__all__ = [
    "Activations", "Checkpoints", "DistillConfig", "DistillResult", "Evaluator", "KdnasError", "METHODS", "ModelDims", "Needs",
    "StudentSpec", "Teacher", "TeacherCache", "TransferSet", "build_method", "build_student", "distill", "family_reason",
    "hs_then_od", "inherit_student", "layer_map", "measure_importance", "narrowed", "narrowed_from", "load_corpus", "load_teacher",
    "make_transfer_set", "minilmv2_loss",
    "parse_arch", "targets_dir", "wants_assistant", "with_assistant",
]
