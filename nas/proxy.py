"""What a trial's proxy distillation is scored by, besides its held-out L_HS.

With `proxy="fidelity"` (the default) a trial runs the final recipe, shortened, and is scored the
way the shipped student is judged: the embedding fidelity ρ — Spearman's ρ between the teacher's
and the student's pairwise cosine similarities (evaluation.fidelity.embedding_fidelity) — on
`proxy.sentences` held-out sentences. These are drawn after the `final.quality_sentences` that judge the
shipped student, so the search never picks a shape by the sentences it is finally measured on.
The reward's loss is then 1 − ρ: the KD-NAS reward (1 − loss)·(lat(S)/(0.6·lat(T)))^−0.06 with
the paper's L_HS replaced by what a sentence-embedding user keeps of the teacher. Why: on MiniLM,
across 12 shapes, this proxy (30 steps) orders shapes as their final students turn out with
Kendall's τ +0.91, the paper's hs/L_HS proxy with +0.67 (docs/benchmarks/proxy-fidelity.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from kdnas.core.errors import InputError

from .schema import Fidelity

if TYPE_CHECKING:
    from .config import SearchConfig

# Random sentence pairs for the proxy's ρ; fewer than the shipped student's 4,000, since every trial pays for them.
PROXY_PAIRS = 2000
MIN_PROXY_SENTENCES = 50


@dataclass(frozen=True)
class ProxyMetrics:
    """What a proxy distillation (or a final run) is scored by: its held-out L_HS (normalized, raw, standard
    error), its last running training loss and, with the fidelity proxy, the probe ρ of the graph judged."""

    l_hs_norm: float
    l_hs_raw: float
    l_hs_se: float
    train_loss: float = float("nan")
    fidelity: float | None = None
    fidelity_se: float | None = None

    @classmethod
    def of_distill(cls, metrics: Mapping[str, Any]) -> ProxyMetrics:
        """The distill package's metrics (a run's last evaluation, or one passed to `on_eval`), read here once."""
        return cls(l_hs_norm=float(metrics["l_hs_norm"]), l_hs_raw=float(metrics["l_hs_raw"]),
                   l_hs_se=float(metrics["l_hs_se"]), train_loss=float(metrics.get("train_loss", float("nan"))))

    def with_fidelity(self, fidelity: Fidelity) -> ProxyMetrics:
        """These metrics with the probe ρ (and its standard error) of the graph that is judged."""
        se = fidelity.spearman_se
        return replace(self, fidelity=float(fidelity.spearman), fidelity_se=None if se is None else float(se))


@dataclass(frozen=True)
class FidelityProbe:
    """Held-out sentences and the teacher's embeddings of them, computed once per search."""

    sentences: list[str]
    reference: torch.Tensor
    max_len: int
    seed: int

    def score(self, student: Any, tokenizer: Any) -> Fidelity:
        """The student's fidelity ρ (with its jackknife standard error) on the probe's sentences."""
        from kdnas.evaluation import embedding_fidelity, sentence_embeddings

        was_training = student.training
        emb = sentence_embeddings((student.eval(), tokenizer), self.sentences, max_len=self.max_len)
        student.train(was_training)
        return Fidelity.from_attrs(embedding_fidelity(self.reference, emb, pairs=PROXY_PAIRS, seed=self.seed))

    def score_graph(self, graph: Any, tokenizer: Any) -> Fidelity:
        """An exported graph's fidelity ρ on the probe's sentences (its `sentence_embedding`, as deployed)."""
        from kdnas.evaluation import embedding_fidelity
        from kdnas.export import onnx_sentence_embeddings

        emb = torch.from_numpy(onnx_sentence_embeddings(graph, tokenizer, self.sentences, max_len=self.max_len))
        return Fidelity.from_attrs(embedding_fidelity(self.reference, emb, pairs=PROXY_PAIRS, seed=self.seed))


def probe_sentences(config: SearchConfig, texts: list[str]) -> list[str]:
    """`proxy.sentences` held-out sentences after the `final.quality_sentences`; a corpus too small for
    them is refused in one line (`nas.search` asks before it creates the study). The fidelity proxy scores
    shapes on them and precision plans (`--runtime onnxruntime-auto`) score graphs on them: the line names
    what needs them and the flag that does without."""
    from kdnas.distill.data import heldout_sentences

    if config.proxy.kind == "fidelity":
        needs, instead = "the fidelity proxy", "use --proxy hs"
    else:
        needs, instead = "precision plans", "use --runtime onnxruntime (fp32 graphs only)"
    skip = config.final.quality_sentences
    try:
        sentences = heldout_sentences(texts, skip + config.proxy.sentences, seed=config.seed)[skip:]
    except InputError as err:
        raise InputError(f"{err}; {needs} score on held-out sentences: give a larger corpus or {instead}") from None
    if len(sentences) < MIN_PROXY_SENTENCES:
        raise InputError(f"corpus {config.corpus!r} holds out {len(sentences)} sentences beyond the "
                         f"{skip} that judge the shipped student; {needs} need at least "
                         f"{MIN_PROXY_SENTENCES}: give a larger corpus, lower --quality-sentences, or {instead}")
    return sentences


def fidelity_probe(config: SearchConfig, teacher: Any, texts: list[str]) -> FidelityProbe:
    """The probe of one search: its sentences and the teacher's embeddings of them."""
    from kdnas.evaluation import sentence_embeddings

    sentences = probe_sentences(config, texts)
    reference = sentence_embeddings(teacher, sentences, max_len=config.latency.seq)
    return FidelityProbe(sentences=sentences, reference=reference, max_len=config.latency.seq, seed=config.seed)


def proxy_loss(config: SearchConfig, metrics: ProxyMetrics) -> tuple[float, float]:
    """The loss the reward uses, with its standard error: 1 − ρ (fidelity) or normalized L_HS (hs)."""
    if config.proxy.kind == "fidelity":
        if metrics.fidelity is None:
            raise ValueError("the fidelity proxy's loss needs the probe's rho: score the student on the probe first")
        return 1.0 - metrics.fidelity, float(metrics.fidelity_se or 0.0)
    return metrics.l_hs_norm, metrics.l_hs_se
