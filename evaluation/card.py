"""`kdnas evaluate --card`: what was measured, written into each student folder's model card.

The search writes `best/README.md` with the facts it measures itself (shape, latency, fidelity beside
the untrained baselines); the probes and fine-tuning take minutes more than a search should spend, so
they come from `kdnas evaluate`. With `--card` its table — every model of the run, the teacher's row
first — lands in the card of each student folder evaluated, between two markers, so that a later run
replaces that section and leaves the rest of the card as it was (a folder without a card gets one);
the whole report, every score with its standard error, goes beside it as `evaluate.json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kdnas.core.errors import InputError
from kdnas.core.files import atomic_write_text, ensure_writable_dir

from .baselines import verdict_lines
from .report import format_markdown

CARD = "README.md"
REPORT = "evaluate.json"
START = "<!-- kdnas evaluate --card: start (a later --card run replaces this section) -->"
END = "<!-- kdnas evaluate --card: end -->"


def card_folders(models: list[str]) -> tuple[list[Path], list[str]]:
    """The student folders among `models` that `--card` writes into, and the names it leaves out
    (bundled teachers: their cached copy is not the user's). A folder it cannot write is a user error,
    raised before anything is measured."""
    folders = [Path(m) for m in models if Path(m).is_dir()]
    if not folders:
        raise InputError("--card writes each evaluated student folder's model card, and no MODEL is a folder "
                         f"({', '.join(models) or 'none given'}); name a folder such as runs/demo/best")
    for folder in folders:
        ensure_writable_dir(folder, "--card: the model folder")
    return folders, [m for m in models if not Path(m).is_dir()]


def write_card(folder: str | Path, report: dict, command: str, machine: str) -> Path:
    """Put the evaluation's section into `folder`'s README.md (replacing an earlier one) and its report
    into evaluate.json; returns the card's path."""
    atomic_write_text(Path(folder) / REPORT, json.dumps(report, indent=2) + "\n")
    path = Path(folder) / CARD
    text = path.read_text(encoding="utf-8") if path.is_file() else f"# {Path(folder).resolve().name}\n"
    section = card_section(report, Path(folder), command, machine)
    # The section is the last start marker before the first end marker: a marker left alone by an
    # edit of the card never makes the text around it part of what is replaced.
    end = text.find(END)
    start = text.rfind(START, 0, end) if end >= 0 else -1
    if start >= 0:
        text = text[:start] + section + text[end + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    return atomic_write_text(path, text)


def card_section(report: dict, folder: Path, command: str, machine: str) -> str:
    """The section: how it was measured, then the table with this folder's row in bold."""
    own = folder.resolve()
    marked = {**report, "models": [
        {**row, "model": f"**{row['model']}** (this model)"} if Path(row["path"]).resolve() == own else row
        for row in report["models"]]}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    own_verdict = {name: v for name, v in report.get("verdicts", {}).items() if Path(name).resolve() == own}
    verdict = "".join(f"\n{line}" for line in verdict_lines(own_verdict))
    if verdict:  # --baselines: a student not ahead of both has failed, and its card says so
        verdict = f"\n\nAgainst its untrained baselines (`--baselines`):\n\n```{verdict}\n```"
    return (f"{START}\n## Measured with `kdnas evaluate`\n\n`{command}` — {when}, {machine}; every score "
            f"with its standard error: `{REPORT}`.\n\n{format_markdown(marked)}{verdict}\n{END}")
