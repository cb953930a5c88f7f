"""A base-size teacher: `kdnas search --teacher mpnet-base` at several budgets, and what each shipped student is worth.

For each budget, one `kdnas search` as a user runs it (`--timeout` the time limit of the whole command, the
bundled news corpus, every other setting the default), then every shipped student measured beside the
teacher, both of its untrained baselines (the teacher's first k layers in its own class; the student's
inherited start) and **all-MiniLM-L6-v2 as it comes** — the model a user has for free — by
`benchmarks/student_quality.py` (embedding fidelity to the teacher on held-out sentences, linear probes full
and 16-shot on `--tasks`: sentiment and topic by default, since the tweets probe encodes 33,000 tweets with
MPNet, more than half an hour on two cores). Latency is the search's own: the shipped graph timed side by side
with the teacher (and its INT8 graph right after), all-MiniLM-L6-v2 timed side by side with the teacher
before the searches; the summary adds the shipped INT8 graph's fidelity beside the fp32 one. A rerun of the
same command resumes each finished search at once (its study is done) and measures again. Budgets: a ratio of the teacher's latency (`0.5`, `0.25`), or `minilm` — the
latency of all-MiniLM-L6-v2 relative to the teacher, measured side by side before the searches (both fused
fp32 graphs, batch 1, 128 tokens, 2 threads), given to the search as that ratio. Budgets joined by `+`
(`0.5+0.25`) are one search of several budgets (`--budget-ratio 0.5,0.25`), a student shipped for each.

The teacher's targets are a one-time cost per corpus, kept apart from the searches' time: before them,
`--targets ROWS` has MPNet label the first ROWS sentences of the searches' own transfer set (their seed,
held-out rows and row length) in `$KDNAS_CACHE/targets`, timed; each search's final run then takes the
sentences whose targets are on disk, up to one pass of its steps (`nas.final`), and no search waits on MPNet.

    python benchmarks/base_teacher.py --budgets minilm,0.5+0.25 --timeout 3600 --targets 76800
Writes benchmarks/results/base_teacher.json (the searches under --work).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _env import kdnas, ratio_list, write_result

TEACHER = "mpnet-base"
FREE = "minilm-l6"  # all-MiniLM-L6-v2 as it comes


def minilm_ratio() -> dict:
    from kdnas.latency import profile_pair

    pair = profile_pair(FREE, TEACHER, seq=128, threads=2)
    return {"ratio": round(pair.ratio, 4), "ratio_low": round(pair.ratio_low, 4), "ratio_high": round(pair.ratio_high, 4),
            "minilm_ms": round(pair.target_ms, 3), "teacher_ms": round(pair.reference_ms, 3)}


def precompute_targets(rows: int) -> dict:
    """MPNet's targets of the first `rows` sentences of a default search's transfer set, and the seconds
    they took (nothing to do where a longer set's are on disk already)."""
    from kdnas.distill import Needs, TeacherCache, load_corpus, load_teacher, targets_dir
    from kdnas.export import LastLayerGraph
    from kdnas.nas import SearchConfig
    from kdnas.nas.recipe import final_transfer_set

    cfg = SearchConfig.from_flags(teacher=TEACHER)
    teacher = load_teacher(TEACHER)
    data = final_transfer_set(cfg, teacher, load_corpus(cfg.corpus), rows)
    cache = TeacherCache(teacher, data, directory=targets_dir(), last_layer=LastLayerGraph(teacher.model))
    t0 = time.time()
    for split in ("train", "eval"):
        cache.ensure(split, Needs(hidden=frozenset({teacher.dims.layers})))
    labelled = data.num_train + data.eval_ids.shape[0]  # and the held-out rows, where their pass ran too
    return {"rows": data.num_train, "held_out_rows": data.eval_ids.shape[0], "seconds": round(time.time() - t0, 1),
            "teacher_passes": cache.teacher_passes,
            "seconds_per_sentence": round(cache.pass_seconds / labelled, 4) if cache.teacher_passes == 2 else None}


def run_search(name: str, ratios: list[float], timeout: int, work: Path, extra: list[str]) -> dict:
    """One `kdnas search` of one budget, or of several (`0.5+0.25`: one study, a student shipped per budget)."""
    out = work / f"search-{name}"
    command = ["kdnas", "search", "--teacher", TEACHER, "--corpus", "news",
               "--budget-ratio", ",".join(f"{r:.4f}" for r in ratios),
               "--timeout", str(timeout), "--out", str(out), "--no-progress", *extra]
    print(" ".join(command), flush=True)
    t0 = time.time()
    done = subprocess.run(kdnas(command), check=False)
    seconds = round(time.time() - t0, 1)
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    folders = [row["folder"] for row in summary.get("budgets") or []] or ["best"]
    return {"budget": name, "ratio": ratios[0] if len(ratios) == 1 else ratios, "command": " ".join(command),
            "exit": done.returncode, "seconds": seconds, "summary": summary,
            "best": [str(out / f) for f in folders] if len(ratios) > 1 else str(out / "best")}


def budget_sets(text: str) -> list[str]:
    """An argparse type: `--budgets`, checked before any work (a typo is one line, not a traceback an hour in)."""
    parts = [part for name in text.split(",") for part in name.split("+") if part != "minilm"]
    try:
        ratio_list(",".join(parts or ["0.5"]))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: searches, comma-separated; each a ratio of the teacher's latency "
                                         "in (0, 1], `minilm`, or ratios joined by + (0.5+0.25)") from None
    return text.split(",")


