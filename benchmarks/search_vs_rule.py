"""The one-line rule as the search's baseline: per teacher and budget, the search's shipped student beside the rule's.

The rule — "as many of the teacher's layers as the budget's share of its latency allows, evenly spaced, at full
width" (`kdnas.nas.rule_params`) — needs no search. For each budget of a `kdnas search` (one search of several
budgets, `--budget-ratio 0.5,0.25,0.125`, or the searches of `--searches`), the rule's student is trained with the
search's own final recipe and exactly the steps its shipped student made: the same `kdnas search`, its space
narrowed to the rule's one shape, one trial, `--final-steps` the shipped student's steps (without a time limit a
final run makes exactly those), `--final-augment 0` (the search's time-fitted run perturbs no batch when its
transfer set covers its steps; the rule's run takes the rows whose targets are on disk, up to one pass). Where
the search shipped the rule's own shape, the two are one student and nothing is trained; where the rule's shape
is over the budget, the next shallower full-width one is its student (`train_rule`). Both are judged as the product judges them: held-out
fidelity ρ (fp32 and INT8, the same sentences), the shipped graphs' latency beside the teacher (each in its own
run, as a share of the teacher read side by side with it), and linear probes (`benchmarks/student_quality.py`).

    python benchmarks/search_vs_rule.py --teacher minilm-l6 --budgets 0.5,0.25,0.125 --timeout 900
    python benchmarks/search_vs_rule.py --teacher mpnet-base --budgets 0.5,0.25,0.125 --timeout 1800
    python benchmarks/search_vs_rule.py --teacher mpnet-base --searches runs/base-teacher/search-0.5+0.25  # finished
    python benchmarks/search_vs_rule.py --table                     # the docs' tables of the result, nothing run
Writes benchmarks/results/search_vs_rule.json (a run of one teacher keeps the other's entry).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _env import environment, kdnas, ratio_list

FREE = {"mpnet-base": "minilm-l6"}  # what a user of the teacher has for free beside its INT8 graph


def budgets_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A search's budgets, largest first: label, milliseconds, ratio of the teacher, the shipped student's record."""
    teacher_ms = summary["teacher_latency"]["median_ms"]
    rows = summary.get("budgets") or [{"label": None, "budget_ms": summary["budget_ms"], "folder": "best",
                                       "final": summary.get("final") or []}]
    return [{"label": r["label"], "budget_ms": r["budget_ms"], "ratio": r["budget_ms"] / teacher_ms,
             "folder": r["folder"], "final": r["final"][-1] if r["final"] else None} for r in rows]


def rule_arch(summary: dict[str, Any], teacher_layers: int, ratio: float) -> dict[str, int] | None:
    from kdnas.nas import SearchSpace, rule_params

    space = dict(summary["settings"]["space"])
    space = SearchSpace(**{k: tuple(v) if isinstance(v, list) else v for k, v in space.items()})
    return rule_params(space, teacher_layers, ratio)


def arch_of(params: dict[str, int], head_size: int | None) -> str:
    heads = params["heads"] if head_size is None else params["hidden"] // head_size
    return f"{params['layers']}x{heads}x{params['hidden']}x{params['ffn']}"


def student_row(record: dict[str, Any] | None, summary: dict[str, Any], budget_ms: float) -> dict[str, Any] | None:
    """What a shipped student's final record says, in the table's terms."""
    if record is None:
        return None
    quality, teacher_ms = record.get("quality") or {}, summary["teacher_latency"]["median_ms"]
    fidelity = (quality.get("fidelity") or {}).get("student") or {}
    int8 = quality.get("int8") or {}
    fp32_ms = record["latency_ms"]
    int8_ms = (record.get("latency_int8_onnx") or {}).get("median_ms")
    return {"arch": record["arch"], "params": record["params"], "steps": record["steps"],
            "train_rows": record.get("train_rows"), "dir": record["dir"], "within_budget": record["within_budget"],
            "spearman": fidelity.get("spearman"), "spearman_se": fidelity.get("spearman_se"),
            "mean_cosine": fidelity.get("mean_cosine"), "int8_spearman": int8.get("spearman"),
            "fp32_ms": fp32_ms, "int8_ms": int8_ms, "teacher_ms": teacher_ms,
            "fp32_of_teacher": fp32_ms / teacher_ms, "int8_of_teacher": None if int8_ms is None else int8_ms / teacher_ms,
            "budget_used": fp32_ms / budget_ms,
            "baselines": {k: v.get("spearman") for k, v in (quality.get("fidelity") or {}).items() if k != "student"}}


