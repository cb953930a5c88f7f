"""Fused AdamW vs the per-tensor loop, in the training loop every kdnas trainer runs.

`distill.loop.train_steps` with the student of the demo's shape, bf16 autocast where the CPU has
it (as `kdnas search` trains), batches of 32 sentences of 40 tokens and an MSE loss on the pooled
output: the same forward, backward, clipping and schedule, only `Optimization.fused` differs. The
two modes alternate in rounds so machine noise hits both alike; reported are the median seconds
per step, the optimizer step alone, and how far the two runs' weights drift apart from one start.

    python benchmarks/fused_adamw.py                               # 3x12x384x1024, word embeddings frozen
    python benchmarks/fused_adamw.py --arch 6x12x384x1536 --train-embeddings   # fine-tuning's set
Writes benchmarks/results/fused_adamw.json (runs appended) and prints the table row.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import BertModel  # noqa: E402

from _env import environment  # noqa: E402
from kdnas.core.spec import parse_arch  # noqa: E402
from kdnas.distill.loop import Optimization, adamw, resolve_precision, train_steps  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="3x12x384x1024")
    parser.add_argument("--train-embeddings", action="store_true", help="train the word embeddings too (fine-tuning)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fused_adamw.json")
    args = parser.parse_args()

    device = torch.device("cpu")
    precision = resolve_precision(args.precision, device)
    config = parse_arch(args.arch).to_config()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # as kdnas distills (dropout off)
    torch.manual_seed(0)
    start = BertModel(config).train()
    start.get_input_embeddings().requires_grad_(args.train_embeddings)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randint(1000, 30000, (32, 40), generator=generator), torch.randn(32, start.config.hidden_size,
                generator=generator)) for _ in range(8)]
    timing: dict[str, list[float]] = {"loop": [], "fused": []}
    final = {}
    for _ in range(args.rounds):
        for mode in ("loop", "fused"):
            student = copy.deepcopy(start)
            params = [p for p in student.parameters() if p.requires_grad]
            optim = Optimization(lr=3e-4, steps=args.steps, warmup_steps=2, weight_decay=0.01, fused=mode == "fused")

            def loss_of(batch):
                ids, target = batch
                return torch.nn.functional.mse_loss(student(input_ids=ids).last_hidden_state.mean(1).float(), target)

            began = time.perf_counter()
            for _step, loss in train_steps(params, (batches[i % len(batches)] for i in range(args.steps)), loss_of,
                                           optim, device, precision):
                pass
            timing[mode].append((time.perf_counter() - began) / args.steps)
            final[mode] = torch.cat([p.detach().flatten() for p in params])
    trainable = sum(p.numel() for p in start.parameters() if p.requires_grad)
    row = {"arch": args.arch, "trainable_parameters": trainable, "precision": precision, "steps": args.steps,
           "rounds": args.rounds,
           "seconds_per_step": {m: round(statistics.median(v), 4) for m, v in timing.items()},
           "step_ratio_fused_over_loop": round(statistics.median(timing["fused"]) / statistics.median(timing["loop"]), 3),
           "optimizer_ms": optimizer_ms(start, args.rounds),
           "max_abs_weight_difference": float((final["fused"] - final["loop"]).abs().max()),
           "environment": environment()}
    print(json.dumps(row))
    previous = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": previous + [row]}, indent=2) + "\n")
    return 0


def optimizer_ms(model: torch.nn.Module, rounds: int, steps: int = 20) -> dict[str, float]:
    """The optimizer step alone on `model`'s trainable parameters, median ms per step per mode."""
    params = [p for p in copy.deepcopy(model).parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    times: dict[str, list[float]] = {"loop": [], "fused": []}
    for _ in range(rounds):
        for mode in times:
            optimizer, _ = adamw(params, Optimization(lr=1e-4, steps=steps, warmup_steps=0, weight_decay=0.01,
                                                      fused=mode == "fused"))
            optimizer.step()  # state allocated outside the timing
            began = time.perf_counter()
            for _ in range(steps):
                optimizer.step()
            times[mode].append(1000 * (time.perf_counter() - began) / steps)
    return {m: round(statistics.median(v), 2) for m, v in times.items()}


if __name__ == "__main__":
    sys.exit(main())
