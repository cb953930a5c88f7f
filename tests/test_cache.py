import warnings
from pathlib import Path

import pytest
import torch

from kdnas.distill import Needs, TeacherCache


def test_targets_computed_once_and_shared_between_methods(teacher, small_data):
    cache = TeacherCache(teacher, small_data)
    hs_needs = Needs(hidden=frozenset({2, 4, 6}))
    cache.ensure("train", hs_needs)
    assert cache.teacher_passes == 1 and (spent := cache.pass_seconds) > 0
    cache.ensure("train", Needs(hidden=frozenset({4, 6})))  # a subset: no teacher pass, no time spent
    assert cache.teacher_passes == 1 and cache.pass_seconds == spent
    cache.ensure("train", Needs(hidden=frozenset({6}), qkv=frozenset({6})))  # only Q/K/V are new
    assert cache.teacher_passes == 2
    index = torch.tensor([3, 0, 7])
    got = cache.batch("train", index, Needs(hidden=frozenset({6}), qkv=frozenset({6})))
    live = teacher.activations(small_data.train_ids[index], small_data.train_mask[index],
                               Needs(hidden=frozenset({6}), qkv=frozenset({6})))
    assert got.hidden[6].dtype == torch.float16
    torch.testing.assert_close(got.hidden[6].float(), live.hidden[6], atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(got.query[6].float(), live.query[6], atol=5e-2, rtol=1e-2)


def test_disk_cache_is_reused_by_a_new_process_view(teacher, small_data, tmp_path):
    needs = Needs(hidden=frozenset({6}))
    first = TeacherCache(teacher, small_data, directory=tmp_path)
    first.ensure("eval", needs)
    files = sorted(p.name for p in tmp_path.glob("*.bin"))
    assert len(files) == 1 and small_data.fingerprint in files[0] and teacher.fingerprint in files[0]
    second = TeacherCache(teacher, small_data, directory=tmp_path)
    second.ensure("eval", needs)
    assert second.teacher_passes == 0 and second.pass_seconds == 0.0
    assert torch.equal(second.batch("eval", torch.arange(4), needs).hidden[6],
                       first.batch("eval", torch.arange(4), needs).hidden[6])


def test_place_leaves_targets_on_the_host_without_cuda(teacher, small_data):
    cache = TeacherCache(teacher, small_data)
    assert cache.place("train", torch.device("cpu")) is False



def test_a_cache_folder_that_cannot_be_written_costs_a_warning_not_the_run(teacher, small_data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    needs = Needs(hidden=frozenset({6}))
    cache = TeacherCache(teacher, small_data, directory=blocker / "targets")  # a folder under a file
    with pytest.warns(RuntimeWarning, match="not kept in .*a-file/targets.*in memory"):
        cache.ensure("eval", needs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the run goes on from memory
        cache.ensure("train", needs)
    assert cache.teacher_passes == 2 and list(tmp_path.iterdir()) == [blocker]
    assert torch.equal(cache.batch("eval", torch.arange(2), needs).hidden[6],
                       TeacherCache(teacher, small_data).batch("eval", torch.arange(2), needs).hidden[6])


def test_two_processes_on_one_folder_run_the_teacher_once(teacher, small_data, tmp_path):
    """Two search workers started together on one machine: the second waits for the first's
    targets and reads them (each cache here opens its own lock, as a second process would)."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    needs = Needs(hidden=frozenset({2, 4, 6}))
    together = Barrier(2)

    def worker(_: int) -> TeacherCache:
        cache = TeacherCache(teacher, small_data, directory=tmp_path)
        together.wait()
        cache.ensure("train", needs)
        return cache

    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(worker, range(2))
    assert first.teacher_passes + second.teacher_passes == 1
    index = torch.arange(5)
    assert torch.equal(first.batch("train", index, needs).hidden[4], second.batch("train", index, needs).hidden[4])


def _sentences(teacher, news_texts, rows: int, seed: int = 0):
    from kdnas.distill import make_transfer_set

    return make_transfer_set(teacher.tokenizer, news_texts, seq_len=32, num_train=rows, num_eval=8, seed=seed,
                             unit="sentence")


def test_a_grown_set_reuses_the_targets_it_starts_with_and_runs_the_teacher_on_the_new_rows(
        teacher, news_texts, tmp_path, monkeypatch):
    small, big = _sentences(teacher, news_texts, 24), _sentences(teacher, news_texts, 40)
    needs = Needs(hidden=frozenset({6}))
    cache = TeacherCache(teacher, small, directory=tmp_path)
    cache.ensure("train", needs)
    cache.ensure("eval", needs)
    seen = []
    real = teacher.activations
    monkeypatch.setattr(teacher, "activations", lambda ids, mask, wanted: seen.append(len(ids)) or real(ids, mask, wanted))
    grown = cache.grown(big)
    grown.ensure("train", needs)
    grown.ensure("eval", needs)  # the same held-out rows: nothing to compute
    assert sum(seen) == 16 and grown.teacher_passes == 1  # the 16 new rows only
    fresh = TeacherCache(teacher, big)
    fresh.ensure("train", needs)
    every, real_tokens = torch.arange(40), big.train_mask.bool()  # padded positions are masked in every loss
    torch.testing.assert_close(grown.batch("train", every, needs).hidden[6][real_tokens].float(),
                               fresh.batch("train", every, needs).hidden[6][real_tokens].float(), atol=2e-2, rtol=1e-2)
    assert torch.equal(grown.batch("eval", torch.arange(8), needs).hidden[6],
                       cache.batch("eval", torch.arange(8), needs).hidden[6])
    assert any(big.fingerprint in p.name for p in tmp_path.glob("*.bin"))  # kept for a rerun, like any set
    with pytest.raises(ValueError, match="must start with this cache's rows"):
        cache.grown(_sentences(teacher, news_texts, 40, seed=1))  # another order of the corpus: other rows


def test_kept_targets_stream_into_a_mapped_file_and_are_read_back_mapped(teacher, small_data, tmp_path):
    """A teacher pass writes into the entry's file as it goes (the file has its full size at the first
    batch), and the finished entry is read through a mapping of that file, not held in RAM."""
    seen = []

    def at_batch(done: int, total: int) -> None:
        seen.extend(p.stat().st_size for p in tmp_path.glob("*.partial-*"))

    cache = TeacherCache(teacher, small_data, directory=tmp_path, batch_size=50, on_rows=at_batch)
    stale = tmp_path / f"{cache._prefix('train')}-hidden6.partial-1-2"
    stale.write_bytes(b"half")  # a killed run's: removed under the lock, never read
    cache.ensure("train", Needs(hidden=frozenset({6})))
    rows, seq = small_data.train_ids.shape
    assert seen == [rows * seq * 384 * 2] * 3  # one file of the whole entry, written in place batch by batch
    entry = tmp_path / f"{cache._prefix('train')}-hidden6.bin"
    rows_file = tmp_path / f"{cache._prefix('train')}-rows.ids"  # its token ids, for sets that share its rows
    assert sorted(tmp_path.iterdir()) == sorted([entry, rows_file, *tmp_path.glob("*.lock")])
    assert str(entry) in Path("/proc/self/maps").read_text()
    live = teacher.activations(small_data.train_ids[:3], small_data.train_mask[:3], Needs(hidden=frozenset({6})))
    got = cache.batch("train", torch.arange(3), Needs(hidden=frozenset({6}))).hidden[6]
    real = small_data.train_mask[:3].bool()
    torch.testing.assert_close(got[real].float(), live.hidden[6][real], atol=2e-2, rtol=1e-2)


def test_a_set_on_disk_lends_its_first_rows_to_a_smaller_set_and_to_a_larger_one(
        teacher, news_texts, tmp_path, monkeypatch):
    """Targets are computed once per corpus: a later run of fewer rows reads a slice of a longer run's
    files (no teacher pass, no new file), and a run of more rows computes only the rows after them."""
    needs = Needs(hidden=frozenset({6}))
    long = TeacherCache(teacher, _sentences(teacher, news_texts, 40), directory=tmp_path)
    long.ensure("train", needs)
    long.ensure("eval", needs)
    files = set(tmp_path.glob("*[!k]"))  # all but the (empty) lock files
    seen = []
    real = teacher.activations
    monkeypatch.setattr(teacher, "activations", lambda ids, mask, wanted: seen.append(len(ids)) or real(ids, mask, wanted))

    short = TeacherCache(teacher, _sentences(teacher, news_texts, 24), directory=tmp_path)
    assert short.stored_rows(needs) == 40
    short.ensure("train", needs)
    short.ensure("eval", needs)  # the same held-out rows
    assert seen == [] and short.teacher_passes == 0 and set(tmp_path.glob("*[!k]")) == files
    assert torch.equal(short.batch("train", torch.arange(24), needs).hidden[6],
                       long.batch("train", torch.arange(24), needs).hidden[6])

    longer = TeacherCache(teacher, _sentences(teacher, news_texts, 56), directory=tmp_path)
    longer.ensure("train", needs)
    assert sum(seen) == 16 and longer.teacher_passes == 1  # the 16 rows after the 40 on disk
    fresh = TeacherCache(teacher, longer.data)
    fresh.ensure("train", needs)
    every, real_tokens = torch.arange(56), longer.data.train_mask.bool()
    torch.testing.assert_close(longer.batch("train", every, needs).hidden[6][real_tokens].float(),
                               fresh.batch("train", every, needs).hidden[6][real_tokens].float(), atol=2e-2, rtol=1e-2)
    assert TeacherCache(teacher, _sentences(teacher, news_texts, 24), directory=tmp_path).stored_rows(needs) == 56

    other = TeacherCache(teacher, _sentences(teacher, news_texts, 24, seed=1), directory=tmp_path)
    assert other.stored_rows(needs) == 24  # another order of the corpus: nothing to lend
    other.ensure("train", needs)
    assert other.teacher_passes == 1
    assert short.stored_rows(Needs(hidden=frozenset({3}))) == 24  # an entry no set holds


def test_a_pass_that_needs_the_last_layer_only_runs_on_the_teachers_onnxruntime_graph(teacher, small_data, monkeypatch):
    """`last_layer` (export.LastLayerGraph): a long CPU pass that needs the teacher's last token states and
    nothing else runs on its plain onnxruntime graph, with the same states as PyTorch's (stored as fp16);
    a short pass, or one that needs another layer, runs PyTorch; the teacher itself is left as it was."""
    from kdnas.distill import cache as cache_module
    from kdnas.export import LastLayerGraph

    attention = teacher.model.config._attn_implementation
    graph, calls = LastLayerGraph(teacher.model), []
    last = Needs(hidden=frozenset({teacher.dims.layers}))
    short = TeacherCache(teacher, small_data, last_layer=lambda ids, mask: calls.append(len(ids)))
    short.ensure("eval", last)  # fewer rows than GRAPH_MIN_ROWS: PyTorch
    assert calls == []
    monkeypatch.setattr(cache_module, "GRAPH_MIN_ROWS", 0)
    fast = TeacherCache(teacher, small_data, last_layer=lambda ids, mask: calls.append(len(ids)) or graph(ids, mask))
    fast.ensure("train", last)
    assert sum(calls) == small_data.num_train
    plain = TeacherCache(teacher, small_data)
    plain.ensure("train", last)
    every, real = torch.arange(small_data.num_train), small_data.train_mask.bool()
    torch.testing.assert_close(fast.batch("train", every, last).hidden[teacher.dims.layers][real].float(),
                               plain.batch("train", every, last).hidden[teacher.dims.layers][real].float(),
                               atol=4e-3, rtol=2e-3)  # one fp16 rounding apart at most
    calls.clear()
    fast.ensure("train", Needs(hidden=frozenset({2})))  # another layer: PyTorch
    assert calls == [] and teacher.model.config._attn_implementation == attention