def run(command: list[str]) -> tuple[int, float, str]:
    """Exit status, seconds, and the last line it wrote to stderr (a refusal's one line)."""
    print(" ".join(command), flush=True)
    t0 = time.time()
    done = subprocess.run(kdnas(command), check=False, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(done.stderr)
    return done.returncode, round(time.time() - t0, 1), (done.stderr.strip().splitlines() or [""])[-1]


def train_rule(teacher: str, budget: dict[str, Any], params: dict[str, int], head_size: int | None,
               steps: int, searched: dict[str, Any], work: Path, extra: list[str]) -> dict[str, Any]:
    """The rule's student: the search's own command on the rule's one shape, the shipped student's steps. Its
    depth is the budget's share of the teacher's layers, yet the embeddings and the rest of the graph cost too:
    where that shape is over the budget (its one trial reads over and is not trained; its student reads over as
    shipped; or the budget is under it, which `kdnas search` refuses), the next shallower full-width shape is
    tried, as a user applying the rule with a stopwatch would — down to the search's own shape, which is known
    to fit (its student shipped within the budget), so nothing is trained twice."""
    attempts: list[dict[str, Any]] = []
    for layers in range(params["layers"], 0, -1):
        shape = {**params, "layers": layers}
        if arch_of(shape, head_size) == searched["arch"]:
            return {"attempts": attempts, "same_as_search": True, "student": searched}
        attempts.append(_rule_run(teacher, budget, shape, head_size, steps, work, extra))
        if not attempts[-1]["over_budget"]:
            break
    return {"attempts": attempts, "same_as_search": False, "student": attempts[-1]["student"]}


def _rule_run(teacher: str, budget: dict[str, Any], shape: dict[str, int], head_size: int | None,
              steps: int, work: Path, extra: list[str]) -> dict[str, Any]:
    arch = arch_of(shape, head_size)
    out = work / f"rule-{budget['label'] or 'budget'}-{arch}"
    space = ["--layers", str(shape["layers"]), "--hidden", str(shape["hidden"]), "--ffn", str(shape["ffn"])]
    if head_size is None:
        space += ["--heads", str(shape["heads"])]
    command = ["kdnas", "search", "--teacher", teacher, "--corpus", "news", "--budget-ratio", f"{budget['ratio']:.6f}",
               *space, "--trials", "1", "--final-steps", str(steps),
               "--final-augment", "0", "--out", str(out), "--no-progress", *extra]
    code, seconds, last_line = run(command)
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    trials = summary.get("trials_table") or []
    record = (summary.get("final") or [None])[-1]
    student = None if record is None else student_row(record, summary, budget["budget_ms"])
    return {"arch": arch, "command": " ".join(command), "exit": code, "seconds": seconds,
            "trial_ms": trials[0]["latency_median_ms"] if trials else None,
            # no student within the budget, whatever the reason: a rule user with a stopwatch goes shallower
            "over_budget": student is None or not student["within_budget"],
            "message": last_line if code else None, "student": student,
            "over_as_shipped_ms": [r["latency_ms"] for r in summary.get("final_over_budget") or []]}


def compare(teacher: str, search_dir: Path, teacher_layers: int, work: Path, extra: list[str]) -> list[dict[str, Any]]:
    summary = json.loads((search_dir / "summary.json").read_text())
    head_size = summary["settings"]["space"].get("head_size")
    rows = []
    for budget in budgets_of(summary):
        params = rule_arch(summary, teacher_layers, budget["ratio"])
        searched = student_row(budget["final"], summary, budget["budget_ms"])
        row = {"label": budget["label"], "ratio": round(budget["ratio"], 4), "budget_ms": budget["budget_ms"],
               "search_dir": str(search_dir), "rule_arch": None if params is None else arch_of(params, head_size),
               "search": searched}
        if params is None or searched is None:
            row["rule"] = None
        else:
            row["rule"] = train_rule(teacher, budget, params, head_size, searched["steps"], searched,
                                     work / search_dir.name, extra)
        rows.append(row)
    return rows


def search_record(search_dir: Path) -> dict[str, Any]:
    """What the search itself did, and the free alternative it measured: the teacher's own INT8 graph."""
    summary = json.loads((search_dir / "summary.json").read_text())
    teacher_ms, int8 = summary["teacher_latency"]["median_ms"], summary.get("teacher_int8") or {}
    int8_ms = (int8.get("latency") or {}).get("median_ms")
    settings = {k: summary["settings"].get(k) for k in ("teacher", "corpus", "budget_ratio", "budget_ms", "precision")}
    return {"dir": str(search_dir), "settings": settings, "counts": summary["counts"],
            "trials": len(summary.get("trials_table") or []), "seconds_per_trial": summary.get("seconds_per_trial"),
            "teacher_ms": teacher_ms,
            "teacher_int8": None if int8_ms is None else {
                "ms": int8_ms, "of_teacher": int8_ms / teacher_ms,
                "spearman": (int8.get("fidelity") or {}).get("spearman")}}


def probes(teacher: str, rows: list[dict[str, Any]], work: Path, tasks: list[str]) -> dict[str, Any] | None:
    folders = sorted({s["dir"] for r in rows for s in (r["search"], (r["rule"] or {}).get("student")) if s})
    folders = [f for f in folders if Path(f, "distill.json").is_file()]
    if not folders:
        return None
    out = work / "student_quality.json"
    also = ["--also", FREE[teacher]] if teacher in FREE else []
    run([sys.executable, str(Path(__file__).parent / "student_quality.py"), *folders, "--teacher", teacher, *also,
         "--work", str(work / "baselines"), "--out", str(out), "--no-latency", "--tasks", *tasks])
    return json.loads(out.read_text()) if out.is_file() else None


def _probe_cells(quality: dict[str, Any] | None, folder: str | None, tasks: list[str]) -> str:
    rows = {m["model"]: m for m in (quality or {}).get("models", [])}
    row = rows.get(folder or "")
    return " / ".join(f"{100 * row['probes'][t]['full']:.1f}" for t in tasks) if row else "-"


def _student_cells(who: str, st: dict[str, Any] | None, quality: dict[str, Any] | None, tasks: list[str]) -> list[str]:
    if st is None:
        return [who, "none within the budget", "-", "-", "-", "-", "-"]
    int8 = "-" if st["int8_of_teacher"] is None else f"{st['int8_of_teacher']:.3f}"
    return [who, st["arch"], f"{st['steps']:,}", f"{st['spearman']:.3f} ± {st['spearman_se']:.3f}",
            f"{st['int8_spearman']:.3f}", f"{st['fp32_of_teacher']:.3f} / {int8}", _probe_cells(quality, st["dir"], tasks)]


def table(entry: dict[str, Any]) -> str:
    """One teacher's rows as the docs show them: per budget the search's student, the rule's, and the better
    of the search student's two untrained baselines; then the teacher's own INT8 graph."""
    quality = entry.get("quality")
    tasks = list((quality or {}).get("tasks") or [])
    head = ["budget", "student", "shape", "steps", "ρ fp32", "ρ INT8", "latency fp32 / INT8, × teacher",
            " / ".join(f"{t} probe" for t in tasks) or "probes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in entry["budgets"]:
        budget = f"{row['label'] or row['ratio']} ({row['budget_ms']:.2f} ms)"
        search, rule = row["search"], (row["rule"] or {})
        rule_who = "rule" if not rule.get("same_as_search") else "rule (= the search's)"
        lines.append("| " + " | ".join([budget, *_student_cells("search", search, quality, tasks)]) + " |")
        lines.append("| " + " | ".join(["", *_student_cells(rule_who, rule.get("student"), quality, tasks)]) + " |")
        if search and search["baselines"]:
            name, rho = max(search["baselines"].items(), key=lambda kv: kv[1] or 0)
            lines.append(f"| | untrained ({name.replace(' (untrained)', '')}) | | | {rho:.3f} | | | |")
    for run in entry.get("search_runs", []):
        if run.get("teacher_int8"):
            t8 = run["teacher_int8"]
            lines.append(f"| any | the teacher as INT8 (free) | | | {t8['spearman']:.3f} | | - / {t8['of_teacher']:.3f} | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--budgets", type=ratio_list, default="0.5,0.25,0.125",
                        help="the search's --budget-ratio (without --searches)")
    parser.add_argument("--timeout", type=int, default=900, help="the search's --timeout (without --searches)")
    parser.add_argument("--searches", nargs="*", type=Path, default=[], help="finished searches to compare instead")
    parser.add_argument("--search-args", default="", help="more `kdnas search` flags, for the search and the rule's runs")
    parser.add_argument("--tasks", nargs="*", default=["sentiment", "topic"], help="probes; none: skip them")
    parser.add_argument("--work", type=Path, default=Path("runs/search-vs-rule"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "search_vs_rule.json")
    parser.add_argument("--table", action="store_true", help="print the docs' tables of --out, run nothing")
    args = parser.parse_args()
    if args.table:
        for teacher, entry in json.loads(args.out.read_text())["teachers"].items():
            print(f"{teacher}\n\n{table(entry)}\n")
        return 0
    from kdnas.distill import load_teacher

    work, extra = args.work / args.teacher, args.search_args.split()
    entry: dict[str, Any] = {"searches": []}
    searches = args.searches
    if not searches:
        out = work / "search"
        ratios = ",".join(f"{r:g}" for r in args.budgets)
        command = ["kdnas", "search", "--teacher", args.teacher, "--corpus", "news", "--budget-ratio", ratios,
                   "--timeout", str(args.timeout), "--out", str(out), "--no-progress", *extra]
        code, seconds, _ = run(command)
        entry["searches"].append({"command": " ".join(command), "exit": code, "seconds": seconds})
        searches = [out]
    layers = load_teacher(args.teacher).dims.layers
    entry["budgets"] = [row for path in searches for row in compare(args.teacher, path, layers, work, extra)]
    entry["search_runs"] = [search_record(path) for path in searches]
    if args.tasks:
        entry["quality"] = probes(args.teacher, entry["budgets"], work, args.tasks)
    result = json.loads(args.out.read_text()) if args.out.is_file() else {"what": __doc__.strip().splitlines()[0]}
    result.setdefault("teachers", {})[args.teacher] = entry
    result["environment"] = environment()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
