"""The demo, three times from an empty cache: does the same command ship the same graph, for the same reason?

Runs the command `bash dev.sh demo` runs (`kdnas search --teacher minilm-l6 --corpus news --timeout T`, T read from
dev.sh) `--repeats`
times one after another on one host, each with its own empty `KDNAS_CACHE`, and records what each shipped: the
graph (a student's shape and precision, or the teacher's plan), its held-out ρ, the budget's verdict and the
reading that made it, the wall time. Then the worst case for a decision at the budget's edge: the budget set to
exactly the rule shape's ratio to the teacher (3x12x384x1536, read side by side with the teacher first), the
same command `--repeats` times: the rule trial's verdict and its stated reason in each.

    python benchmarks/demo_repeat.py --repeats 3
    python benchmarks/demo_repeat.py --part demo        # the three demos only (the other part kept)
    python benchmarks/demo_repeat.py --redo demo-1      # one run again (say, one a test run beside it disturbed)
    python benchmarks/demo_repeat.py --refresh          # each record derived again from its run's folder
Writes benchmarks/results/demo_repeat.json (the runs under --work).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _env import kdnas, write_result

def demo_command() -> list[str]:
    """The demo's command as dev.sh runs it (its --timeout read from there: one source), without its --out."""
    import re

    line = next(x for x in (Path(__file__).parents[1] / "dev.sh").read_text().splitlines() if "search --teacher" in x)
    timeout = re.search(r"--timeout (\d+)", line).group(1)
    return ["kdnas", "search", "--teacher", "minilm-l6", "--corpus", "news", "--timeout", timeout, "--no-progress"]


DEMO = demo_command()
RULE_SHAPE = "3x12x384x1536"


def run(out: Path, extra: list[str]) -> dict:
    command = [*DEMO, "--out", str(out), *extra]
    with tempfile.TemporaryDirectory(prefix="kdnas-cache-") as cache:
        started = time.time()
        done = subprocess.run(kdnas(command), env={**os.environ, "KDNAS_CACHE": cache, "HF_HUB_OFFLINE": "1"},
                              capture_output=True, text=True, check=False)
        seconds = round(time.time() - started, 1)
    code = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip() or None  # the commit the run ran
    return {"command": " ".join(command), "code": code, "exit": done.returncode, "seconds": seconds,
            "stderr_tail": done.stderr[-600:] if done.returncode else "", **derived(out)}


def derived(out: Path) -> dict:
    """What a run's folder says it shipped, the rule trial's verdict and the teacher's plan's (`--refresh`)."""
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return {**shipped(summary), "rule": rule_trial(out), "teacher_plan": teacher_plan(summary)}


def teacher_plan(summary: dict) -> dict:
    """Whether the teacher's plans found one within the budget, and the all-INT8 graph's readings that decided it:
    before the trials (`int8_readings` where it was read again near the budget) and, where those were over and
    its reading at the final stage fitted, when its plan was decided again then (`again`); where --timeout left its
    growth to the final stage, the forecast that deferred it (`deferred`)."""
    plans = summary.get("teacher_plans") or {}
    row = (plans.get("budgets") or [{}])[0]
    return {"fits": row.get("fits"), "int8_ms": plans.get("int8_ms"), "int8_readings": row.get("int8_readings"),
            "again": row.get("again"), "deferred": row.get("deferred")}


def shipped(summary: dict) -> dict:
    """What `best/` holds and why it fits: the teacher's plan where it won, else the student."""
    teacher = next((t for t in summary.get("final_teacher") or [] if t.get("shipped")), None)
    final = (summary.get("final") or [{}])[0]
    if teacher:
        return {"shipped": f"the teacher, {teacher['plan']['label']}", "graph": teacher["graph"],
                "rho": teacher["fidelity"]["spearman"], "decided_ms": teacher["plan"]["latency_ms"],
                "decided_by": "its precision plan's reading", "as_shipped_ms": teacher["latency_ms"],
                "budget_ms": summary.get("budget_ms")}
    quality = final.get("quality") or {}
    graph = final.get("budget_graph")
    rho = {"model.int8.onnx": quality.get("int8"), "model.mixed.onnx": quality.get("mixed")}.get(
        graph, (quality.get("fidelity") or {}).get("student")) or {}
    verdict = final.get("verdict") or {}
    return {"shipped": f"student {final.get('arch')}", "graph": graph, "rho": rho.get("spearman"),
            "steps": final.get("steps"), "decided_ms": verdict.get("ms"), "decided_by": verdict.get("by"),
            "as_shipped_ms": final.get("latency_ms"), "budget_ms": summary.get("budget_ms")}


