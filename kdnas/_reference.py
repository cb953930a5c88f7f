"""The CLI reference, docs/cli.md, written from the parsers themselves so it cannot drift from them.

    python -m kdnas._reference > docs/cli.md

tests/test_docs.py fails when docs/cli.md differs from what this prints.
"""

from __future__ import annotations

import argparse
import functools

from .cli import build_parser

WIDTH = 100  # fixed, so the page does not depend on the terminal it was written from

HEADER = """# CLI reference

Every `kdnas` command's `--help`, as the parsers print it (written by `python -m kdnas._reference >
docs/cli.md`; a test fails when this page and the parsers differ). What each command is for, with
examples: [search](search.md), [distill](distill.md), [evaluate](evaluate.md), [export](export.md),
[latency](latency.md).
"""


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)
    return parser.format_help().rstrip()


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-command parsers of `parser`, by name."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def render() -> str:
    parser = build_parser()
    parts = [HEADER, "## kdnas\n", f"```text\n{_help(parser)}\n```\n"]
    for name, sub in commands(parser).items():
        parts += [f"## kdnas {name}\n", f"```text\n{_help(sub)}\n```\n"]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
