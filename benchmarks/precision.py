"""Precision in the search: the graph `kdnas search` ships with precision plans, beside the best of shapes alone.

For a teacher, one `kdnas search` as a user runs it (`--budget-ratio` several budgets, `--timeout` the time limit
of the whole command, every other setting the default, so `--runtime onnxruntime-auto`), then for each budget:

- **shipped**: the graph `best-<budget>/` holds — a student's fp32 graph, its all-INT8 graph or a precision plan
  grown on its trained weights, or the teacher's own plan where that was closer — its embedding fidelity ρ to the
  teacher on the search's 1,000 held-out news sentences and its latency as shipped, as a share of the teacher's
  fp32 graph (timed side by side with it);
- beside it, from the same run: the trained student's **fp32** and **all-INT8** graphs (what kdnas shipped before
  plans: a shape, quantized whole or not at all), the **teacher's all-INT8 graph** where it fits the budget (the
  free alternative), the teacher's own best plan, and the **untrained baselines** (the teacher's first k layers;
  the student's inherited start).

The teacher's targets are a one-time cost per corpus, kept apart from the search's time (`--targets ROWS`, as
`benchmarks/base_teacher.py` does). A rerun of the same command resumes the finished search and reads it again.

    python benchmarks/precision.py --teacher minilm-l6 --budgets 0.6,0.5,0.35,0.25 --timeout 900
    python benchmarks/precision.py --teacher mpnet-base --budgets 0.5 --timeout 1800 --targets 30720
    python benchmarks/precision.py --teacher mpnet-base --budgets 0.6,0.5,0.35,0.25 --timeout 3600
    python benchmarks/precision.py --table            # the docs' tables from the result
Writes benchmarks/results/precision.json (searches under --work); each run replaces its teacher-and-budgets row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _env import environment, kdnas, ratio_list

RESULT = Path(__file__).parent / "results" / "precision.json"


def run_search(teacher: str, ratios: list[float], timeout: int, work: Path) -> dict:
    name = f"{teacher}-{'+'.join(f'{r:g}' for r in ratios)}-{timeout}s"
    out = work / name
    command = ["kdnas", "search", "--teacher", teacher, "--corpus", "news",
               "--budget-ratio", ",".join(f"{r:g}" for r in ratios), "--timeout", str(timeout), "--out", str(out),
               "--no-progress"]
    print(" ".join(command), flush=True)
    t0 = time.time()
    done = subprocess.run(kdnas(command), check=False)
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return {"name": name, "teacher": teacher, "ratios": ratios, "timeout": timeout, "command": " ".join(command),
            "exit": done.returncode, "seconds": round(time.time() - t0, 1),
            "budgets": [budget_row(summary, ratio, label) for ratio, label in _labels(summary, ratios)],
            "trials": summary.get("trials"), "counts": summary.get("counts"),
            "teacher_latency_ms": (summary.get("teacher_latency") or {}).get("median_ms"),
            "teacher_plans_seconds": (summary.get("teacher_plans") or {}).get("seconds")}


def _labels(summary: dict, ratios: list[float]) -> list[tuple[float, str | None]]:
    labels = [b["label"] for b in summary.get("budgets") or []]
    return list(zip(ratios, labels)) if labels else [(ratios[0], None)]


def budget_row(summary: dict, ratio: float, label: str | None) -> dict:
    """One budget's shipped graph beside the student's fp32 and all-INT8 graphs, the teacher's INT8 graph and
    plan, and the untrained baselines (ρ on the held-out sentences; latency over the teacher's fp32 graph)."""
    teacher_ms = (summary.get("teacher_latency") or {}).get("median_ms")
    finals = [f for f in summary.get("final") or [] if f.get("budget") == label]
    teacher = next((t for t in summary.get("final_teacher") or [] if t.get("budget") == label), None)
    row: dict = {"ratio": ratio, "label": label, "budget_ms": None if not finals else finals[0]["budget_ms"]}
    int8 = summary.get("teacher_int8")
    if int8 and teacher_ms:
        row["teacher_int8"] = {"rho": int8["fidelity"]["spearman"], "x": int8["latency"]["median_ms"] / teacher_ms,
                               "fits": row["budget_ms"] is not None and int8["latency"]["median_ms"] <= row["budget_ms"]}
    if not finals:
        return row
    f = finals[0]
    quality = f.get("quality") or {}
    fidelity = quality.get("fidelity") or {}

    def graph(name: str, rho_row: dict | None) -> dict | None:
        latency = f.get(name)
        if not latency or not rho_row:
            return None
        return {"rho": rho_row["spearman"], "se": rho_row.get("spearman_se"), "ms": latency["median_ms"],
                "x": latency["median_ms"] / teacher_ms if teacher_ms else None}

    row["student"] = {"arch": f["arch"], "steps": f.get("steps"), "dir": f["dir"], "graph": f.get("budget_graph"),
                      "plan": (f.get("precision_plan") or {}).get("label"),
                      "fp32": graph("latency_fp32_onnx", fidelity.get("student")),
                      "int8": graph("latency_int8_onnx", quality.get("int8")),
                      "mixed": graph("latency_mixed_onnx", quality.get("mixed"))}
    row["baselines"] = {name: r["spearman"] for name, r in fidelity.items() if name != "student"}
    shipped = row["student"][{"model.onnx": "fp32", "model.int8.onnx": "int8"}.get(f.get("budget_graph"), "mixed")]
    verdict = f.get("verdict") or {}
    row["shipped"] = {"what": f"student {f['arch']} ({f.get('budget_graph')})", **(shipped or {}),
                      **_decided(verdict.get("ms"), teacher_ms, verdict.get("by"))}
    if teacher:
        row["teacher_plan"] = {"plan": teacher["plan"]["label"], "rho": teacher["fidelity"]["spearman"],
                               "x": teacher["plan"]["latency_ms"] / teacher_ms if teacher_ms else None,
                               "shipped": teacher.get("shipped")}
        if teacher.get("shipped"):
            row["shipped"] = {"what": f"the teacher ({teacher['graph']}: {teacher['plan']['label']})",
                              "rho": teacher["fidelity"]["spearman"], "ms": teacher["latency_ms"],
                              "x": teacher["latency_ms"] / teacher_ms if teacher_ms else None,
                              **_decided(teacher["plan"]["latency_ms"], teacher_ms, "its precision plan's reading")}
    return row


def _decided(ms: float | None, teacher_ms: float | None, by: str | None) -> dict:
    """The reading that decided the budget's verdict (before training, or a plan's own), beside the one as shipped."""
    if ms is None or not teacher_ms:
        return {}
    return {"decided_ms": ms, "decided_x": ms / teacher_ms, "decided_by": by}


def table(result: dict) -> str:
    """The docs' table: per teacher and budget, the shipped graph beside the rest."""
    def cell(g: dict | None) -> str:
        if not g or g.get("rho") is None:
            return "—"
        if g.get("x") is None:
            return f"{g['rho']:.3f}"
        if g.get("decided_x") is not None and abs(g["decided_x"] - g["x"]) > 0.005:
            return f"{g['rho']:.3f} at {g['decided_x']:.2f}× ({g['x']:.2f}× as shipped)"
        return f"{g['rho']:.3f} at {g['x']:.2f}×"

    lines = ["| search | budget | shipped (with plans) | its ρ, latency | student fp32 | student all-INT8 | teacher all-INT8 "
             "(if it fits) | teacher's best plan | untrained baselines |", "|---|---|---|---|---|---|---|---|---|"]
    for run in result.get("runs", []):
        budgets = len(run["ratios"])
        search = (f"{run['teacher']}, {budgets} budget{'s' if budgets > 1 else ''}, --timeout {run['timeout']} "
                  f"(ran {run['seconds']:,.0f} s{', ' + run['code'] if run.get('code') else ''})")
        for b in run["budgets"]:
            s = b.get("student") or {}
            t8 = b.get("teacher_int8") or {}
            tp = b.get("teacher_plan")
            base = ", ".join(f"{v:.3f}" for v in (b.get("baselines") or {}).values()) or "—"
            lines.append(f"| {search} | {b['ratio']:g}× | {(b.get('shipped') or {}).get('what', '—')} | "
                         f"**{cell(b.get('shipped'))}** | {cell(s.get('fp32'))} | {cell(s.get('int8'))} | "
                         f"{cell(t8) if t8.get('fits') else 'over' if t8 else '—'} | "
                         f"{cell(tp) if tp else '—'} | {base} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", choices=("minilm-l6", "mpnet-base"), default="minilm-l6")
    parser.add_argument("--budgets", type=ratio_list, default=[0.6, 0.5, 0.35, 0.25])
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--targets", type=int, default=0, metavar="ROWS",
                        help="first compute the teacher's targets of this many transfer sentences, timed (0: none)")
    parser.add_argument("--work", type=Path, default=Path("runs/precision"))
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--table", action="store_true", help="print the docs' table from --out and stop")
    args = parser.parse_args()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {"what": __doc__.strip().splitlines()[0]}
    if args.table:
        print(table(result))
        return 0
    if args.targets:
        from base_teacher import precompute_targets

        if args.teacher != "mpnet-base":
            parser.error("--targets: only the base teacher's targets are worth computing apart")
        result.setdefault("targets", {})[args.teacher] = precompute_targets(args.targets)
    run = run_search(args.teacher, sorted(args.budgets, reverse=True), args.timeout, args.work)
    run["environment"] = environment()
    run["code"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=Path(__file__).parent).stdout.strip() or None  # the commit the search ran
    result["runs"] = [r for r in result.get("runs", []) if r["name"] != run["name"]] + [run]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
