"""Does `kdnas search --timeout` end in time, and what does the limit cost the shipped student?

Runs the demo's command (`bash dev.sh demo`: MiniLM teacher, news corpus, every default) as a
fresh process from an empty cache, once per `--timeout` given, one after the other, and records
for each: the command's wall time against its limit, the trials run, the final run's steps against
`--final-steps`, the seconds set aside for what follows the final run against what it took, and
the shipped student's shape and embedding fidelity. A limit shorter than the demo's (e.g. 420 s)
shows how the fit behaves when it must cut on any host.

    python benchmarks/search_timeout.py 570 420

Writes benchmarks/results/search_timeout.json (or --json) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _demo import REPO, run_demo
from _env import environment


def run(timeout_s: float, extra: list[str]) -> dict:
    """One demo run with `--timeout timeout_s` in a temporary folder with an empty cache."""
    with tempfile.TemporaryDirectory(prefix="kdnas-timeout-") as tmp:
        demo = run_demo(Path(tmp) / "demo", Path(tmp) / "cache", timeout_s, extra)
    summary, final, wall = demo["summary"], demo["final"], demo["wall_s"]
    seconds = final["seconds"]
    after = seconds["quality"] + seconds["export"] + seconds["latency"]
    return {
        "timeout_s": timeout_s, "command": demo["command"],
        "wall_s": round(wall, 1), "within_limit": wall <= timeout_s,
        "trials": summary["trials"], "teacher_ms": summary["teacher_latency"]["median_ms"],
        "budget_ms": summary["budget_ms"], "shipped": final["arch"], "latency_ms": final["latency_ms"],
        "steps": final["steps"], "steps_planned": final["steps_planned"],
        "distill_s": seconds["distill"], "set_aside_after_s": seconds["set_aside_after_distill"],
        "after_distill_s": round(after, 1),
        "fidelity_rho": final["quality"]["fidelity"]["student"]["spearman"],
        "stderr_notes": [line for line in demo["stderr"].splitlines() if "--timeout" in line],
    }


def table(rows: list[dict]) -> str:
    lines = ["| --timeout | wall | trials | shipped | steps | after the run: set aside / took | ρ |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['timeout_s']:g} s | {r['wall_s']:.0f} s | {r['trials']} | {r['shipped']} "
                     f"({r['latency_ms']:.2f} ms) | {r['steps']} of {r['steps_planned']} | "
                     f"{r['set_aside_after_s']:.0f} s / {r['after_distill_s']:.0f} s | {r['fidelity_rho']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeouts", type=float, nargs="+", help="--timeout values in seconds, run in this order")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more kdnas search flags")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "search_timeout.json"))
    args = parser.parse_args()
    rows = [run(t, args.extra) for t in args.timeouts]
    Path(args.json).write_text(json.dumps({"environment": environment(), "runs": rows}, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
