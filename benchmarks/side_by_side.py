"""Is a student within half the teacher's latency? Read alone, or timed side by side with it.

A budget set as a share of the teacher's latency is a ratio. The search used to compare a student's
reading with a teacher reading taken at another moment (at most one fresh teacher reading beside
it); on a shared host the speed drifts between the two. This benchmark measures, `--repeats` times
in turn for each shape: the shape alone and the teacher alone, one right after the other, as
`latency.profile` does (`use_cache=False`), and the two timed in alternation in one process, as
`latency.profile_pair` does (what `kdnas search` now judges a ratio budget by). The spread of each
ratio over the repeats says how far one decision can move with the host.

    python benchmarks/side_by_side.py    # -> benchmarks/results/side_by_side.json (about 3 min)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402


def main() -> int:
    from kdnas.latency import profile, profile_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", default=["3x12x384x1536", "3x12x384x1280"])
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "side_by_side.json")
    args = parser.parse_args()

    rows = {shape: {"alone": [], "side_by_side": []} for shape in args.shapes}
    for repeat in range(args.repeats):
        for shape in args.shapes:
            student, teacher = profile(shape, use_cache=False), profile(args.teacher, use_cache=False)
            pair = profile_pair(shape, args.teacher)
            rows[shape]["alone"].append({"student_ms": round(student.median_ms, 3),
                                         "teacher_ms": round(teacher.median_ms, 3),
                                         "ratio": round(student.median_ms / teacher.median_ms, 4)})
            rows[shape]["side_by_side"].append({"student_ms": round(pair.target_ms, 3),
                                                "teacher_ms": round(pair.reference_ms, 3),
                                                "ratio": round(pair.ratio, 4),
                                                "quartiles": [round(pair.ratio_low, 4), round(pair.ratio_high, 4)]})
            print(f"{repeat + 1}/{args.repeats} {shape}: alone {student.median_ms:.2f} / {teacher.median_ms:.2f} ms = "
                  f"{student.median_ms / teacher.median_ms:.3f}; side by side {pair.ratio:.3f}", flush=True)
    for shape, row in rows.items():
        for how in ("alone", "side_by_side"):
            ratios = [r["ratio"] for r in row[how]]
            row[f"{how}_spread"] = round(max(ratios) - min(ratios), 4)
    result = {"teacher": args.teacher, "batch": 1, "seq": 128, "threads": 2, "runtime": "onnxruntime",
              "shapes": rows, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for shape, row in rows.items():
        print(f"{shape}: ratio spread over {args.repeats} repeats: alone {row['alone_spread']:.3f}, "
              f"side by side {row['side_by_side_spread']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
