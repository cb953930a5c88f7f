import shutil

import pytest

from kdnas.core import assets
from kdnas.core.errors import KdnasError


def test_bundled_teacher_files_verify():
    path = assets.teacher_path("minilm-l6")
    assert (assets.Path(path) / "model.safetensors").is_file()


def test_altered_or_missing_file_is_a_clear_error(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(assets.teacher_path("minilm-l6"), folder)
    assets._verify(folder, assets.MINILM.files, "teacher minilm-l6")  # intact copy passes
    with open(folder / "config.json", "a") as handle:
        handle.write(" ")
    with pytest.raises(KdnasError, match="altered"):
        assets._verify(folder, assets.MINILM.files, "teacher minilm-l6")
    (folder / "vocab.txt").unlink()
    with pytest.raises(KdnasError, match="missing"):
        assets._verify(folder, {"vocab.txt": assets.MINILM.files["vocab.txt"]}, "teacher minilm-l6")


def test_unknown_teacher_name_lists_bundled(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KdnasError, match="minilm-l6, mpnet-base"):
        assets.teacher_path("no-such-teacher")
    with pytest.raises(KdnasError, match="neither a bundled name"):
        assets.teacher_path("./no/such/dir")


def test_news_corpus_hash_verified():
    assert assets.sha256_file(assets.corpus_file("news")) == assets.NEWS.sha256


def test_mpnet_extracts_once_and_verifies(tmp_path, monkeypatch):
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    first = assets.teacher_path("mpnet-base")
    assert (assets.Path(first) / "model.safetensors").stat().st_size > 400_000_000
    # Renamed in whole, with its stamp: nothing but the one folder beside it, readable like any folder.
    assert [p.name for p in assets.Path(first).parent.iterdir()] == [assets.Path(first).name]
    assert (assets.Path(first) / ".kdnas-verified.json").is_file() and assets.Path(first).stat().st_mode & 0o005
    assert assets.teacher_path("mpnet-base") == first  # second call: fingerprint check only
    with open(assets.Path(first) / "config.json", "a") as handle:
        handle.write(" ")
    with pytest.raises(KdnasError, match="altered"):
        assets.teacher_path("mpnet-base")


def test_an_mpnet_cache_without_its_stamp_is_replaced_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("KDNAS_CACHE", str(tmp_path))
    folder = assets.Path(assets.teacher_path("mpnet-base"))
    (folder / ".kdnas-verified.json").unlink()  # as a hand or an interrupted older version leaves it
    (folder / "model.safetensors").write_bytes(b"half")
    assert assets.Path(assets.teacher_path("mpnet-base")) == folder
    assert (folder / "model.safetensors").stat().st_size > 400_000_000 and (folder / ".kdnas-verified.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # the old one moved aside and removed
