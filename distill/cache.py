"""Teacher targets, computed once per (teacher, transfer set, sequence length) and reused.

The teacher is frozen and the transfer set fixed, so its activations never change; a search
distills dozens of students against the same targets. Each activation is one entry — e.g.
`hidden 6` or `query 12` — a half-precision `[N, seq, d]` tensor. When a directory is given, an
entry is a file of its raw values, memory-mapped: the teacher pass writes its rows straight into
the mapped file (made under a temporary name, flushed, then renamed) and training reads them back
through the page cache, so a transfer set larger than the machine's memory (an MPNet student's
76,800 sentences hold 7.5 GB per layer) costs disk, not RAM. Without a directory entries live in
memory. Methods that need different entries share the ones they have in common.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from kdnas.core.quiet import exclusive, wait_while_measuring

from .activations import Activations, Needs
from .data import TransferSet
from .teachers import Teacher

# What a stored entry is (how the teacher pass computes and lays it out); a change there bumps it, so
# a later version never reads targets an earlier one computed differently. 2: raw values, memory-mapped.
FORMAT = 2
# Beside a set's entries of a split: its token ids (int32 `[N, seq]`), by which a set that shares its first
# rows finds them.
ROWS_SUFFIX = "-rows.ids"
# A pass of at least this many rows that needs the teacher's last layer only runs on `last_layer` (another
# runtime's forward pass, e.g. export.LastLayerGraph) where one is given: its export costs about what
# PyTorch spends on a few hundred sentences, so short passes (tests, a grown set's few new rows) skip it.
GRAPH_MIN_ROWS = 1024


def targets_dir(value: str | os.PathLike | None = None) -> Path | None:
    """Where teacher targets live on disk (the `--cache-dir` of `kdnas distill` and `kdnas search`):
    `None` for `$KDNAS_CACHE/targets`, `"none"` for nowhere (memory only), else the folder given."""
    from kdnas.core.assets import cache_root

    if value is None:
        return cache_root() / "targets"
    return None if str(value).lower() == "none" else Path(value)


def _needs_of(entries: list[tuple[str, int]]) -> Needs:
    """The `Needs` of a list of entries (`_entries`' inverse): Q/K/V of a layer come together."""
    return Needs(hidden=frozenset(i for k, i in entries if k == "hidden"),
                 qkv=frozenset(i for k, i in entries if k != "hidden"))


def _entries(needs: Needs) -> list[tuple[str, int]]:
    entries = [("hidden", i) for i in sorted(needs.hidden)]
    for kind in ("query", "key", "value"):
        entries += [(kind, i) for i in sorted(needs.qkv)]
    return entries


class TeacherCache:
    """Lazily computed, reusable teacher activations for one transfer set.

    Masked-LM logits (OD) are not cached: they are `[N, seq, vocab]`, far larger than the hidden
    states, and OD draws fresh masks; OD runs the teacher live.
    """

    def __init__(
        self,
        teacher: Teacher,
        data: TransferSet,
        *,
        directory: str | os.PathLike | None = None,
        dtype: torch.dtype = torch.float16,
        batch_size: int = 32,
        on_rows: Callable[[int, int], None] | None = None,
        last_layer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """`on_rows(done, total)`: called after each batch of a teacher pass (a caller's progress display).
        `last_layer(ids, mask)`: the teacher's last token states by a faster runtime, for CPU passes of
        GRAPH_MIN_ROWS rows or more that need nothing else."""
        self.teacher, self.last_layer = teacher, last_layer
        self.on_rows = on_rows
        self.data = data
        self.directory = Path(directory) if directory is not None else None
        self.dtype = dtype
        self.batch_size = batch_size
        self._store: dict[tuple[str, str, int], torch.Tensor] = {}
        self.teacher_passes = 0  # passes over a split (or a grown set's new rows); tests and benchmarks read it
        # Seconds spent in teacher passes: a one-time cost per corpus, which a caller timing its own work
        # (a search trial whose proxy made the first pass) keeps apart from that work's pace.
        self.pass_seconds = 0.0
        self._writable = True
        self._importance: dict[int, object] = {}
        self._base: TeacherCache | None = None  # a cache of this set's first rows (`grown`)

    def _file(self, split: str, kind: str, layer: int) -> Path:
        return self._entry_path(self._prefix(split), kind, layer)

    def _entry_path(self, prefix: str, kind: str, layer: int) -> Path:
        assert self.directory is not None
        return self.directory / f"{prefix}-{kind}{layer}.bin"

    def _prefix(self, split: str) -> str:
        return f"{self.teacher.fingerprint}-{self.data.fingerprint}-s{self.data.seq_len}-v{FORMAT}-{split}"

    def ensure(self, split: str, needs: Needs) -> None:
        """Make every entry of `needs` available for `split`, in at most one teacher pass."""
        missing = [e for e in _entries(needs) if (split, *e) not in self._store]
        if not missing:
            return
        with self._turn(split):
            if self.directory is not None and self._writable:
                with contextlib.suppress(OSError):  # a folder that cannot be listed is said so when written to
                    for stale in self.directory.glob(f"{self._prefix(split)}-*.partial-*"):
                        stale.unlink()  # a killed run's half-made entry: the lock says no one writes it
            if self.directory is not None:
                for kind, layer in list(missing):
                    path = self._file(split, kind, layer)
                    if path.is_file():
                        self._store[(split, kind, layer)] = self._mapped(path, self.data.split(split)[0].shape[0])
                        missing.remove((kind, layer))
                        self._note_rows(split)  # a folder written before rows were noted: noted now
                if missing and (donor := self._donor(split, missing)) is not None:
                    self._from_donor(split, missing, *donor)
                    missing = []
            if missing:
                self._compute(split, missing)

    def grown(self, data: TransferSet) -> TeacherCache:
        """A cache for `data`, a larger transfer set that starts with this one: the same held-out rows
        and, first, the same training rows (what `make_transfer_set` gives for the same corpus, seed and
        held-out count with more training rows). The targets held here are reused; the teacher runs on
        the new rows only. A run that finds it has time for more steps than its set was sized for
        grows it instead of seeing each row more often (`distill.distill`'s `grow`)."""
        n = self.data.num_train
        if data.num_train < n or data.seq_len != self.data.seq_len \
                or not torch.equal(data.train_ids[:n], self.data.train_ids) \
                or not torch.equal(data.eval_ids, self.data.eval_ids):
            raise ValueError("a grown transfer set must start with this cache's rows")
        cache = TeacherCache(self.teacher, data, directory=self.directory, dtype=self.dtype, batch_size=self.batch_size,
                             on_rows=self.on_rows, last_layer=self.last_layer)
        cache._base, cache._writable = self, self._writable
        cache._importance = dict(self._importance)  # measured on the first rows, which are the same
        return cache

    def _compute(self, split: str, missing: list[tuple[str, int]]) -> None:
        wanted = _needs_of(missing)
        computed = self._from_base(split, wanted, missing)
        if computed is None:
            computed = self._teacher_pass(split, wanted)
            self.teacher_passes += 1
        for (kind, layer), tensor in computed.items():
            if (kind, layer) not in missing:  # computed alongside (e.g. all of Q/K/V of a layer); keep what was asked
                if self.directory is not None:
                    with contextlib.suppress(OSError):
                        self._partial(split, kind, layer).unlink()
                continue
            self._store[(split, kind, layer)] = self._kept(split, kind, layer, tensor)

    def _from_base(self, split: str, wanted: Needs, missing: list[tuple[str, int]]
                   ) -> dict[tuple[str, int], torch.Tensor] | None:
        """`missing` for a grown cache: the smaller set's targets, then the teacher's on the new rows
        only; None when there is no smaller set or it lacks them."""
        base = self._base
        if base is None or not all((split, *e) in base._store for e in missing):
            return None
        old = {e: base._store[(split, *e)] for e in missing}
        if base.data.split(split)[0].shape[0] == self.data.split(split)[0].shape[0]:  # the held-out rows: the same
            return old
        return self._extended(split, wanted, old)

    def _extended(self, split: str, wanted: Needs, old: dict[tuple[str, int], torch.Tensor]
                  ) -> dict[tuple[str, int], torch.Tensor]:
        """`old`, the entries of this set's first rows, joined with the teacher's on the rows after them."""
        kept = next(iter(old.values())).shape[0]
        fresh = self._teacher_pass(split, wanted, start=kept)
        self.teacher_passes += 1
        # Joined on the host, where a new pass's targets are: the smaller set's may sit on a GPU
        # (`place`); the trainer places the grown set there again.
        joined = {}
        for e, first in old.items():
            new = fresh[e]
            joined[e] = self._blank(split, *e, (kept + new.shape[0], *new.shape[1:]))
            joined[e][:kept] = first.to(new.device)
            joined[e][kept:] = new
        return joined

    def _donor(self, split: str, missing: list[tuple[str, int]]) -> tuple[int, str, int] | None:
        """The set on disk, of this teacher and row length, whose first rows are the most of this set's
        first rows and which holds every entry of `missing`: (rows in common, its file prefix, its
        rows); None if there is none. Held-out rows must be the same rows. A larger set of the same
        corpus, seed and held-out rows starts with this one's rows (`make_transfer_set`), so a later run
        reads a slice of a longer run's targets, and a longer run computes only the rows after them."""
        best = None
        for common, prefix, rows in self._stored_sets(split):
            if (split == "train" or rows == common == self.data.split(split)[0].shape[0]) \
                    and (best is None or common > best[0]) \
                    and self._holds(prefix, missing):
                best = (common, prefix, rows)
        return best

    def _stored_sets(self, split: str) -> Iterator[tuple[int, str, int]]:
        """(rows in common from the first, file prefix, rows) of every other set on disk of this teacher
        and row length that shares its first row of `split` with this set."""
        assert self.directory is not None
        ids = self.data.split(split)[0]
        pattern = f"{self.teacher.fingerprint}-*-s{self.data.seq_len}-v{FORMAT}-{split}{ROWS_SUFFIX}"
        with contextlib.suppress(OSError):  # an unreadable folder has no sets to lend
            for path in self.directory.glob(pattern):
                prefix = path.name[: -len(ROWS_SUFFIX)]
                theirs = torch.from_file(str(path), size=path.stat().st_size // 4, dtype=torch.int32)
                theirs = theirs.view(-1, self.data.seq_len)
                same = (theirs[: len(ids)] == ids[: len(theirs)]).all(dim=1)
                common = len(same) if bool(same.all()) else int(same.int().argmin())
                if prefix != self._prefix(split) and common > 0:
                    yield common, prefix, theirs.shape[0]

    def _holds(self, prefix: str, entries: list[tuple[str, int]]) -> bool:
        """Whether the stored set `prefix` has a file of every entry."""
        return all(self._entry_path(prefix, *e).is_file() for e in entries)

    def stored_rows(self, needs: Needs) -> int:
        """The most training rows a set on disk holds every entry of `needs` for, where that set starts
        with all of this set's rows: a run that may grow its set reads that many at no teacher cost."""
        if self.directory is None:
            return self.data.num_train
        entries = _entries(needs)
        return max([rows for common, prefix, rows in self._stored_sets("train") if common == self.data.num_train
                    and self._holds(prefix, entries)] + [self.data.num_train])

    def _from_donor(self, split: str, missing: list[tuple[str, int]], common: int, prefix: str, rows: int) -> None:
        """`missing` from a stored set's first `common` rows: all of this set's rows (a view of its files),
        or the first of them, the teacher running on the rest (kept as this set's own entries)."""
        old = {e: self._mapped(self._entry_path(prefix, *e), rows)[:common] for e in missing}
        if common == self.data.split(split)[0].shape[0]:
            self._store.update({(split, *e): tensor for e, tensor in old.items()})
            return
        for e, tensor in self._extended(split, _needs_of(missing), old).items():
            self._store[(split, *e)] = self._kept(split, *e, tensor)

    def _note_rows(self, split: str) -> None:
        """Write this set's token ids of `split` beside its entries (once), so later sets that share its
        first rows find them (`_donor`)."""
        path = self.directory / f"{self._prefix(split)}{ROWS_SUFFIX}"
        if path.is_file() or not self._writable:
            return
        with contextlib.suppress(OSError):  # unnoted, the targets still serve this set
            partial = path.with_suffix(f".partial-{os.getpid()}-{id(self)}")
            partial.write_bytes(self.data.split(split)[0].to(torch.int32).numpy().tobytes())
            os.replace(partial, path)

    @contextlib.contextmanager
    def _turn(self, split: str) -> Iterator[None]:
        """Held while this process looks on disk for the entries of `split` and computes what is not
        there. A second process on the same folder and transfer set — a search worker started beside
        this one — waits, then reads them, instead of running the teacher a second time on the same
        cores. Without a folder to lock, nothing is coordinated (each process computes)."""
        if self.directory is None or not self._writable:
            yield
            return
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)  # else the lock cannot open: unguarded
        with exclusive(self.directory / f"{self._prefix(split)}.lock"):
            yield

    def _blank(self, split: str, kind: str, layer: int, shape: tuple[int, ...]) -> torch.Tensor:
        """A zeroed tensor for one entry: a mapped file beside the entry's (`_partial`) where targets are kept
        on disk, so the pass that fills it never holds it in RAM; in memory otherwise. A folder that cannot
        take the file (a full disk: the space is reserved up front) costs later runs a teacher pass, not
        this run its work: said once, and the run goes on from memory."""
        numel = math.prod(shape)
        if self.directory is not None and self._writable and numel:
            path = self._partial(split, kind, layer)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as file:
                    os.posix_fallocate(file.fileno(), 0, numel * self.dtype.itemsize)
                return torch.from_file(str(path), shared=True, size=numel, dtype=self.dtype).view(shape)
            except OSError as err:
                with contextlib.suppress(OSError):
                    path.unlink()
                warnings.warn(f"teacher targets not kept in {path.parent}: {err.strerror or err}; this run goes "
                              "on with them in memory", RuntimeWarning, stacklevel=4)
                self._writable = False  # what is on disk is still read
        return torch.zeros(shape, dtype=self.dtype)

    def _partial(self, split: str, kind: str, layer: int) -> Path:
        return self._file(split, kind, layer).with_suffix(f".partial-{os.getpid()}-{id(self)}")

    def _kept(self, split: str, kind: str, layer: int, tensor: torch.Tensor) -> torch.Tensor:
        """The finished entry: a mapped blank is flushed and renamed into place (no reader sees half a
        file) and read back from there; an in-memory one is returned as it is."""
        if self.directory is None:
            return tensor
        partial = self._partial(split, kind, layer)
        if not partial.is_file():  # joined from a smaller set's file, or made in memory
            if not tensor.numel():
                return tensor
            blank = self._blank(split, kind, layer, tuple(tensor.shape))
            if not partial.is_file():
                return tensor  # the folder took no file: kept in memory
            blank.copy_(tensor)
        with open(partial, "rb+") as file:
            os.fsync(file.fileno())  # the mapped pages, written back before the name says the entry is whole
        path = self._file(split, kind, layer)
        os.replace(partial, path)
        self._note_rows(split)
        return self._mapped(path, self.data.split(split)[0].shape[0])

    def _mapped(self, path: Path, rows: int) -> torch.Tensor:
        """An entry's file of `rows` rows, mapped read-only (copy-on-write): rows reach memory as training
        reads them."""
        seq = self.data.seq_len
        numel = path.stat().st_size // self.dtype.itemsize
        if numel % (rows * seq):
            raise ValueError(f"{path} holds {numel} values, not rows x {rows} x {seq}")
        return torch.from_file(str(path), shared=False, size=numel, dtype=self.dtype).view(rows, seq, -1)

    def _teacher_pass(self, split: str, wanted: Needs, start: int = 0) -> dict[tuple[str, int], torch.Tensor]:
        """One teacher pass over `split` from row `start`, in length-sorted batches cut to their longest
        row (short rows such as sentences cost what they hold); padded positions are stored as zeros.
        A pass over a whole split writes into mapped files where targets are kept (`_blank`)."""
        started = time.perf_counter()
        try:
            return self._pass(split, wanted, start)
        finally:
            self.pass_seconds += time.perf_counter() - started

    def _pass(self, split: str, wanted: Needs, start: int) -> dict[tuple[str, int], torch.Tensor]:
        ids, mask = self.data.split(split)
        ids, mask = ids[start:], mask[start:]
        lengths = mask.sum(1)
        order = torch.argsort(lengths, descending=True, stable=True)
        device = next(self.teacher.model.parameters()).device
        graph = self._graph_for(wanted, ids.shape[0], device)
        out: dict[tuple[str, int], torch.Tensor] = {}
        for first in range(0, ids.shape[0], self.batch_size):
            wait_while_measuring()  # a latency measurement on cores this pass shares (core.quiet)
            rows = order[first : first + self.batch_size]
            width = int(lengths[rows].max())
            if graph is not None:
                acts = Activations(hidden={self.teacher.dims.layers: graph(ids[rows, :width], mask[rows, :width])})
            else:
                acts = self.teacher.activations(ids[rows, :width].to(device), mask[rows, :width].to(device), wanted)
            for kind, layer in _entries(wanted):
                value = getattr(acts, kind)[layer]
                if (kind, layer) not in out:  # a whole split's entry, or the new rows of a grown set (joined later)
                    shape = (*ids.shape, value.shape[-1])
                    out[(kind, layer)] = (self._blank(split, kind, layer, shape) if start == 0
                                          else torch.zeros(shape, dtype=self.dtype))
                out[(kind, layer)][rows, :width] = value.to("cpu", self.dtype)
            if self.on_rows is not None:
                self.on_rows(first + len(rows), ids.shape[0])
        return out

    def _graph_for(self, wanted: Needs, rows: int, device: torch.device) -> Callable | None:
        """`last_layer` where this pass may run on it: a CPU pass of GRAPH_MIN_ROWS rows or more that needs
        the teacher's last token states and nothing else."""
        only_last = wanted.hidden == {self.teacher.dims.layers} and not wanted.qkv and not wanted.logits
        usable = self.last_layer is not None and only_last and rows >= GRAPH_MIN_ROWS and device.type == "cpu"
        return self.last_layer if usable else None

    def batch(self, split: str, index: torch.Tensor, needs: Needs, width: int | None = None) -> Activations:
        """Teacher activations of the rows `index` of `split`, cut to the first `width` positions."""
        self.ensure(split, needs)
        out = Activations()
        for kind, layer in _entries(needs):
            getattr(out, kind)[layer] = self._store[(split, kind, layer)][index, :width]
        return out

    def place(self, split: str, device: torch.device, fraction: float = 0.5) -> bool:
        """Keep the stored targets of `split` on a CUDA `device` when they take at most `fraction` of
        its free memory, so a training step reads them there instead of copying them from the host;
        returns whether they were moved. Anywhere else nothing changes (False)."""
        if device.type != "cuda":
            return False
        keys = [key for key in self._store if key[0] == split and self._store[key].device != device]
        size = sum(self._store[key].numel() * self._store[key].element_size() for key in keys)
        free, _ = torch.cuda.mem_get_info(device)
        if size > fraction * free:
            return False
        for key in keys:
            self._store[key] = self._store[key].to(device)
        return True

    def importance(self, rows: int | None = None):
        """Activation importances of the teacher on the first `rows` training rows (the calibration
        batch of `distill.inherit`), measured once per cache."""
        from .inherit import CALIBRATION_ROWS, measure_importance

        rows = CALIBRATION_ROWS if rows is None else rows
        if rows not in self._importance:
            ids, mask = self.data.split("train")
            self._importance[rows] = measure_importance(self.teacher, ids[:rows], mask[:rows])
        return self._importance[rows]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._store.values())
