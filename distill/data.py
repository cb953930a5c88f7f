"""The transfer set: unlabeled text, tokenized into fixed-length sequences.

Task-agnostic distillation only needs raw text. A corpus is the bundled `news` or any local
`.txt` / `.jsonl` / `.csv` file or folder of them, or a `datasets` dataset saved to disk. The
held-out evaluation sequences come from documents the training sequences never see.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from kdnas.core import assets
from kdnas.core.errors import InputError, check_choice

_TEXT_COLUMNS = ("text", "sentence", "content", "document", "body")
_MIN_CHUNK = 8  # shorter tails carry too little context to be worth a training row
# One document in HELDOUT_EVERY (chosen by a hash of its text, so independent of seeds and sizes) is
# never put in a transfer set: quality measures (embedding fidelity) read sentences from these.
# Corpora of fewer than HELDOUT_MIN_DOCS documents hold nothing out (and have no such measures).
HELDOUT_EVERY = 16
HELDOUT_MIN_DOCS = 64
UNITS = ("window", "sentence")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])")


def load_corpus(name_or_path: str) -> list[str]:
    """Documents of a corpus, by bundled name or local path. Never empty."""
    if name_or_path in assets.CORPORA:
        docs = _news(assets.corpus_file(name_or_path))
    else:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise InputError(
                f"corpus {name_or_path!r} is neither a bundled name ({', '.join(assets.CORPORA)}) "
                "nor an existing file or folder"
            )
        docs = _from_path(path)
    docs = [d.strip() for d in docs if d and d.strip()]
    if not docs:
        raise InputError(f"corpus {name_or_path!r} is empty: no non-blank text found")
    return docs


def _news(zip_path: Path) -> list[str]:
    with zipfile.ZipFile(zip_path) as archive, archive.open("NewsArticles.csv") as raw:
        rows = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"))
        return [f"{row['title']}. {row['text']}" for row in rows if row.get("text")]


def _from_path(path: Path) -> list[str]:
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return _from_datasets(path)
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".txt", ".jsonl", ".csv") and p.is_file())
        if not files:
            raise InputError(f"corpus folder {str(path)!r} holds no .txt, .jsonl or .csv file and is no saved dataset")
        return [doc for file in files for doc in _from_file(file)]
    return _from_file(path)


def _from_file(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"corpus file {str(path)!r} is not UTF-8 text") from None
    if suffix == ".jsonl":
        docs = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"corpus file {str(path)!r}: line {number} is not valid JSON") from None
            docs.append(_pick_text(record, path) if isinstance(record, dict) else str(record))
        return docs
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        return [_pick_text(row, path) for row in reader]
    if suffix in (".txt", ""):
        # Blank lines separate documents; a file without any is one document per line.
        blocks = [b for b in text.split("\n\n") if b.strip()]
        return blocks if len(blocks) > 1 else text.splitlines()
    raise InputError(f"corpus file {str(path)!r}: unsupported type {suffix!r}; allowed: .txt, .jsonl, .csv")


def _pick_text(record: dict, source: Path | str) -> str:
    for column in _TEXT_COLUMNS:
        if isinstance(record.get(column), str):
            return record[column]
    raise InputError(
        f"corpus {str(source)!r} has no text column; columns found: {', '.join(map(str, record)) or 'none'}; "
        f"expected one of: {', '.join(_TEXT_COLUMNS)}"
    )


def _from_datasets(path: Path) -> list[str]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    column = next((c for c in _TEXT_COLUMNS if c in loaded.column_names), None)
    if column is None:
        raise InputError(
            f"dataset {str(path)!r} has no text column; columns found: {', '.join(loaded.column_names)}; "
            f"expected one of: {', '.join(_TEXT_COLUMNS)}"
        )
    return [t for t in loaded[column] if isinstance(t, str)]


@dataclass(frozen=True)
class TransferSet:
    """Tokenized train and held-out sequences, `[N, seq_len]` each, padded with the pad id."""

    train_ids: torch.Tensor
    train_mask: torch.Tensor
    eval_ids: torch.Tensor
    eval_mask: torch.Tensor
    seq_len: int
    fingerprint: str

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if name == "train":
            return self.train_ids, self.train_mask
        if name == "eval":
            return self.eval_ids, self.eval_mask
        raise ValueError(f"unknown split {name!r}")

    @property
    def num_train(self) -> int:
        return int(self.train_ids.shape[0])

    @property
    def num_eval(self) -> int:
        return int(self.eval_ids.shape[0])


def _check_transfer_args(tokenizer, texts: list[str], seq_len: int, num_train: int, num_eval: int, unit: str) -> None:
    max_positions = int(getattr(tokenizer, "model_max_length", 512) or 512)
    if not 8 <= seq_len <= min(max_positions, 512):
        raise InputError(f"sequence length {seq_len} is invalid: allowed 8..{min(max_positions, 512)}")
    check_choice("transfer unit", unit, UNITS)
    if num_train < 1 or num_eval < 2:
        raise InputError(f"transfer set sizes train={num_train}, eval={num_eval} are invalid: need train >= 1, eval >= 2")
    if not texts:
        raise InputError("corpus is empty: no documents to distill on")


def make_transfer_set(
    tokenizer, texts: list[str], *, seq_len: int = 128, num_train: int = 512, num_eval: int = 64, seed: int = 0,
    unit: str = "window",
) -> TransferSet:
    """Chunk shuffled documents into `[CLS] … [SEP]` rows of at most `seq_len` tokens.

    `unit="window"`: consecutive windows of the running text; `unit="sentence"`: one sentence per
    row (truncated to `seq_len`), the unit a sentence-embedding model is used on.

    Evaluation rows are taken from the first documents after shuffling, training rows from the
    rest, so the held-out loss is measured on text the student never trained on.
    """
    _check_transfer_args(tokenizer, texts, seq_len, num_train, num_eval, unit)
    if len(texts) >= HELDOUT_MIN_DOCS:
        texts = [t for t in texts if not is_heldout(t)]
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    body = seq_len - 2
    cls_id, sep_id, pad_id = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    if cls_id is None or sep_id is None or pad_id is None:
        raise InputError("the tokenizer lacks a CLS, SEP or PAD token; a BERT-style tokenizer is required")

    rows: dict[str, list[list[int]]] = {"eval": [], "train": []}
    split = "eval"
    for start in range(0, len(order), 32):
        batch = [texts[i] for i in order[start : start + 32]]
        # Sentence rows tokenize each sentence on its own, so the whole document is not tokenized too.
        encoded = [None] * len(batch) if unit == "sentence" else \
            tokenizer(batch, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        for doc, ids in zip(batch, encoded):
            pieces = _sentence_pieces(tokenizer, doc, body) if unit == "sentence" else \
                [ids[offset : offset + body] for offset in range(0, len(ids), body)]
            rows[split].extend([cls_id, *piece, sep_id] for piece in pieces if len(piece) >= _MIN_CHUNK)
            if split == "eval" and len(rows["eval"]) >= num_eval:
                split = "train"  # switch at a document boundary: no document feeds both splits
        if len(rows["train"]) >= num_train:
            break
    rows["eval"] = rows["eval"][:num_eval]
    rows["train"] = rows["train"][:num_train]
    if len(rows["eval"]) < 2 or not rows["train"]:
        raise InputError(
            f"corpus is too small: it gave {len(rows['train'])} training and {len(rows['eval'])} held-out "
            f"sequences of up to {seq_len} tokens; need at least 1 and 2"
        )

    tensors = {name: pad_rows(r, pad_id, width=seq_len) for name, r in rows.items()}
    digest = hashlib.sha256()
    for name in ("train", "eval"):
        digest.update(tensors[name][0].numpy().tobytes())
    return TransferSet(
        train_ids=tensors["train"][0], train_mask=tensors["train"][1],
        eval_ids=tensors["eval"][0], eval_mask=tensors["eval"][1],
        seq_len=seq_len, fingerprint=digest.hexdigest()[:16],
    )


def split_sentences(doc: str) -> list[str]:
    """A document's sentences (a split after . ! ? followed by a capital or a digit)."""
    return _SENTENCE_END.split(" ".join(doc.split()))


