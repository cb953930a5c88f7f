"""INT8 weight ranges on this CPU: what `kdnas export --int8` ships (7-bit weights) beside full-range 8-bit
weights and unsigned 8-bit weights, for each model: quality against the model's own fp32 graph, and speed.

Every model is exported as kdnas ships it (`export_model`: the fused fp32 `model.onnx`), then quantized
three ways from that graph, all dynamic and per-channel, embedding tables and fused attention int8:

- `int8 7-bit` (the default, onnxruntime's `reduce_range`): signed weights in [-64, 63];
- `int8 full range` (`--int8-full-range`): signed weights in [-128, 127] — on an x86 CPU without VNNI,
  onnxruntime's uint8 x int8 kernel adds pairs of products into int16 and saturates;
- `uint8` weights: another kernel, an alternative measured, not offered.

Quality on `--sentences` held-out news sentences (128 tokens at most): the mean and minimum cosine of each
INT8 graph's sentence embeddings to the fp32 graph's, and Spearman's ρ of their pairwise cosines to the
fp32 graph's (`evaluation.embedding_fidelity`, 4,000 pairs); with `--teacher`, each graph's ρ to that
teacher's embeddings as well (a student's fidelity, fp32 beside INT8). Speed: each INT8 graph timed in alternation
with the full-range one (`latency.profile_pair`, batch 1, 128 tokens, 2 threads), and the default against fp32.

    python benchmarks/int8_recipes.py [--models minilm-l6,mpnet-base,runs/demo/best --sentences 300]
                                      [--teacher mpnet-base]
Writes benchmarks/results/int8_recipes.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from _env import environment

RECIPES = ("int8 7-bit", "int8 full range", "uint8")


def quantize(recipe: str, src: Path, dst: Path) -> None:
    from kdnas.export import quantize_int8

    if recipe != "uint8":
        quantize_int8(src, dst, full_range=recipe == "int8 full range")
        return
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8, per_channel=True,
                     op_types_to_quantize=["MatMul", "Attention", "EmbedLayerNormalization", "Gather"],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def rho_to(reference, emb) -> float:
    """Spearman's ρ of `emb`'s pairwise cosines against `reference`'s (4,000 pairs, seed 0)."""
    import torch

    from kdnas.evaluation import embedding_fidelity

    return round(embedding_fidelity(torch.as_tensor(reference), torch.from_numpy(emb), pairs=4000, seed=0)["spearman"], 4)


def quality(fp32, emb, teacher=None) -> dict:
    import torch

    cos = torch.nn.functional.cosine_similarity(torch.from_numpy(fp32), torch.from_numpy(emb))
    out = {"mean_cosine": round(float(cos.mean()), 4), "min_cosine": round(float(cos.min()), 4),
           "rho_vs_fp32": rho_to(fp32, emb)}
    if teacher is not None:
        out["rho_vs_teacher"] = rho_to(teacher, emb)
    return out


def measure(model: str, sentences: list[str], work: Path, teacher=None) -> dict:
    from transformers import AutoTokenizer

    from kdnas.export import export_model, onnx_sentence_embeddings
    from kdnas.latency import profile_pair

    folder = work / "fp32"
    report = export_model(model, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    fp32_graph = folder / "model.onnx"
    fp32 = onnx_sentence_embeddings(fp32_graph, tokenizer, sentences, max_len=128)
    row = {"model": model, "arch": report.arch, "model_type": report.model_type, "fused": report.attention_fused,
           "recipes": {}}
    if teacher is not None:
        row["fp32_rho_vs_teacher"] = rho_to(teacher, fp32)
    graphs = {r: work / f"{r.replace(' ', '_')}.onnx" for r in RECIPES}
    for recipe, graph in graphs.items():
        quantize(recipe, fp32_graph, graph)
        emb = onnx_sentence_embeddings(graph, tokenizer, sentences, max_len=128)
        row["recipes"][recipe] = quality(fp32, emb, teacher)
        row["recipes"][recipe]["mb"] = round(graph.stat().st_size / 1e6, 1)
    for recipe in ("int8 7-bit", "uint8"):
        pair = profile_pair(graphs[recipe], graphs["int8 full range"], batch=1, seq=128, threads=2)
        row["recipes"][recipe].update(ms=round(pair.target.median_ms, 3), vs_full_range=round(pair.ratio, 3),
                                      vs_full_range_range=[round(pair.ratio_low, 3), round(pair.ratio_high, 3)])
        row["recipes"]["int8 full range"]["ms"] = round(pair.reference.median_ms, 3)
    pair = profile_pair(graphs["int8 7-bit"], fp32_graph, batch=1, seq=128, threads=2)
    row["default_vs_fp32"] = {"ratio": round(pair.ratio, 3), "fp32_ms": round(pair.reference.median_ms, 3),
                              "int8_ms": round(pair.target.median_ms, 3)}
    return row


def main() -> None:
    from kdnas.distill.data import heldout_sentences, load_corpus

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm-l6,mpnet-base")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--teacher", default=None, help="also score each graph's fidelity to this teacher")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "int8_recipes.json")
    args = parser.parse_args()
    t0 = time.time()
    sentences = heldout_sentences(load_corpus("news"), args.sentences, seed=0)
    teacher = None
    if args.teacher:
        from kdnas.distill import load_teacher
        from kdnas.evaluation import sentence_embeddings

        teacher = sentence_embeddings(load_teacher(args.teacher), sentences, max_len=128)
    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(model, sentences, Path(tmp), teacher))
        print(json.dumps(rows[-1]), flush=True)
    result = {"what": __doc__.strip().splitlines()[0], "sentences": len(sentences), "teacher": args.teacher, "rows": rows,
              "seconds": round(time.time() - t0, 1), "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
