"""What does the study storage itself cost per trial, and where does each storage stop scaling?

N worker processes (1, 4, 16) share one fresh study on each storage (SQLite file, journal file,
PostgreSQL on this host) and run trials that do no training: each one is what `kdnas search` does
around a trial — `study.optimize(n_trials=1)` with Optuna's heartbeat where the storage has one,
proposing a shape of the default space and writing the user attributes a kdnas trial writes, then
the recovery pass and the trial count that every loop of `nas.search` makes (`nas.resume`). The
storages are opened by `nas.storage.open_storage`, exactly as the search opens them.

Reported per (storage, workers): median and p90 seconds of one such trial as a worker sees it, and
the trials per second of all workers together. On a 2-core machine 16 workers mostly measure the
CPU; read the table as ratios between storages, side by side, not as promises.

    python benchmarks/storage_scaling.py            # --workers 1 4 16 --trials 20
Writes benchmarks/results/storage_scaling.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path


from _env import environment  # noqa: E402

STALE_AFTER_S = 1800.0  # the search's default


def _objective(trial) -> float:
    """A kdnas trial without the work: the same parameters and user attributes, no training."""
    arch = "x".join(str(trial.suggest_categorical(name, choices)) for name, choices in
                    (("layers", [1, 2, 3, 4, 5, 6]), ("heads", [3, 6, 9, 12]), ("hidden", [96, 192, 288, 384]),
                     ("ffn", [256, 512, 768, 1024, 1536])))
    attrs = {"worker": {"host": "h", "pid": 1, "started": 0.0}, "phase": "distill", "alive_at": time.time(),
             "arch": arch, "params": 1_000_000, "flops": 1e9,
             "latency": {"median_ms": 5.0, "p90_ms": 5.5, "min_ms": 4.9, "cv": 0.02, "noisy": False, "cached": False,
                         "cores": [0, 1], "window": [0.0, 1.0]},
             "last_eval": {"step": 60, "l_hs_norm": 0.5, "l_hs_raw": 0.1, "l_hs_se": 0.003},
             "l_hs_norm": 0.5, "l_hs_raw": 0.1, "l_hs_se": 0.003, "train_loss": 0.2, "reward": 0.6,
             "status": "feasible", "seconds": {"latency": 0.0, "distill": 0.0, "total": 0.0}}
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    return 0.6


def _worker(url: str, trials: int, start_at: float, queue) -> None:
    import optuna

    from kdnas.nas.resume import counted_trials, recover
    from kdnas.nas.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="scaling", storage=open_storage(url),
                              sampler=optuna.samplers.RandomSampler())
    time.sleep(max(0.0, start_at - time.time()))  # all workers begin together
    seconds, began = [], time.time()
    for _ in range(trials):
        t0 = time.perf_counter()
        study.optimize(_objective, n_trials=1)
        recover(study, STALE_AFTER_S)
        counted_trials(study)
        seconds.append(time.perf_counter() - t0)
    queue.put({"seconds": seconds, "span": [began, time.time()]})


def run(url: str, workers: int, trials: int) -> dict:
    import optuna

    from kdnas.nas.storage import open_storage

    optuna.create_study(storage=open_storage(url), study_name="scaling", direction="maximize")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.time() + 5.0 + 0.5 * workers  # time for every process to import and connect
    procs = [context.Process(target=_worker, args=(url, trials, start_at, queue)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join()
    # from the first trial's start to the last one's end: process start-up and exit are not the storage's
    wall = max(r["span"][1] for r in results) - min(r["span"][0] for r in results)
    per_trial = sorted(s for r in results for s in r["seconds"])
    return {"workers": workers, "trials": len(per_trial), "median_s": statistics.median(per_trial),
            "p90_s": per_trial[int(0.9 * (len(per_trial) - 1))], "trials_per_s": len(per_trial) / wall,
            "wall_s": wall}


def file_storages(root: Path):
    """(name, a fresh URL per call) for the two storages that live in a file."""
    counter = iter(range(10**6))
    yield "sqlite", lambda: f"sqlite:///{root / f'study{next(counter)}.db'}"
    yield "journal", lambda: f"journal:{root / f'study{next(counter)}.log'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--trials", type=int, default=20, help="trials per worker")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "storage_scaling.json")
    args = parser.parse_args()
    from _env import tests_module

    pgserver = tests_module("pgserver")  # the tests' real PostgreSQL server
    server_binaries, temporary_server = pgserver.server_binaries, pgserver.temporary_server

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, fresh in file_storages(root):
            for n in args.workers:
                rows.append({"storage": name, **run(fresh(), n, args.trials)})
                print(_line(rows[-1]), flush=True)
        if server_binaries() is None:
            print("PostgreSQL's server programs are missing (bash dev.sh setup installs them): no postgresql rows",
                  file=sys.stderr)
        for n in args.workers if server_binaries() is not None else []:
            with temporary_server() as url:  # a fresh server per run: no study left from the last
                rows.append({"storage": "postgresql", **run(url, n, args.trials)})
                print(_line(rows[-1]), flush=True)
    report = {"rows": rows, "trials_per_worker": args.trials, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    return 0


def _line(row: dict) -> str:
    return (f"{row['storage']:10s} {row['workers']:2d} workers: median {1000 * row['median_s']:.0f} ms/trial, "
            f"p90 {1000 * row['p90_s']:.0f} ms, {row['trials_per_s']:.1f} trials/s")


def table(rows: list[dict]) -> str:
    lines = ["| storage | workers | median ms / trial | p90 ms / trial | trials / s (all workers) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['storage']} | {r['workers']} | {1000 * r['median_s']:.0f} | {1000 * r['p90_s']:.0f} | "
                     f"{r['trials_per_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