def _shipped(runs: list[dict]) -> list[str]:
    folders = [f for r in runs for f in (r["best"] if isinstance(r["best"], list) else [r["best"]])]
    return [f for f in folders if Path(f, "distill.json").is_file()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=budget_sets, default="minilm,0.5,0.25",
                        help="searches, comma-separated; each a ratio, `minilm`, or ratios joined by +")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--work", type=Path, default=Path("runs/base-teacher"))
    parser.add_argument("--search-args", default="", help="more `kdnas search` flags, e.g. \"--trials 30\"")
    parser.add_argument("--targets", type=int, default=0, metavar="ROWS",
                        help="first compute the teacher's targets of this many transfer sentences, timed (0: none)")
    parser.add_argument("--tasks", nargs="+", default=["sentiment", "topic"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "base_teacher.json")
    args = parser.parse_args()
    names = args.budgets  # each a search; `0.5+0.25` one search of both
    result: dict = {"what": __doc__.strip().splitlines()[0], "teacher": TEACHER, "timeout": args.timeout}
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if args.targets:
        result["targets"] = precompute_targets(args.targets)
        write_result(args.out, result)
    # A rerun keeps the ratio its searches were started with
    if any("minilm" in name.split("+") for name in names) or "minilm_beside_teacher" in previous:
        result["minilm_beside_teacher"] = previous.get("minilm_beside_teacher") or minilm_ratio()
    # A run of some budgets keeps the searches of the others from an earlier run (one session need not hold all)
    runs = [r for r in previous.get("searches", []) if r["budget"] not in names]
    if "targets" in previous and "targets" not in result:
        result["targets"] = previous["targets"]
    for name in names:
        ratios = [result["minilm_beside_teacher"]["ratio"] if part == "minilm" else float(part) for part in name.split("+")]
        runs.append(run_search(name, ratios, args.timeout, args.work, args.search_args.split()))
        result["searches"] = runs
        write_result(args.out, result)
    shipped = _shipped(runs)
    if shipped:
        quality = args.work / "student_quality.json"
        subprocess.run([sys.executable, str(Path(__file__).parent / "student_quality.py"), *shipped, "--teacher", TEACHER,
                        "--also", FREE, "--work", str(args.work / "baselines"), "--out", str(quality), "--no-latency",
                        "--tasks", *args.tasks], check=False)
        if quality.is_file():
            result["quality"] = json.loads(quality.read_text())
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
