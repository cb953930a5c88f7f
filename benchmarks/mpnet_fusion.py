"""What an MPNet student's unfused attention costs on the CPU runtime: the same shape as MPNet and as BERT.

onnxruntime's transformer optimizer fuses a BERT layer's attention into one `Attention` node; it has no
pattern for MPNet's attention, whose scores add the relative position bias, so an MPNet graph keeps its
attention as MatMul / Softmax / Add nodes (LayerNorm, GELU and the embeddings' LayerNorm still fuse).
For each shape, random weights: the fused op counts of both exports, and the MPNet graph's latency
relative to the BERT graph's, the two timed in alternation in one pinned process (latency.profile_pair,
batch 1, 128 tokens, 2 threads) — the ratio a budget on this runtime sees.

    python benchmarks/mpnet_fusion.py
Writes benchmarks/results/mpnet_fusion.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


from _env import environment  # noqa: E402

SHAPES = ("12x12x768x3072", "6x12x768x3072", "4x12x768x3072", "3x12x384x1536")


def specs(arch: str):
    """The shape as an MPNet (mpnet-base's vocabulary, positions and pad id) and as a BERT (the same sizes)."""
    from kdnas.core.spec import parse_arch

    sizes = {"vocab_size": 30527, "max_position": 512}
    return (parse_arch(arch, **sizes, type_vocab_size=1, pad_token_id=1, family="mpnet"),
            parse_arch(arch, **sizes, type_vocab_size=2, pad_token_id=0, family="bert"))


def fused_ops(spec) -> dict[str, int]:
    from kdnas.core.spec import build_student
    from kdnas.export import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        return export_onnx(build_student(spec, seed=0).eval(), Path(tmp) / "model.onnx").fused


def main() -> None:
    from kdnas.latency import profile_pair

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mpnet_fusion.json")
    args = parser.parse_args()
    t0 = time.time()
    rows = []
    for arch in args.shapes.split(","):
        mpnet, bert = specs(arch)
        pair = profile_pair(mpnet, bert, seq=128, threads=2)
        row = {"arch": arch, "mpnet_ms": pair.target_ms, "bert_ms": pair.reference_ms, "ratio": pair.ratio,
               "ratio_low": pair.ratio_low, "ratio_high": pair.ratio_high,
               "mpnet_fused": fused_ops(mpnet), "bert_fused": fused_ops(bert)}
        rows.append(row)
        print(f"| {arch} | {row['mpnet_ms']:.2f} | {row['bert_ms']:.2f} | {row['ratio']:.3f} "
              f"({row['ratio_low']:.3f}-{row['ratio_high']:.3f}) |", flush=True)
    result = {"what": __doc__.strip().splitlines()[0], "runtime": "onnxruntime (fused fp32 graph)", "batch": 1,
              "seq": 128, "threads": 2, "rows": rows, "seconds": round(time.time() - t0, 1),
              "command": "python " + " ".join(sys.argv), "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
