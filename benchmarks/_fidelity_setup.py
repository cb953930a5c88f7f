"""The set-up the fidelity benchmarks share: a teacher, a news transfer set with its teacher targets,
and the teacher's embeddings of 1,000 held-out news sentences that every student is scored on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FidelitySetup:
    teacher: Any
    data: Any
    cache: Any
    sentences: list[str]
    reference: Any

    def spearman(self, model: Any) -> float:
        """The student's embedding fidelity ρ against the teacher on the held-out sentences."""
        return self.fidelity(model)["spearman"]

    def fidelity(self, model: Any) -> dict:
        from kdnas.evaluation import embedding_fidelity, sentence_embeddings

        was_training = model.training
        scored = embedding_fidelity(self.reference, sentence_embeddings((model.eval(), self.teacher.tokenizer),
                                                                        self.sentences))
        model.train(was_training)
        return scored


def fidelity_setup(teacher: str, train: int, *, seq_len: int = 64, unit: str = "sentence",
                   on_disk: bool = False, num_eval: int = 32) -> FidelitySetup:
    """`on_disk`: the teacher's targets also in $KDNAS_CACHE/targets, so a resumed run does not compute them again.
    `num_eval`: the transfer set's held-out rows, which come first (a search's final run keeps 256)."""
    from kdnas.distill import TeacherCache, load_corpus, load_teacher, make_transfer_set, targets_dir
    from kdnas.distill.data import heldout_sentences
    from kdnas.evaluation import sentence_embeddings

    model = load_teacher(teacher)
    texts = load_corpus("news")
    data = make_transfer_set(model.tokenizer, texts, seq_len=seq_len, num_train=train, num_eval=num_eval, seed=0, unit=unit)
    sentences = heldout_sentences(texts, 1000, seed=0)
    cache = TeacherCache(model, data, directory=targets_dir() if on_disk else None)
    return FidelitySetup(teacher=model, data=data, cache=cache, sentences=sentences,
                         reference=sentence_embeddings(model, sentences))
