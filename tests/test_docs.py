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


# Which commands each page documents: the options it names must be that command's (or, in the
# README and the design notes, any command's).
PAGES = {"search.md": ("search", "report", "target"), "distill.md": ("distill",), "export.md": ("export",),
         "latency.md": ("profile", "target"), "evaluate.md": ("evaluate", "transfer")}
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
NOT_KDNAS = {"--no-deps"}  # pip's, in docs/assets.md
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _command_options() -> dict[str, set[str]]:
    """Each sub-command's options, and under "kdnas" the top-level ones (`kdnas --version`)."""
    from kdnas._reference import commands
    from kdnas.cli import build_parser

    parser = build_parser()
    options = {name: {o for a in p._actions for o in a.option_strings} for name, p in commands(parser).items()}
    return {**options, "kdnas": {o for a in parser._actions for o in a.option_strings}}


def _named_options(markdown: Path) -> set[str]:
    """Options named in the page's kdnas commands: code spans and kdnas lines of code blocks."""
    text = markdown.read_text()
    spans = CODE_SPAN.findall(re.sub(r"```.*?```", "", text, flags=re.S))
    blocks = [line for block in re.findall(r"```.*?```", text, flags=re.S) for line in block.splitlines()
              if "kdnas " in line or line.startswith("    --")]
    return {o for chunk in spans + blocks if "pip " not in chunk and "pytest" not in chunk and "python " not in chunk
            for o in OPTION.findall(chunk)}


def test_every_option_the_docs_name_is_in_the_commands_help():
    options = _command_options()
    every = set().union(*options.values())
    for markdown in documents():
        if markdown.name == "benchmarks.md" or markdown.parent.name == "benchmarks":
            continue  # their options are the benchmark scripts'
        allowed = set().union(*(options[c] for c in PAGES[markdown.name])) if markdown.name in PAGES else every
        unknown = _named_options(markdown) - allowed - options["kdnas"] - NOT_KDNAS
        assert not unknown, f"{markdown.relative_to(REPO)} names options its command does not have: {sorted(unknown)}"


def test_the_distill_option_table_states_the_parsers_defaults():
    defaults = _command_defaults("distill")
    rows = [line for line in (REPO / "docs" / "distill.md").read_text().splitlines() if line.startswith("| `--")]
    assert len(rows) >= 8
    for row in rows:
        flags_cell, default_cell = row.split("|")[1:3]
        flags = re.findall(r"--[a-z-]+", flags_cell)
        stated = [v.strip().strip("`") for v in default_cell.split(",")]
        assert len(flags) == len(stated), row
        for flag, value in zip(flags, stated):
            if not value.startswith("$"):  # a path under the cache folder is computed, not a literal default
                assert _same(value, defaults[flag]), f"docs/distill.md: {flag} defaults to {value}, --help: {defaults[flag]}"


def _same(stated: str, default: object) -> bool:
    try:
        return float(stated) == float(default)
    except (TypeError, ValueError):
        return stated == str(default)


def _command_defaults(command: str) -> dict[str, object]:
    from kdnas._reference import commands
    from kdnas.cli import build_parser

    # An option without a parser default (None) takes it from elsewhere; its help says which.
    return {a.option_strings[0]: a.default if a.default is not None else _help_default(a.help or "")
            for a in commands(build_parser())[command]._actions if a.option_strings}


def _help_default(text: str) -> str | None:
    found = re.search(r"\(default: ([^)]+)\)", " ".join(text.split()))
    return found.group(1) if found else None


def test_the_cli_reference_is_what_the_parsers_print():
    from kdnas._reference import render

    assert (REPO / "docs" / "cli.md").read_text() == render(), \
        "docs/cli.md is out of date: python -m kdnas._reference > docs/cli.md"
