"""The `kdnas` console script: one entry point, one sub-command per job.

Each package owns its sub-commands in a private `_cli.py` exposing `register(subparsers)`; this
module only assembles them and turns user errors into a one-line message with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata

from kdnas.core.errors import KdnasError

EXIT_USER_ERROR = 2
# What a bug report needs beside kdnas's own version: the libraries a student's numbers depend on.
REPORTED_LIBRARIES = ("torch", "transformers", "onnxruntime", "optuna")


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (a mistyped number, an unknown option) as one line, like every other
    user error; the full usage stays one `--help` away. Sub-command parsers inherit this class."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version_line() -> str:
    """`kdnas 0.1.0 (python 3.11.7, torch 2.13.0+cpu, ...)`: read from the installed packages' metadata,
    so `--version` answers at once without importing torch."""
    versions = [f"python {platform.python_version()}"]
    for name in REPORTED_LIBRARIES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} not installed")
    try:
        own = metadata.version("kdnas")
    except metadata.PackageNotFoundError:
        own = "(not installed)"
    return f"kdnas {own} ({', '.join(versions)})"


def build_parser() -> argparse.ArgumentParser:
    from kdnas.distill import _cli as distill_cli
    from kdnas.evaluation import _eval_cli as evaluate_cli
    from kdnas.evaluation import _export_cli as export_cli
    from kdnas.latency import _cli as latency_cli

    parser = _Parser(
        prog="kdnas",
        description=(
            "Find, distill and ship small Transformer students under a CPU latency budget. "
            "Bundled defaults (no network needed): teachers minilm-l6 (default) and mpnet-base, "
            "corpus news."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print kdnas's version and those of python, torch, transformers, onnxruntime, optuna")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (distill_cli, evaluate_cli, export_cli, latency_cli):
        module.register(sub)
    from kdnas.nas import _cli as nas_cli

    nas_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Bundled assets are local; a hub lookup would only hang on a closed network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `kdnas search --workers N` starts copies of itself
    try:
        return int(args.func(args) or 0)
    except KdnasError as err:
        print(f"kdnas {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"kdnas {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
