"""After the search: distill the winner(s) longer, export with checks, profile, write out.

The winner is the feasible trial with the best reward (for the Pareto objective: the front
member with the best KD-NAS reward). It is trained from scratch for `final_steps` on a transfer
set of `final_train` sequences with the proxy's held-out rows (so the losses compare), exported
(ONNX + fused + INT8, parity-checked by `export`), and profiled with the same latency settings as
the search. Results are kept in the study (`final`), so a rerun of a
finished search does not redo them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import optuna

from distill import StudentSpec
from distill import distill as run_distill

from ._io import atomic_write_text
from .measure import latency_record, measure
from .records import pareto_front, trial_rows


def finalists(study: optuna.Study, objective: str, k: int) -> list[dict[str, Any]]:
    rows = trial_rows(study)
    pool = pareto_front(rows) if objective == "pareto" else [
        r for r in rows if r["status"] == "feasible" and r["reward"] is not None]
    return sorted(pool, key=lambda r: -r["reward"])[:k]


def final_dir(out: Path, rank: int, arch: str) -> Path:
    return out / "best" if rank == 1 else out / "finalists" / f"{rank}-{arch}"


def is_done(study: optuna.Study, out: Path, chosen: list[dict[str, Any]], steps: int, train: int) -> bool:
    done = study.user_attrs.get("final") or []
    want = [(r["number"], steps, train, str(final_dir(out, i, r["arch"]))) for i, r in enumerate(chosen, 1)]
    have = [(f["trial"], f["steps"], f.get("train"), f["dir"]) for f in done]
    return have == want and all((Path(d) / "export.json").is_file() for *_, d in want)


def run_final(study: optuna.Study, ctx: Any, out: Path, chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from distill import TeacherCache, make_transfer_set
    from export import export_model

    cfg = ctx.config
    ctx.progress.phase(f"final: transfer set of {cfg.final_train} sequences, teacher targets")
    data = make_transfer_set(ctx.teacher.tokenizer, ctx.texts, seq_len=cfg.seq_len, num_train=cfg.final_train,
                             num_eval=cfg.proxy_eval, seed=cfg.seed)
    cache = TeacherCache(ctx.teacher, data)
    results = []
    for rank, row in enumerate(chosen, 1):
        dest = final_dir(out, rank, row["arch"])
        spec = StudentSpec(layers=row["layers"], heads=row["heads"], hidden=row["hidden"], ffn=row["ffn"], **ctx.sizes)
        ctx.progress.phase(f"final {rank}/{len(chosen)} {spec.arch}: distill {cfg.final_steps} steps")
        t0 = time.perf_counter()
        res = run_distill(spec, ctx.teacher, data,
                          ctx.distill_config(cfg.final_steps, eval_every=max(1, cfg.final_steps // 5)), cache=cache)
        t1 = time.perf_counter()
        ctx.progress.phase(f"final {rank}/{len(chosen)} {spec.arch}: export")
        student = res.student.eval()
        # export_model writes the folder (ONNX, INT8, tokenizer, config, export.json) atomically and
        # refuses to replace anything but an earlier export; the weights then complete the HF folder.
        report = export_model(student, dest, int8=True, tokenizer=ctx.teacher.tokenizer)
        student.save_pretrained(dest)
        atomic_write_text(dest / "distill.json",
                          json.dumps({**res.summary(), "search_trial": row["number"],
                                     "transfer_set": {"train": int(data.train_ids.shape[0]),
                                                      "eval": int(data.eval_ids.shape[0]), "seq_len": data.seq_len}},
                                    indent=2, default=str) + "\n")
        t2 = time.perf_counter()
        ctx.progress.phase(f"final {rank}/{len(chosen)} {spec.arch}: latency")
        latency = latency_record(measure(dest, cfg))
        int8_latency = latency_record(measure(dest / "model.int8.onnx", cfg))
        t3 = time.perf_counter()
        loss = float(res.metrics["l_hs_norm"])
        entry = {
            "rank": rank, "trial": row["number"], "arch": spec.arch, "dir": str(dest), "steps": cfg.final_steps,
            "train": cfg.final_train, "train_rows": int(data.train_ids.shape[0]),
            "params": spec.num_parameters(), "l_hs_norm": loss, "l_hs_raw": float(res.metrics["l_hs_raw"]),
            "latency_ms": latency["median_ms"], "latency": latency, "latency_int8_onnx": int8_latency, "reward": ctx.reward(loss, latency["median_ms"]),
            "within_budget": latency["median_ms"] <= ctx.budget_ms, "proxy_reward": row["reward"],
            "export": _jsonable(report.to_dict()),
            "seconds": {"distill": round(t1 - t0, 3), "export": round(t2 - t1, 3), "latency": round(t3 - t2, 3)},
        }
        atomic_write_text(dest / "search.json", json.dumps(entry, indent=2, default=str) + "\n")
        results.append(entry)
    study.set_user_attr("final", json.loads(json.dumps(results, default=str)))
    return results


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
