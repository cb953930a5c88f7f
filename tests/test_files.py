"""core.files: atomic writes, and files as readable as the user's umask makes any file — not private
like the temporary files and the safetensors files they start as."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
import torch

from kdnas.core.files import atomic_write_text, check_parent_folder, make_shared, staged_folder, umask, undone_if_refused


@pytest.fixture(params=[0o022, 0o077, 0o002])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_umask_is_read_and_left_as_it_was(mask):
    assert umask() == mask and umask() == mask


def test_an_atomic_write_replaces_the_file_whole_with_the_umask_s_mode(tmp_path, mask):
    path = tmp_path / "new" / "card.md"
    atomic_write_text(path, "first")
    atomic_write_text(path, "second ρ")
    assert path.read_text(encoding="utf-8") == "second ρ" and _mode(path) == 0o666 & ~mask
    assert [p.name for p in path.parent.iterdir()] == ["card.md"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_text(path, "old")
    with pytest.raises(TypeError):
        atomic_write_text(path, None)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_private_folder_and_safetensors_file_are_shared_as_the_umask_allows(tmp_path, mask):
    from safetensors.torch import save_file

    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "sub").mkdir()
    save_file({"w": torch.zeros(2)}, str(folder / "sub" / "model.safetensors"))
    assert _mode(folder) == 0o700  # what mkdtemp makes: the reason for make_shared
    make_shared(folder)
    assert _mode(folder) == _mode(folder / "sub") == 0o777 & ~mask
    assert _mode(folder / "sub" / "model.safetensors") == 0o666 & ~mask


def _build(out: Path, text: str, **kwargs) -> None:
    with staged_folder(out, **kwargs) as stage:
        (stage / "sub").mkdir()
        (stage / "sub" / "weights").write_text(text)


def test_a_staged_folder_replaces_the_old_one_whole_and_is_shared(tmp_path, mask):
    out = tmp_path / "runs" / "best"
    _build(out, "old")
    _build(out, "new")
    assert (out / "sub" / "weights").read_text() == "new"
    assert _mode(out) == _mode(out / "sub") == 0o777 & ~mask and _mode(out / "sub" / "weights") == 0o666 & ~mask
    assert [p.name for p in out.parent.iterdir()] == ["best"]  # no stage, no old copy left


def test_a_failed_build_leaves_the_old_folder_and_no_stage(tmp_path):
    out = tmp_path / "best"
    _build(out, "old")
    with pytest.raises(RuntimeError), staged_folder(out) as stage:
        (stage / "half").write_text("written")
        raise RuntimeError("the export failed")
    assert (out / "sub" / "weights").read_text() == "old" and not (out / "half").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["best"]
    # Nothing there before: the folders made on the way to it go too (an export to runs/new/best that fails).
    with pytest.raises(RuntimeError), staged_folder(tmp_path / "runs" / "new" / "best") as stage:
        raise RuntimeError("the export failed")
    assert [p.name for p in tmp_path.iterdir()] == ["best"]


def test_keep_existing_keeps_a_folder_another_run_put_there_first(tmp_path):
    out = tmp_path / "baselines"
    with staged_folder(out, keep_existing=True) as stage:
        (stage / "mine").write_text("second")
        _build(out, "first")  # a concurrent run renames its folder into place while this one builds
    assert (out / "sub" / "weights").read_text() == "first" and not (out / "mine").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["baselines"]


def test_folders_made_for_a_refused_step_are_removed_and_no_others(tmp_path):
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "new" / "deeper"
    with pytest.raises(ValueError), undone_if_refused(out):
        out.mkdir(parents=True)
        raise ValueError("refused")
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "new").exists()
    # A folder that gained a file is the user's now: it stays, and so does every folder above it.
    with pytest.raises(ValueError), undone_if_refused(out):
        out.mkdir(parents=True)
        (tmp_path / "kept" / "new" / "note").write_text("")
        raise ValueError("refused")
    assert (tmp_path / "kept" / "new" / "note").is_file() and not out.exists()
    with undone_if_refused(out):  # no failure: what was made stays
        out.mkdir()
    assert out.is_dir()


def test_an_output_below_a_file_is_refused_and_nothing_made(tmp_path):
    from kdnas.core.errors import InputError

    (tmp_path / "a-file").write_text("")
    with pytest.raises(InputError, match=r"--out .*a-file/x/y cannot be made: .*a-file is a file, not a folder"):
        check_parent_folder(tmp_path / "a-file" / "x" / "y")
    assert check_parent_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_files_a_refused_step_made_are_removed_and_earlier_ones_kept(tmp_path):
    out = tmp_path / "new"
    (tmp_path / "old.db").write_text("kept")
    with pytest.raises(ValueError), undone_if_refused(out, files=[out / "study.db", tmp_path / "old.db"]):
        out.mkdir()
        (out / "study.db").write_text("made by the refused step")
        raise ValueError("refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]
    with pytest.raises(ValueError), undone_if_refused(tmp_path / "a/b", files=[tmp_path / "old.db" / "x.db"]):
        raise ValueError("refused before the file could be made")  # a file below a file: nothing to remove


def test_a_new_file_someone_else_put_work_in_is_kept_when_the_step_is_refused(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(ValueError), undone_if_refused(out, files=[out / "j.log"], keep=lambda f: f.stat().st_size > 0):
        out.mkdir()
        (out / "j.log").write_text("another worker's study")
        raise ValueError("refused")
    assert (out / "j.log").read_text() == "another worker's study"  # the file stays, and so its folder
