"""How well a target profile predicts graphs it never read, per teacher family, on this host.

For each teacher, `kdnas target` as the product runs it (`nas.target.make_target`: 23 design graphs and 11 held-out
ones, each read beside the teacher's fp32 graph), timed; then `--checks` further graphs the profile never saw —
shapes of the teacher's default space drawn with another seed, as fp32, all-INT8 and precision plans that keep a
few groups of the first layers or one kind of group in every layer fp32 — are each read beside the teacher the
same way and set against the profile's prediction. Reported per teacher: the profile's own held-out error, the
checks' errors, their median absolute error and the share within ±5 %; at the top, the worst over the teachers.

    python benchmarks/target_profile.py [--teachers minilm-l6,mpnet-base] [--checks 16]
Writes benchmarks/results/target_profile.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "target_profile.json"


def checks(layers: int, heads: int, hidden: int, ffn: int, count: int, seed: int):
    """`count` graphs of the teacher's space the design does not hold: fp32, all-INT8 and plans, in turn."""
    from kdnas.latency import DesignGraph
    from kdnas.nas.space import default_space
    from kdnas.nas.target import design

    space = default_space(layers, heads, hidden, ffn, keep_head_size=True)
    read = {(g.arch, g.int8, g.fp32_groups) for g in design(layers, heads, hidden, ffn)}
    shapes = [f"{n}x{h // space.head_size}x{h}x{f}" for n in space.layers for h in space.hidden for f in space.ffn]
    rng = random.Random(seed)
    out: list[DesignGraph] = []
    plans = [("ffn_in",), ("0.ffn_out", "0.qkv"), ("embeddings", "0.attn_out"), ("attn_out", "ffn_out")]
    while len(out) < count:
        arch = rng.choice(shapes)
        kind = len(out) % 3
        graph = DesignGraph(arch, int8=kind > 0, fp32_groups=rng.choice(plans) if kind == 2 else (), held_out=True)
        if (graph.arch, graph.int8, graph.fp32_groups) not in read:
            read.add((graph.arch, graph.int8, graph.fp32_groups))
            out.append(graph)
    return out


def one_teacher(name: str, count: int) -> dict:
    from kdnas.distill import load_teacher
    from kdnas.latency import Settings, read_design
    from kdnas.nas.target import make_target

    settings = Settings()
    start = time.monotonic()
    profile = make_target(name, settings, on_reading=lambda i, n, r: print(f"  [{i + 1}/{n}] {r.graph.label}: "
                                                                           f"{r.ratio:.3f}x", flush=True))
    made_s = time.monotonic() - start
    profile.save(RESULT.parent / f"target_profile_{name}.json")  # the profile itself, as `kdnas target` writes it
    teacher = load_teacher(name)
    d = teacher.dims
    graphs = checks(d.layers, d.heads, d.hidden, d.ffn, count, seed=1)
    readings = read_design(graphs, name, teacher.student_sizes(), settings)
    rows = []
    for r in readings:
        read_ms = r.ratio * profile.teacher_ms
        predicted = profile.predict(r.graph.composition()).ms
        print(f"  check {r.graph.label}: predicted {predicted:.2f} ms, read {read_ms:.2f} ms "
              f"({100 * (predicted / read_ms - 1):+.1f} %; quartiles {r.ratio_low:.3f}-{r.ratio_high:.3f})", flush=True)
        rows.append({"graph": r.graph.label, "predicted_ms": round(predicted, 4), "read_ms": round(read_ms, 4),
                     "ratio": r.ratio, "quartiles": [r.ratio_low, r.ratio_high],
                     "error": round(predicted / read_ms - 1, 4)})
    errors = [abs(row["error"]) for row in rows]
    return {"teacher": name, "teacher_ms": round(profile.teacher_ms, 3), "target_seconds": round(made_s, 1),
            "readings": len(profile.readings), "rel_error": round(profile.rel_error, 4),
            "held_out": vars(profile.held_out) if profile.held_out else None,
            "checks": rows, "checks_median_abs_error": round(statistics.median(errors), 4),
            "checks_within_5pct": round(sum(e <= 0.05 for e in errors) / len(errors), 4),
            "coef": list(profile.coef)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", default="minilm-l6,mpnet-base")
    parser.add_argument("--checks", type=int, default=16)
    parser.add_argument("--out", default=str(RESULT))
    args = parser.parse_args()
    results = []
    for name in args.teachers.split(","):
        print(f"{name}:", flush=True)
        results.append(one_teacher(name, args.checks))
        r = results[-1]
        print(f"{name}: kdnas target {r['target_seconds']:.0f} s; held-out median error "
              f"{100 * r['held_out']['median_abs_error']:.1f} %, within ±5 % {100 * r['held_out']['within_5pct']:.0f} %; "
              f"checks {100 * r['checks_median_abs_error']:.1f} %, {100 * r['checks_within_5pct']:.0f} %", flush=True)
    every = [e for r in results for e in [*r["held_out"]["errors"].values(), *(c["error"] for c in r["checks"])]]
    summary = {"environment": environment(), "teachers": results,
               "all_median_abs_error": round(statistics.median(abs(e) for e in every), 4),
               "all_within_5pct": round(sum(abs(e) <= 0.05 for e in every) / len(every), 4)}
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"all {len(every)} unseen graphs: median error {100 * summary['all_median_abs_error']:.1f} %, "
          f"{100 * summary['all_within_5pct']:.0f} % within ±5 %; {args.out}")


if __name__ == "__main__":
    main()