def rule_trial(out: Path) -> dict:
    """The trial of RULE_SHAPE: its status, the reason it states and the readings that decided it, and whether the
    rule queued it (`origin` "rule"). On a host where it reads under half the teacher the rule's depth at its ratio
    is one layer less, and the shape is a trial TPE proposed (`origin` None) or none at all ({})."""
    import optuna

    try:
        study = optuna.load_study(study_name="kdnas", storage=f"sqlite:///{out / 'study.db'}")
    except Exception:  # noqa: BLE001 - a run that made no study
        return {}
    trials = [t for t in study.trials if t.user_attrs.get("arch") == RULE_SHAPE and t.user_attrs.get("status")]
    if not trials:
        return {}
    t = min(trials, key=lambda t: t.user_attrs.get("origin") != "rule")  # the rule's own trial first
    latency = t.user_attrs.get("latency") or {}
    return {"status": t.user_attrs.get("status"), "precision": t.user_attrs.get("precision", "fp32"),
            "reason": t.user_attrs.get("reason", ""), "origin": t.user_attrs.get("origin"),
            "median_ms": latency.get("median_ms"), "ratio_to_teacher": latency.get("ratio_to_teacher"),
            "edge_readings": latency.get("edge_readings")}


def rule_ratio() -> dict:
    from kdnas.core.spec import parse_arch
    from kdnas.distill import load_teacher
    from kdnas.latency import profile_pair

    spec = parse_arch(RULE_SHAPE, **load_teacher("minilm-l6").student_sizes())
    pair = profile_pair(spec, "minilm-l6", seq=128, threads=2)
    return {"ratio": round(pair.ratio, 4), "quartiles": [round(pair.ratio_low, 4), round(pair.ratio_high, 4)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("runs/demo-repeat"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "demo_repeat.json")
    parser.add_argument("--part", choices=("both", "demo", "edge"), default="both",
                        help="run the demos, the runs at the rule shape's ratio, or both (a part run alone replaces "
                             "that part in --out and keeps the other)")
    parser.add_argument("--refresh", action="store_true",
                        help="derive each run's record in --out again from its folder under --work (what it shipped, "
                             "the rule trial, the teacher's plan), keeping its wall time and exit")
    parser.add_argument("--redo", metavar="RUN", help="run one entry of --out again and replace it: demo-1, edge-0, ... "
                        "(a run a disturbance outside kdnas spoiled; the JSON says which was redone)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    if args.redo:
        return redo(args)
    if args.refresh:
        return refresh(args)
    result: dict = {"what": __doc__.strip().splitlines()[0]}
    if args.part != "both" and args.out.is_file():  # the other part kept, with the host and versions it ran on
        earlier = json.loads(args.out.read_text())
        own, other = ("demo", "at_the_rule_shapes_ratio") if args.part == "demo" else ("at_the_rule_shapes_ratio", "demo")
        kept = {f"environment_{other}": earlier.get(f"environment_{other}") or earlier.get("environment")}
        result = {**{k: v for k, v in earlier.items() if k != f"environment_{own}"}, **result, **kept}
    if args.part in ("both", "demo"):
        result["demo"] = []
        for i in range(args.repeats):
            result["demo"].append(run(args.work / f"demo-{i}", []))
            write_result(args.out, result)
    if args.part == "demo":
        return 0
    result["rule_ratio"] = rule_ratio()
    edge = ["--budget-ratio", f"{result['rule_ratio']['ratio']:.4f}"]
    result["at_the_rule_shapes_ratio"] = []
    for i in range(args.repeats):
        result["at_the_rule_shapes_ratio"].append(run(args.work / f"edge-{i}", edge))
        write_result(args.out, result)
    return 0


def refresh(args: argparse.Namespace) -> int:
    """Each record derived again from its run's folder; the environments the runs were made in are kept."""
    from _env import environment

    result = json.loads(args.out.read_text())
    for part in ("demo", "at_the_rule_shapes_ratio"):
        for entry in result.get(part, []):
            words = entry["command"].split()
            entry.update(derived(Path(words[words.index("--out") + 1])))
    result["refreshed_by"] = environment()["command"]
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


def redo(args: argparse.Namespace) -> int:
    """Run one entry again with the command it ran (`demo-1`: the second demo; `edge-0`: the first at the rule
    shape's ratio) and replace it in --out, the earlier run kept beside it as `replaced`."""
    kind, _, index = args.redo.partition("-")
    key = {"demo": "demo", "edge": "at_the_rule_shapes_ratio"}.get(kind)
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs = result.get(key) or []
    if key is None or not index.isdigit() or int(index) >= len(runs):
        sys.exit(f"demo_repeat.py: --redo {args.redo!r}: no such run in {args.out}; allowed: "
                 + ", ".join([f"demo-{i}" for i in range(len(result.get('demo') or []))]
                             + [f"edge-{i}" for i in range(len(result.get('at_the_rule_shapes_ratio') or []))]))
    earlier = runs[int(index)]
    extra = ["--budget-ratio", f"{result['rule_ratio']['ratio']:.4f}"] if kind == "edge" else []
    runs[int(index)] = {**run(args.work / f"{args.redo}-redo", extra), "replaced": earlier}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
