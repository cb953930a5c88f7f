"""Consistent input augmentation: new inputs for the teacher to label when the transfer text runs short.

A student that sees the same sentences many times learns those sentences, not the teacher. The
comparative analysis (App. A) names data augmentation as the remedy when the transfer set is limited,
and in distillation its form is *consistent*: the teacher labels the very input the student sees, so
a perturbed sentence is not a noisy copy of a known target but a new point of the teacher's function
to match ("function matching", Beyer et al., 2022, "Knowledge distillation: A good teacher is patient
and consistent"; TinyBERT's word replacement, Jiao et al., 2020, is the text form of it).

The perturbation here is token substitution: in a share of the batches, TOKEN_SHARE of each row's
real tokens are replaced by tokens drawn from the same batch — words of the corpus in its own
frequencies, so the row stays text of the domain, not noise from the whole vocabulary. The teacher
runs live on those batches (its cached targets are of the unperturbed rows).

Measured on MiniLM's 3x12x384x1280 student (benchmarks/results/augment.json,
docs/design/final-recipe.md): where the corpus runs out and the sentences repeat, it stands in for
part of the text that is missing; where there is text enough it only costs time.
"""

from __future__ import annotations

import torch

# Of each row's real tokens (not [CLS], [SEP] or padding), the share replaced in a perturbed batch:
# BERT's masking rate, and TinyBERT's neighbourhood of a sentence.
TOKEN_SHARE = 0.15


def substitute_tokens(ids: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, generator: torch.Generator,
                      share: float = TOKEN_SHARE) -> torch.Tensor:
    """`ids` [batch, seq] with about `share` of its real tokens replaced by real tokens of the same batch,
    drawn uniformly (so in the corpus's frequencies). Positions that `mask` marks as padding and tokens
    listed in `keep` (the special tokens) are never replaced nor drawn. Returns a new tensor."""
    real = mask.bool() & ~torch.isin(ids, keep.to(ids.device))
    pool = ids[real]
    chosen = (torch.rand(ids.shape, generator=generator) < share).to(ids.device) & real
    out = ids.clone()
    count = int(chosen.sum())
    if count and pool.numel():
        draws = torch.randint(pool.numel(), (count,), generator=generator).to(ids.device)
        out[chosen] = pool[draws]
    return out
