"""The teacher's targets pass: PyTorch against the teacher's plain onnxruntime graph (`export.LastLayerGraph`).

For each teacher, the first `--rows` sentences of a default search's transfer set (64-token sentence rows,
length-sorted batches of 32, the pass `distill.TeacherCache` makes) are labelled with the teacher's last token
states by each runtime in turn, `--rounds` times alternated, so a busy spell of a shared host falls on both;
the ratio of the two medians is the speed-up a search's pass gets. The largest difference between the two
runtimes' states on real tokens is recorded beside it (both stored as fp16 in the cache).

    python benchmarks/teacher_pass.py [--teachers minilm-l6,mpnet-base --rows 512 --rounds 3]
Writes benchmarks/results/teacher_pass.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _env import environment


def compare(name: str, rows: int, rounds: int) -> dict:
    from kdnas.distill import Needs, TeacherCache, load_corpus, load_teacher
    from kdnas.distill import cache as cache_module
    from kdnas.export import LastLayerGraph
    from kdnas.nas import SearchConfig
    from kdnas.nas.recipe import final_transfer_set

    teacher = load_teacher(name)
    data = final_transfer_set(SearchConfig.from_flags(teacher=name), teacher, load_corpus("news"), rows)
    graph = LastLayerGraph(teacher.model)
    t0 = time.perf_counter()
    graph(data.train_ids[:2, :8], data.train_mask[:2, :8])  # the export and the session, once per process
    export_s = time.perf_counter() - t0
    cache_module.GRAPH_MIN_ROWS = 0  # every pass on the graph where one is given, whatever its length
    last = Needs(hidden=frozenset({teacher.dims.layers}))
    seconds: dict[str, list[float]] = {"torch": [], "onnxruntime": []}
    states = {}
    for _ in range(rounds):
        for runtime in seconds:
            cache = TeacherCache(teacher, data, last_layer=graph if runtime == "onnxruntime" else None)
            t0 = time.perf_counter()
            cache.ensure("train", last)
            seconds[runtime].append(time.perf_counter() - t0)
            states[runtime] = cache.batch("train", slice(None), last).hidden[teacher.dims.layers]
    real = data.train_mask.bool()
    max_abs = (states["torch"][real].float() - states["onnxruntime"][real].float()).abs().max().item()
    median = {k: statistics.median(v) for k, v in seconds.items()}
    return {"teacher": name, "rows": data.num_train, "rounds": rounds, "export_s": round(export_s, 2),
            "seconds": {k: [round(x, 3) for x in v] for k, v in seconds.items()},
            "ms_per_sentence": {k: round(1000 * v / data.num_train, 2) for k, v in median.items()},
            "onnxruntime_over_torch": round(median["onnxruntime"] / median["torch"], 3),
            "max_abs_fp16_states": round(max_abs, 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", default="minilm-l6,mpnet-base")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "teacher_pass.json")
    args = parser.parse_args()
    rows = [compare(name, args.rows, args.rounds) for name in args.teachers.split(",")]
    for row in rows:
        print(json.dumps(row))
    args.out.write_text(json.dumps({"what": __doc__.strip().splitlines()[0], "rows": rows,
                                    "environment": environment()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
