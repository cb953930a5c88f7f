"""What a distilled student must beat: its two untrained baselines at equal or lower cost, rebuilt
from the `distill.json` beside it, and the verdict of each measure against them.

- `first k layers`: the teacher cut after its first k layers at full width, untrained, with k the
  deepest cut whose FLOPs do not exceed the student's (so its latency is not higher);
- `inherited`: the student's shape cut out of the teacher (`distill.inherit`: the same layer rule,
  the same calibration rows of the same transfer set), before any step — for a student inherited
  this way its own starting point, checked against the plan its record names.

A student that is not ahead of both on every measure has failed (the issue's test, `verdicts`'s
`failures`); what is beyond the noise is said beside it, and so are the measures on which an
untrained baseline already scores at or above the teacher, where imitating the teacher cannot win.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torch import nn

from kdnas.core import assets
from kdnas.core.errors import AssetError, InputError
from kdnas.core.files import staged_folder
from kdnas.core.spec import StudentSpec

from .models import ModelRef, resolve_model

RECORD = "distill.json"


def first_layers_depth(teacher_dims: Any, spec: StudentSpec, seq: int) -> int:
    """The deepest full-width cut of the teacher that costs no more FLOPs than `spec` (at least 1)."""
    t = teacher_dims
    full = [spec.replace(layers=k, heads=t.heads, hidden=t.hidden, ffn=t.ffn) for k in range(1, t.layers + 1)]
    cheaper = [s.layers for s in full if s.flops(seq) <= spec.flops(seq)]
    return max(cheaper, default=1)


def untrained_baselines(teacher: Any, spec: StudentSpec, importance: Any, layer_rule: str,
                        seq: int) -> tuple[dict[str, nn.Module], Any]:
    """Both untrained baselines of `spec` by name — `first k layers`, and `inherited` when the
    shape can inherit — and the inherited start's plan (None when it cannot)."""
    from kdnas.distill.inherit import first_layers, inherit_reason, inherit_student

    k = first_layers_depth(teacher.dims, spec, seq)
    models, plan = {"first layer" if k == 1 else f"first {k} layers": first_layers(teacher, k, importance)}, None
    if inherit_reason(teacher, spec) is None:
        models["inherited"], plan = inherit_student(teacher, spec, importance, layer_rule)
    return models, plan


@dataclass(frozen=True)
class StudentBaselines:
    """One student's baselines as models to evaluate, and how its own start relates to them."""

    student: str  # the MODEL as the user gave it
    refs: tuple[ModelRef, ...]
    start: str  # one line: the inherited baseline is the student's start, or what the student started from


def student_folders(models: Sequence[str], log: Callable[[str], None] = lambda m: None) -> list[str]:
    """The MODELs whose baselines `--baselines` rebuilds: folders with a distill.json (each checked
    now, before any measuring); the others are said in `log`, and none at all is a user error."""
    students = [m for m in models if (Path(m) / RECORD).is_file()]
    if not students:
        raise InputError(f"--baselines rebuilds a kdnas student's untrained baselines from its {RECORD}, and no MODEL "
                         f"has one ({', '.join(models) or 'none given'}); name a folder written by kdnas search "
                         "(OUT/best) or kdnas distill")
    for model in models:
        if model not in students:
            log(f"--baselines: none for {model} (no {RECORD}: not a kdnas student)")
    for folder in students:
        read_record(folder)
    return students


def students_baselines(students: Sequence[str], teacher: str | None, corpus: str, seq: int,
                       log: Callable[[str], None] = lambda m: None, root: Path | None = None) -> list[StudentBaselines]:
    """Every student's baselines (`build_baselines`); a row name two different baselines would share
    (students of different teachers) names its student."""
    built = [build_baselines(s, teacher, corpus, seq, log, root) for s in students]
    paths: dict[str, set[str]] = {}
    for b in built:
        for ref in b.refs:
            paths.setdefault(ref.name, set()).add(ref.path)
    return [replace(b, refs=tuple(replace(r, name=f"{r.name} of {b.student}") if len(paths[r.name]) > 1 else r
                                  for r in b.refs)) for b in built]


def distinct_refs(built: Sequence[StudentBaselines]) -> list[ModelRef]:
    """The baselines to measure, each once (two students of one shape share them)."""
    return list({ref.path: ref for b in built for ref in b.refs}.values())


def with_verdicts(report: dict, built: Sequence[StudentBaselines]) -> dict:
    """`report` with each student's verdict against its own baselines (`verdicts`) and its start."""
    judged = verdicts(report, {b.student: [r.name for r in b.refs] for b in built})
    for b in built:
        judged[b.student]["start"] = b.start
    return {**report, "verdicts": judged}


