"""The documents point only inside the repository, and every link (file and #heading) resolves."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def anchors(markdown: Path) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces to hyphens."""
    slugs = set()
    in_code = False
    for line in markdown.read_text().splitlines():
        in_code ^= line.startswith("```")
        if not in_code and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return slugs


def broken_links(markdown: Path, root: Path = REPO) -> list[str]:
    text = re.sub(r"```.*?```", "", markdown.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            broken.append(f"{target} (leaves the repository)")
            continue
        path, _, anchor = target.partition("#")
        file = (markdown.parent / path).resolve() if path else markdown
        if not file.exists() or root not in file.parents:
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_link_resolves_inside_the_repository():
    problems = {str(d.relative_to(REPO)): b for d in documents() if (b := broken_links(d))}
    assert not problems, problems


def test_the_checker_catches_a_missing_file_heading_and_address(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n[ok](#title-here) [x](#nope) [y](b.md) [z](https://example.org)\n")
    assert len(broken_links(tmp_path / "a.md", tmp_path)) == 3
