"""`kdnas target`: read the deployment CPU once, for one teacher and one set of settings, into a profile file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from kdnas.core.assets import DEFAULT_TEACHER

    p = subparsers.add_parser(
        "target", help="profile the CPU a model will be deployed on, once, for searches on any host (--target FILE)",
        description=(
            "Run on the machine the model will be deployed on, with the deployment's settings. Reads a designed set "
            "of graphs of the teacher family's search space (fp32, all-INT8 and precision plans), each timed beside "
            "the teacher's fp32 graph, fits their costs and judges the fit on graphs it did not see; writes one "
            "small JSON file that `kdnas search --target FILE` and `kdnas profile GRAPH --target FILE` read. "
            "About 4 minutes for minilm-l6 and 15 for mpnet-base on 2 cores."),
    )
    p.add_argument("--teacher", default=DEFAULT_TEACHER, help="bundled name or local model folder (default: %(default)s)")
    p.add_argument("--out", required=True, metavar="FILE", help="the profile file to write (JSON)")
    p.add_argument("--batch", type=int, default=1, help="batch size of the deployment (default 1)")
    p.add_argument("--seq", type=int, default=128, help="sequence length in tokens (default 128)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads = pinned cores (default 2)")
    p.add_argument("--runtime", choices=("onnxruntime",), default="onnxruntime",
                   help="the runtime the deployment uses (default: onnxruntime; its fp32 and INT8 graphs)")
    p.add_argument("--seed", type=int, default=0, help="which shapes the design draws (default 0)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=_target)


def _target(args: argparse.Namespace) -> int:
    from kdnas.core.errors import InputError
    from kdnas.core.files import ensure_writable_dir
    from kdnas.latency import Settings, check_settings, max_tokens

    from .target import make_target

    check_settings(args.batch, args.seq, args.threads, args.runtime)
    positions = max_tokens(args.teacher)
    if positions is not None and args.seq > positions:
        raise InputError(f"--seq {args.seq} exceeds the teacher's {positions} positions")
    out = Path(args.out)
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; give the profile's file name, e.g. {out / 'target.json'}")
    ensure_writable_dir(out.parent if str(out.parent) else Path("."), "--out folder")
    settings = Settings(batch=args.batch, seq=args.seq, threads=args.threads, runtime=args.runtime)

    def shown(i: int, total: int, reading) -> None:
        print(f"[{i + 1}/{total}] {reading.graph.label}: {reading.ratio:.3f}x the teacher "
              f"({reading.teacher_ms:.2f} ms)", file=sys.stderr, flush=True)

    profile = make_target(args.teacher, settings, seed=args.seed, on_reading=shown)
    profile.save(out)
    if args.json:
        print(json.dumps(profile.to_json(), indent=1))
        return 0
    print(summary_line(profile))
    print(f"profile: {out}")
    return 0


def summary_line(profile) -> str:
    """One line: host, teacher, how many graphs were read and how well the fit predicts those it did not see."""
    held = profile.held_out
    judged = "" if held is None else (
        f"; on {len(held.errors)} held-out graphs: median error {100 * held.median_abs_error:.1f} %, "
        f"{100 * held.within_5pct:.0f} % within ±5 %")
    return (f"target {profile.host.cpu} ({profile.settings.threads} threads, batch {profile.settings.batch}, seq "
            f"{profile.settings.seq}): teacher {profile.teacher} {profile.teacher_ms:.2f} ms, {len(profile.readings)} "
            f"graphs read in {profile.seconds:.0f} s, leave-one-out error {100 * profile.rel_error:.1f} %{judged}")
