"""How far a student's own training step is from a GPU's peak: eager vs SDPA attention vs torch.compile.

The student alone (no teacher, no loss engine): bf16 autocast forward of a BertModel built from the
spec, an fp32 MSE against a fixed random target, backward, fused AdamW. It bounds what the loss
engine could reach on the same GPU, and says which attention kernel and compile are worth wiring in.
kdnas trains with eager attention today, because the exported graph needs it; training could use
SDPA and export an eager copy of the same weights.

    python benchmarks/student_step_mfu.py --modes eager,sdpa,sdpa-compile     # on a CUDA machine
Writes benchmarks/results/student_step_mfu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path


import torch  # noqa: E402

from _mfu import known_peak_tflops, mfu  # noqa: E402
from kdnas.core.spec import parse_arch  # noqa: E402

MODES = ("eager", "sdpa", "sdpa-compile")


def measure(spec, mode: str, batch: int, seq: int, steps: int, device: str, peak: float | None) -> dict:
    from transformers import BertModel

    config = spec.to_config()
    config._attn_implementation = "eager" if mode == "eager" else "sdpa"
    model = BertModel(config, add_pooling_layer=False).to(device)
    forward = torch.compile(model) if mode.endswith("compile") else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    ids = torch.randint(1000, 30000, (batch, seq), device=device)
    mask = torch.ones_like(ids)
    target = torch.randn(batch, seq, spec.hidden, device=device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            hidden = forward(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.nn.functional.mse_loss(hidden.float(), target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warmup = timed(3)  # compile happens here
    seconds = timed(steps) / steps
    tokens_per_s = batch * seq / seconds
    return {"mode": mode, "batch": batch, "seq": seq, "step_ms": round(seconds * 1e3, 2),
            "tokens_per_s": round(tokens_per_s), "mfu": round(mfu(tokens_per_s, spec, seq, peak), 4) if peak else None,
            "warmup_s": round(warmup, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="6x12x384x1536")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-sizes", default="256,1024")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "student_step_mfu.json"))
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := [m for m in modes if m not in MODES]:
        parser.exit(2, f"--modes {','.join(unknown)}: not a mode; allowed: {', '.join(MODES)}\n")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peak = known_peak_tflops(torch.cuda.get_device_name()) if device == "cuda" else None
    spec = parse_arch(args.arch, vocab_size=30522, max_position=512, type_vocab_size=2, pad_token_id=0)
    rows = []
    for mode in modes:
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            rows.append(measure(spec, mode, batch, args.seq_len, args.steps, device, peak))
            print(json.dumps(rows[-1]), flush=True)
    report = {"benchmark": "student_step_mfu", "arch": args.arch, "precision": "bf16 autocast",
              "peak_tflops": peak, "rows": rows,
              "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
              "versions": {"torch": torch.__version__, "python": platform.python_version()},
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
