"""The shipped graphs checked on the deployment target, after a search judged by its profile (`--target FILE`).

A profile predicts; what ships must also read within its budget where it will run. On the profile's own host (the
same CPU, flags and onnxruntime) each graph in `best*/` is read once beside the teacher's fp32 graph, and its ratio
put on the profile's scale of the teacher (so the host's drift since the profile was made cancels); a graph that
reads over its budget's limit is said to be over, by how much, in summary.json and the printed summary. On
another host (a GPU server) nothing is read, and each record holds the one command that checks the graph there.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from .schema import StudyFacts


def shipped_graphs(facts: StudyFacts) -> list[tuple[str, str, float | None, float | None]]:
    """(folder, graph file, the budget's limit in ms, the judged milliseconds) of every graph in a best*/ folder:
    the teacher's plan where it shipped, else the student there."""
    out = []
    for t in facts.final_teacher or ():
        if t.shipped and t.dir and t.graph:
            out.append((t.dir, t.graph, t.budget_limit_ms, t.latency_ms))
    taken = {d for d, *_ in out}
    for r in facts.final or ():
        if Path(r.dir).name.startswith("best") and r.displaced_by is None and r.dir not in taken and r.budget_graph:
            out.append((r.dir, r.budget_graph, r.budget_limit_ms, r.latency_ms))
    return out


def verify_on_target(facts: StudyFacts, config: Any, target: Any, target_file: str) -> tuple[dict[str, Any], ...]:
    """Each shipped graph's check on the target: read beside the teacher on the profile's host, else the command."""
    from kdnas.latency import Host

    from .measure import LatencyJudge

    here = Host.here().same_machine(target.host)
    out = []
    for folder, graph, limit_ms, predicted_ms in shipped_graphs(facts):
        path = Path(folder) / graph
        record: dict[str, Any] = {"dir": folder, "graph": graph, "predicted_ms": predicted_ms,
                                  "budget_limit_ms": limit_ms, "target_cpu": target.host.cpu}
        if not here or not path.is_file():
            record["command"] = f"kdnas profile {path} --target {target_file}"
            out.append(record)
            continue
        pair = LatencyJudge(config).pair(path, config.teacher)
        read_ms = pair.ratio * target.teacher_ms
        record.update(read_ms=round(read_ms, 4), ratio=round(pair.ratio, 4),
                      ratio_quartiles=[round(pair.ratio_low, 4), round(pair.ratio_high, 4)],
                      within=limit_ms is None or read_ms <= limit_ms)
        out.append(record)
    return tuple(out)


def verified_line(record: dict[str, Any]) -> str:
    """One line of the printed summary for one shipped graph's check."""
    where = f"{record['dir']}/{record['graph']}"
    if "command" in record:
        return f"on the target ({record['target_cpu']}): check {where} there with: {record['command']}"
    limit = record.get("budget_limit_ms")
    verdict = "within its budget" if record["within"] else \
        f"OVER its budget by {100 * (record['read_ms'] / limit - 1):.1f} % (limit {limit:.2f} ms)"
    return (f"on the target: {where} read {record['read_ms']:.2f} ms beside the teacher ({record['ratio']:.3f}x), "
            f"predicted {record['predicted_ms']:.2f} ms: {verdict}")


def target_facts(target: Any, path: str) -> dict[str, Any]:
    """What a study keeps of the profile that judged it: the file, its host, teacher, settings and error."""
    held = target.held_out
    return {"file": str(path), "cpu": target.host.cpu, "flags": list(target.host.flags), "teacher": target.teacher,
            "teacher_ms": round(target.teacher_ms, 4), "settings": asdict(target.settings),
            "versions": dict(target.host.versions), "rel_error": round(target.rel_error, 4),
            "held_out_median_error": None if held is None else held.median_abs_error,
            "held_out_within_5pct": None if held is None else held.within_5pct}