def read_record(folder: str | Path) -> dict:
    """A student folder's distill.json, checked for what a rebuild reads; one-line user errors."""
    path = Path(folder) / RECORD
    if not path.is_file():
        raise InputError(f"--baselines: model folder {str(folder)!r} has no {RECORD}; allowed: a folder written by "
                         "kdnas search (OUT/best) or kdnas distill")
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"--baselines: {path} cannot be read as JSON ({type(err).__name__}); allowed: the record "
                         "kdnas search or kdnas distill wrote") from None
    if not isinstance(record, dict) or not {"spec", "config"} <= record.keys():
        raise InputError(f"--baselines: {path} has no student spec and config; allowed: the record kdnas search or "
                         "kdnas distill wrote")
    if not isinstance(record.get("transfer_set"), dict) or "seq_len" not in record["transfer_set"]:
        raise InputError(f"--baselines: {path} does not describe its transfer set (written by an older kdnas); "
                         "distill the student again, or evaluate it without --baselines")
    return record


def build_baselines(folder: str, teacher: str | None, corpus: str, seq: int,
                    log: Callable[[str], None] = lambda m: None, root: Path | None = None) -> StudentBaselines:
    """Rebuild `folder`'s two untrained baselines from its distill.json — from the teacher and corpus it
    names (else `teacher`, `corpus`), cost-matched at `seq` tokens — saved once as sentence-transformers
    folders under `root` (default $KDNAS_CACHE/baselines; a rerun reads them, and their scores stay cached)."""
    record = read_record(folder)
    if record.get("teacher") and teacher and record["teacher"] != teacher:
        log(f"{folder}: its baselines are cut from the teacher it was distilled from, {record['teacher']} "
            f"(its {RECORD}), not {teacher}")
    teacher = record.get("teacher") or teacher
    if teacher is None:
        raise InputError(f"--baselines: {folder}/{RECORD} names no teacher; give --teacher")
    corpus = record.get("corpus") or corpus
    where = _store(record, teacher, corpus, seq, root or assets.cache_root() / "baselines")
    names = _kept(where)
    if not names:
        log(f"{folder}: building its untrained baselines from {teacher} (calibration rows of {corpus})")
        names = _build(record, teacher, corpus, seq, where)
    refs = tuple(ModelRef(name=_label(n), path=str(where / n), fingerprint=resolve_model(str(where / n)).fingerprint)
                 for n in names)
    return StudentBaselines(student=folder, refs=refs, start=_start_line(record, where))


def _store(record: dict, teacher: str, corpus: str, seq: int, root: Path) -> Path:
    """One folder under `root` per everything `_build` reads — not the student's weights, which the
    baselines never see: students of one shape, recipe and transfer set share them."""
    key = json.dumps([teacher, corpus, seq, record["spec"], _calibration(record), record["config"]["seed"],
                      record["config"]["layer_rule"]], sort_keys=True)
    return Path(root) / hashlib.sha256(key.encode()).hexdigest()[:16]


def _calibration(record: dict) -> dict:
    """The transfer set's arguments its calibration rows come from (its first training rows, which do
    not depend on how many follow)."""
    from kdnas.distill.inherit import CALIBRATION_ROWS

    info = record["transfer_set"]
    return {"seq_len": info["seq_len"], "train": min(info["train"], CALIBRATION_ROWS), "eval": info["eval"],
            "unit": info.get("unit", "window")}


def _build(record: dict, teacher_name: str, corpus: str, seq: int, where: Path) -> list[str]:
    """Cut both baselines from the teacher and save them into `where`; their folder names."""
    from kdnas.core.sentence import write_sentence_transformers
    from kdnas.distill import TeacherCache, load_corpus, load_teacher, make_transfer_set

    teacher = load_teacher(teacher_name)
    spec, rows, config = StudentSpec(**record["spec"]), _calibration(record), record["config"]
    data = make_transfer_set(teacher.tokenizer, load_corpus(corpus), seq_len=rows["seq_len"],
                             num_train=rows["train"], num_eval=rows["eval"], seed=config["seed"], unit=rows["unit"])
    models, plan = untrained_baselines(teacher, spec, TeacherCache(teacher, data).importance(), config["layer_rule"],
                                       seq=seq)
    # Another run building the same baselines at once may rename its folder into place first: then
    # theirs are kept, and they are these (the key names everything they are built from).
    with staged_folder(where, keep_existing=True) as stage:
        (stage / "plan.json").write_text(json.dumps(plan.describe() if plan else None))
        for name, model in models.items():
            folder = stage / (name.replace(" ", "-") + (f"-{spec.arch}" if name == "inherited" else ""))
            model.save_pretrained(folder)
            teacher.tokenizer.save_pretrained(folder)
            write_sentence_transformers(folder, assets.teacher_path(teacher_name), hidden_size=model.config.hidden_size)
    if not (names := _kept(where)):  # builds are renamed into place whole: a folder without models was damaged
        raise AssetError(f"the baselines' folder {where} holds no complete model; remove it and run again")
    return names


