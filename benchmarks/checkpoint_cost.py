"""What a run's saves cost (distill.checkpoint): the demo's student, trained as the final run trains it,
saving its whole state every `--every` steps; each save timed where the run makes it, beside the mean
time of an update in the same run (a ratio, so a busy host moves both), and the size of a save.

    python benchmarks/checkpoint_cost.py --arch 3x12x384x1280 --steps 60 --every 10

Writes benchmarks/results/checkpoint_cost.json. At kdnas's default of a save every 1,000 steps the
share of a run's time spent saving is `save_s / (1000 * step_s)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402


def main() -> int:
    from _fidelity_setup import fidelity_setup
    from kdnas.distill import Checkpoints, DistillConfig, distill, parse_arch
    from kdnas.distill import trainer
    from kdnas.distill.checkpoint import SAVE_EVERY

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="3x12x384x1280")
    parser.add_argument("--train", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "checkpoint_cost.json")
    args = parser.parse_args()

    setup = fidelity_setup("minilm-l6", args.train)
    spec = parse_arch(args.arch, **setup.teacher.student_sizes())
    config = DistillConfig(method="embed", embed_terms="mse+cos+rel", lr=1e-3, steps=args.steps, progress=False)
    saves: list[float] = []
    real_save = trainer.save_state

    def timed_save(path, state) -> None:  # the real save, timed where the run makes it
        start = time.perf_counter()
        real_save(path, state)
        saves.append(time.perf_counter() - start)

    trainer.save_state = timed_save
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.pt"
        result = distill(spec, setup.teacher, setup.data, config, cache=setup.cache,
                         checkpoints=Checkpoints(path, args.every))
        size = path.stat().st_size
    step_s = (result.train_seconds - sum(saves)) / result.steps
    save_s = sum(saves) / len(saves)
    row = {"arch": args.arch, "steps": result.steps, "every": args.every, "precision": result.precision,
           "saves": len(saves), "save_s": round(save_s, 3), "save_s_each": [round(s, 3) for s in saves],
           "step_s": round(step_s, 4), "save_mb": round(size / 1e6, 1),
           "share_at_default": round(save_s / (SAVE_EVERY * step_s), 5), "default_every": SAVE_EVERY}
    print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": [{**row, "environment": environment()}]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
