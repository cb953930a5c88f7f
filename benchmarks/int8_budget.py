"""A budget on the graph users deploy: the demo searched with its budget read on the fp32 graph
(`--runtime onnxruntime`, the default) and on the INT8 graph (`--runtime onnxruntime-int8`), side by side.

Runs the demo's command (`bash dev.sh demo`: MiniLM teacher, news corpus, `--timeout 570`, every other
setting default) once per runtime, one after the other, each as a fresh process with its own empty cache.
For each shipped student: its shape, the graph the budget judged, the budget, the fidelity ρ of its fp32
student and of its `model.int8.onnx` on the held-out sentences the search scores it on. Then the two
shipped INT8 graphs are timed in alternation in one process (`latency.profile_pair`, batch 1, 128 tokens,
2 threads), and each against the teacher's INT8 graph: what a user who deploys INT8 gets from each search.

    python benchmarks/int8_budget.py [--timeout 570]
Writes benchmarks/results/int8_budget.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _demo import run_demo
from _env import environment

RUNTIMES = ("onnxruntime", "onnxruntime-int8")


def search(runtime: str, timeout_s: float, tmp: Path) -> dict:
    out = tmp / runtime
    demo = run_demo(out, tmp / f"cache-{runtime}", timeout_s, ["--runtime", runtime])
    summary, final = demo["summary"], demo["final"]
    quality = final["quality"]
    return {"runtime": runtime, "command": demo["command"], "wall_s": round(demo["wall_s"], 1),
            "trials": summary["trials"], "budget_ms": round(summary["budget_ms"], 3),
            "budget_graph": final["budget_graph"], "shipped": final["arch"], "steps": final["steps"],
            "latency_ms": round(final["latency_ms"], 3), "fp32_variant": final["export"].get("fp32_variant"),
            "rho_fp32": quality["fidelity"]["student"]["spearman"], "rho_int8": quality["int8"]["spearman"],
            "rho_int8_se": quality["int8"].get("spearman_se"), "sentences": quality["sentences"],
            "best": str(out / "best")}


def main() -> None:
    from kdnas.latency import profile_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=570)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "int8_budget.json")
    args = parser.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="kdnas-int8-budget-") as tmp:
        runs = [search(runtime, args.timeout, Path(tmp)) for runtime in RUNTIMES]
        for r in runs:
            print(json.dumps(r), flush=True)
        graphs = [Path(r.pop("best")) / "model.int8.onnx" for r in runs]
        pair = profile_pair(graphs[1], graphs[0], batch=1, seq=128, threads=2)
        beside = {"int8_budgeted_over_fp32_budgeted": round(pair.ratio, 3),
                  "range": [round(pair.ratio_low, 3), round(pair.ratio_high, 3)],
                  "ms": [round(pair.reference.median_ms, 3), round(pair.target.median_ms, 3)]}
        for r, graph in zip(runs, graphs):
            to_teacher = profile_pair(graph, "minilm-l6", batch=1, seq=128, threads=2, runtime="onnxruntime-int8")
            r["int8_vs_teacher_int8"] = round(to_teacher.ratio, 3)
    result = {"what": __doc__.strip().splitlines()[0], "runs": runs, "int8_graphs_side_by_side": beside,
              "seconds": round(time.time() - t0, 1), "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
