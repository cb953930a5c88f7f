"""INT8 with the embedding tables quantized too, or kept fp32: file size, quality and speed side by side.

A small student's weights are mostly its embedding tables (3x12x384x1280: 11.7 M of 16.8 M parameters
are the word table), so an INT8 graph that quantizes only the MatMuls keeps most of the fp32 file.
For each model: its fused fp32 graph (`kdnas export`), quantized by `export.quantize_int8` both ways;
each INT8 graph's sentence embeddings beside the fp32 graph's on held-out news sentences (cosine
min / mean, and Spearman ρ of the pairwise cosines, as `kdnas evaluate` scores a student against
its teacher); and the two INT8 graphs timed in alternation in one pinned process (`latency.profile_pair`,
batch 1, 128 tokens, 2 threads), so their ratio holds on a busy host.

    python benchmarks/int8_embeddings.py minilm-l6 mpnet-base runs/demo/best

Writes benchmarks/results/int8_embeddings.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402

RECIPES = {"tables int8 (default)": {}, "tables fp32 (--int8-fp32-embeddings)": {"fp32_embeddings": True}}


def measure(model: str, texts: list[str], rounds: int) -> dict:
    import torch
    from transformers import AutoTokenizer

    from kdnas.evaluation.fidelity import embedding_fidelity
    from kdnas.export import export_model, int8_recipe, onnx_sentence_embeddings, quantize_int8
    from kdnas.latency import profile_pair

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "fp32"
        report = export_model(model, folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        reference = torch.from_numpy(onnx_sentence_embeddings(folder / "model.onnx", tokenizer, texts))
        rows, paths = {}, {}
        for name, options in RECIPES.items():
            paths[name] = Path(tmp) / f"{len(paths)}.onnx"
            quantize_int8(folder / "model.onnx", paths[name], **options)
            quantized = torch.from_numpy(onnx_sentence_embeddings(paths[name], tokenizer, texts))
            cos = torch.nn.functional.cosine_similarity(quantized, reference)
            fid = embedding_fidelity(reference, quantized)
            rows[name] = {"recipe": int8_recipe(**options), "bytes": paths[name].stat().st_size,
                          "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
                          "rho_vs_fp32": fid["spearman"], "rho_se": fid["spearman_se"]}
            print(f"{model} {name}: {rows[name]['bytes'] / 1e6:.1f} MB, cosine min {cos.min():.4f} "
                  f"mean {cos.mean():.4f}, ρ {fid['spearman']:.4f}", flush=True)
        new, old = paths.values()
        pair = profile_pair(new, old, rounds=rounds)
        print(f"{model}: {pair.summary()}", flush=True)
    return {"model": model, "arch": report.arch, "fused": report.attention_fused, "fp32_bytes": report.sizes["model.onnx"],
            "recipes": rows, "latency_ratio_tables_int8_over_fp32": pair.ratio,
            "latency_ratio_quartiles": [pair.ratio_low, pair.ratio_high],
            "latency_ms": {"tables int8": pair.target_ms, "tables fp32": pair.reference_ms}, "rounds": pair.rounds}


def main() -> int:
    from kdnas.distill.data import heldout_sentences, load_corpus

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["minilm-l6", "mpnet-base"],
                        help="bundled teachers or model folders (default: both bundled teachers)")
    parser.add_argument("--sentences", type=int, default=1000, help="held-out news sentences compared")
    parser.add_argument("--rounds", type=int, default=24, help="alternating latency rounds")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "int8_embeddings.json")
    args = parser.parse_args()
    texts = heldout_sentences(load_corpus("news"), args.sentences, seed=0)
    rows = [measure(model, texts, args.rounds) for model in args.models]
    result = {"benchmark": "int8_embeddings", "sentences": len(texts), "rows": rows, "environment": environment()}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