def _sentence_pieces(tokenizer, doc: str, body: int) -> list[list[int]]:
    sentences = split_sentences(doc)
    encoded = tokenizer(sentences, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return [ids[:body] for ids in encoded]


def is_heldout(text: str) -> bool:
    """Whether a document is reserved for quality measures (never in a transfer set of a corpus of at
    least HELDOUT_MIN_DOCS documents)."""
    return hashlib.sha256(text.encode("utf-8")).digest()[0] % HELDOUT_EVERY == 0


def heldout_sentences(texts: list[str], n: int = 1000, *, seed: int = 0, min_words: int = 6,
                      max_words: int = 60) -> list[str]:
    """Up to `n` distinct sentences of the held-out documents (see `is_heldout`), a seeded sample.

    Sentences, not whole documents: a sentence-embedding model is used on sentences and short
    passages, and whole news articles would all be truncated to their first tokens.
    """
    if len(texts) < HELDOUT_MIN_DOCS:
        raise InputError(f"the corpus has {len(texts)} documents; held-out quality measures need at least "
                         f"{HELDOUT_MIN_DOCS} (one in {HELDOUT_EVERY} is held out of training)")
    sentences: list[str] = []
    seen: set[str] = set()
    for doc in texts:
        if not is_heldout(doc):
            continue
        for sentence in split_sentences(doc):
            if min_words <= len(sentence.split()) <= max_words and sentence not in seen:
                seen.add(sentence)
                sentences.append(sentence)
    if len(sentences) < 2:
        raise InputError(f"the corpus has {len(sentences)} held-out sentences; quality measures need at least 2 "
                         f"(one document in {HELDOUT_EVERY} is held out: give a larger corpus)")
    random.Random(seed).shuffle(sentences)
    return sentences[:n]


def training_texts(tokenizer, data: TransferSet, n: int, *, seed: int = 0) -> list[str]:
    """Up to `n` rows of the transfer set's training split, a seeded sample, decoded to text: what a student
    was trained on, in the form held-out sentences are read in (the fit gap: nas.baselines)."""
    picked = random.Random(seed).sample(range(data.num_train), min(n, data.num_train))
    return tokenizer.batch_decode(data.train_ids[picked], skip_special_tokens=True)


def pad_rows(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask)` `[len(rows), width]`; width defaults to the longest row, so
    a batch of short texts costs short compute."""
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask
