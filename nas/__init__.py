"""kdnas.nas — architecture search under a CPU latency budget (KD-NAS).

Public API:
    search(config) -> StudySummary       run or resume a search; writes best/, pages, tables
    write_report(out) -> StudySummary    rebuild pareto.html, report.html, trials.csv, summary.json
    StudySummary                         what a study holds, counted (summary.json is its to_json())
    SearchConfig                         every setting, frozen and nested; defaults = `kdnas search` defaults;
                                         SearchConfig.from_flags(final_steps=600) builds one in the flags' names
    ProxyRecipe, LatencySettings,        its groups: what defines the study (proxy, latency, reward) and
    RewardSettings, FinalRecipe,         what a later run may change (final, run)
    RunSettings
    SearchSpace, default_space           the (layers, heads, hidden, ffn) choices
    rule_params                          the one-line rule's shape for a budget (the search's baseline)
    kdnas_reward                         the KD-NAS reward (docs/methods.md, App. C Eq. 12)
    reference_shapes                     the paper's Table 1 students scaled to a teacher
    Scored                               one scored candidate (trial, reference shape or finalist)
"""

from __future__ import annotations

from pathlib import Path

from .config import FinalRecipe, LatencySettings, ProxyRecipe, RewardSettings, RunSettings, SearchConfig
from .records import StudySummary
from .reference import reference_shapes
from .reward import kdnas_reward
from .scored import Scored
from .search import search
from .space import SearchSpace, default_space, rule_params
from .schema import stored


def write_report(out: str | Path, *, storage: str | None = None, study_name: str | None = None) -> StudySummary:
    """Rebuild a search's four outputs in `out` from its storage (safe while the search runs)."""
    from kdnas.core.errors import InputError

    from kdnas.core.files import ensure_writable_dir
    from .report import write_outputs
    from .storage import find_study, open_storage, read_pointer

    out = Path(out)
    if not out.is_dir():
        raise InputError(f"{out} is not a folder")
    if storage is None or study_name is None:
        recorded_storage, recorded_name = read_pointer(out)
        storage, study_name = storage or recorded_storage, study_name or recorded_name
    ensure_writable_dir(out, "report folder")
    study = find_study(open_storage(storage, must_exist=True), study_name)
    if study is None:
        raise InputError(f"storage {storage} has no study named {study_name!r}")
    from .schema import check_version

    check_version(stored(study), f"study {study_name!r} in {storage}")  # a newer kdnas's records: not misread
    return write_outputs(study, out)


__all__ = ["FinalRecipe", "LatencySettings", "ProxyRecipe", "RewardSettings", "RunSettings", "Scored", "SearchConfig",
           "SearchSpace", "StudySummary", "default_space", "kdnas_reward", "reference_shapes", "rule_params", "search",
           "write_report"]
