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
runs live on those batches (its cached targets are of the unperturbed rows). `neighbours` draws
each new word from the replaced word's nearest words in the teacher's word embeddings instead, as
TinyBERT does where its masked LM cannot propose a word (MiniLM's teachers have no MLM head).

Measured on MiniLM's 3x12x384x1280 student (a one-off benchmark, in git history;
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
    real, chosen = _chosen(ids, mask, keep, generator, share)
    pool = ids[real]
    out = ids.clone()
    count = int(chosen.sum())
    if count and pool.numel():
        draws = torch.randint(pool.numel(), (count,), generator=generator).to(ids.device)
        out[chosen] = pool[draws]
    return out


# How a perturbed row's replacement words are drawn: "batch", any real token of the same batch;
# "neighbours", one of the replaced word's nearest words in the teacher's word-embedding space.
WORD_SOURCES: tuple[str, ...] = ("batch", "neighbours")
# Candidates per word for "neighbours": TinyBERT draws from the K = 15 best of its word-embedding
# neighbours; in MiniLM's embeddings the first ten of a corpus word are its inflections, synonyms
# and words of its kind (said: says, told, stated; tuesday: wednesday, monday; oil: petroleum, crude).
NEIGHBOURS = 10


def word_neighbours(embeddings: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor, tokens: list[str],
                    k: int = NEIGHBOURS, chunk: int = 4096) -> torch.Tensor:
    """[vocab, k]: for each token of `ids` (the transfer set's rows; `keep`, the special tokens,
    left out) its k nearest tokens of `ids` by the cosine of their `embeddings` rows, a word piece
    (`##…` in `tokens`) only among word pieces and a word start only among word starts, so a
    replacement never splits or joins words. Tokens the rows never use, or with no such neighbour,
    map to themselves."""
    vocab = embeddings.shape[0]
    used = torch.unique(ids[~torch.isin(ids, keep)])
    table = torch.arange(vocab).unsqueeze(1).repeat(1, k)
    piece = torch.tensor([t.startswith("##") for t in tokens])
    unit = torch.nn.functional.normalize(embeddings.detach().float(), dim=1)
    for kind in (True, False):
        group = used[piece[used] == kind]
        if group.numel() < 2:
            continue
        near = min(k, group.numel() - 1)
        for start in range(0, group.numel(), chunk):
            rows = group[start:start + chunk]
            sim = unit[rows] @ unit[group].T
            sim[torch.arange(rows.numel()), torch.arange(start, start + rows.numel())] = -2.0  # not itself
            best = group[sim.topk(near, dim=1).indices]
            table[rows] = best.repeat(1, -(-k // near))[:, :k]
    return table


def substitute_neighbours(ids: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, table: torch.Tensor,
                          generator: torch.Generator, share: float = TOKEN_SHARE) -> torch.Tensor:
    """`ids` [batch, seq] with about `share` of its real tokens each replaced by one of its `table`
    neighbours (distill.augment.word_neighbours), drawn uniformly. Padding and the tokens in `keep`
    are never replaced. Returns a new tensor."""
    chosen = _chosen(ids, mask, keep, generator, share)[1]
    out = ids.clone()
    count = int(chosen.sum())
    if count:
        pick = torch.randint(table.shape[1], (count,), generator=generator)
        out[chosen] = table[ids[chosen].cpu(), pick].to(ids.device)
    return out


def _chosen(ids: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, generator: torch.Generator,
            share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the real tokens: not padding, not in `keep`; about `share` of them, drawn to be replaced)."""
    real = mask.bool() & ~torch.isin(ids, keep.to(ids.device))
    return real, (torch.rand(ids.shape, generator=generator) < share).to(ids.device) & real