def _kept(where: Path) -> list[str]:
    """The baseline folders complete in `where` (none when it is missing)."""
    return sorted(p.name for p in where.iterdir() if (p / "config.json").is_file()) if where.is_dir() else []


def _label(folder_name: str) -> str:
    """A row's name in the table: `first-3-layers` -> `first 3 layers (untrained)`, `first-layer` ->
    `first layer (untrained)`, `inherited-3x12x384x1280` -> `inherited 3x12x384x1280 (untrained)`."""
    words = folder_name.split("-")
    return (" ".join(words) if words[0] == "first" else f"inherited {'-'.join(words[1:])}") + " (untrained)"


def _start_line(record: dict, where: Path) -> str:
    """Whether the inherited baseline is the student's own start, checked against its record."""
    started, rebuilt = dict(record.get("init") or {}), json.loads((where / "plan.json").read_text())
    how = started.pop("init", "unknown")
    if how == "inherit" and rebuilt is not None and started == rebuilt:
        return f"the inherited baseline is this student's own start (teacher layers {rebuilt['teacher_layers']})"
    if how == "inherit":
        return f"rebuilt start {rebuilt} differs from the student's record {started}: the inherited row is its " \
               "shape cut from the teacher, not exactly its start"
    if how == "continued":  # e.g. the search's fallback: a refused wider finalist, narrowed and trained on
        origin = f" ({started['from']}, after {started.get('after_steps')} steps)" if "from" in started else ""
        return f"the student was trained on from another student{origin}; the inherited row is its own shape " \
               "cut from the teacher"
    return f"the student started from {how} weights, not inherited; the inherited row is its shape cut from the teacher"


def verdicts(report: dict, baselines: dict[str, Sequence[str]]) -> dict[str, dict]:
    """For each student (its row name -> its baselines' row names), against each baseline on every
    measure (evaluation.compare):
    - `failures`: where it is not ahead at all (the issue's strict test: ahead of both, everywhere);
    - `behind`: where it is behind by more than the noise (2 standard errors of the difference);
    - `baseline_at_or_above_teacher`: measures on which an untrained baseline already scores at or
      above the teacher itself, so a student that imitates the teacher cannot be told from it there.
    """
    from .compare import compare, scores

    rows = {r["model"]: r for r in report["models"]}
    teacher = next((scores(r) for r in report["models"] if r["role"] == "teacher"), {})
    out = {}
    for name, bases in baselines.items():
        diffs = [(base, d) for base in bases for d in compare(rows[name], rows[base])]
        failed = [d.describe(base) for base, d in diffs if d.delta <= 0]
        out[name] = {"baselines": list(bases), "beats_both_baselines_on_every_measure": not failed,
                     "failures": failed, "behind": [d.describe(base) for base, d in diffs if d.verdict == "behind"],
                     "ahead": sum(d.verdict == "ahead" for _, d in diffs), "comparisons": len(diffs),
                     "baseline_at_or_above_teacher": sorted({d.measure for _, d in diffs if d.measure in teacher
                                                             and d.b.value >= teacher[d.measure].value})}
    return out


def verdict_lines(verdicts: dict[str, dict]) -> list[str]:
    """One paragraph per student: the strict test, then what is beyond the noise."""
    lines = []
    for name, v in verdicts.items():
        lines.append(f"{name}: ahead of both untrained baselines on every measure: "
                     f"{'yes' if v['beats_both_baselines_on_every_measure'] else 'no'}; ahead beyond the noise on "
                     f"{v['ahead']} of {v['comparisons']} comparisons, behind beyond it on {len(v['behind'])}")
        lines += [f"  not ahead: {f}" for f in v["failures"]]
        if v["baseline_at_or_above_teacher"]:
            lines.append(f"  an untrained baseline scores at or above the teacher on: "
                         f"{', '.join(v['baseline_at_or_above_teacher'])}")
        if v.get("start"):
            lines.append(f"  {v['start']}")
    return lines
