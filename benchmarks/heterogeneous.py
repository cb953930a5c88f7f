"""Heterogeneous shapes against uniform ones at equal latency: per-layer FFN widths chosen by activation importance.

The search's students have one FFN width in every layer. CoFi and Minitron prune each layer to its own width:
the neurons that matter least, wherever they are, go first. For each `--configs` entry `LxF` (layers, mean FFN
width), the teacher's inherited student of L layers at full width (layers by the search's rule, `even`) is cut
to L·F FFN neurons in total two ways:

- **uniform**: F neurons in every layer, each layer's most important ones — exactly the search's `LxAxHxF`
  student (`distill.inherit_student`);
- **per layer**: one ranking of every neuron of every kept layer, each neuron's activation importance taken as a
  share of its own layer's total (as heads are ranked across layers that share one position bias), the L·F
  best kept, each layer's count rounded to a multiple of 64 (at least 64, at most the teacher's width).

Both are trained by the search's final recipe (`nas.recipe.final_config`: `embed`, its rate, batch and
steps, word embeddings frozen as an inherited student's are) on the same transfer set with the same teacher
targets, then scored by embedding fidelity ρ on the same held-out sentences and exported to the fused fp32
ONNX graph the trials time, each read side by side with the teacher (`latency.profile_pair`): equal totals
give equal FLOPs, and the reading says whether equal milliseconds too. Hidden size and heads stay the
teacher's, so every student is in the teacher's coordinates (no projection).

    python benchmarks/heterogeneous.py                      # MiniLM, 3x1536 (the demo's shape), 4x1024, 5x768
    python benchmarks/heterogeneous.py --configs 4x1024 --steps 600
Writes benchmarks/results/heterogeneous.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from _env import environment

STEP = 64  # per-layer widths in multiples of this: GEMM-friendly, the search's own FFN choices are too


def per_layer_widths(neurons: list[torch.Tensor], total: int, ceiling: int) -> list[int]:
    """FFN widths per layer summing to `total` (a multiple of STEP): every neuron ranked by its importance as a
    share of its layer's total, the `total` best kept, each layer's count rounded to STEP (largest remainders
    first), at least STEP and at most `ceiling` per layer."""
    shares = torch.cat([n / n.sum().clamp_min(1e-12) for n in neurons])
    owner = torch.cat([torch.full((n.numel(),), j) for j, n in enumerate(neurons)])
    kept = owner[torch.argsort(shares, descending=True)[:total]]
    raw = [float((kept == j).sum()) / STEP for j in range(len(neurons))]
    widths = [max(1, min(ceiling // STEP, int(r))) for r in raw]
    order = sorted(range(len(raw)), key=lambda j: -(raw[j] - int(raw[j])))
    while sum(widths) * STEP < total:  # hand the rounding's remainder to the largest fractions
        j = next(j for j in order if widths[j] < ceiling // STEP)
        widths[j] += 1
        order.remove(j)
        order.append(j)
    while sum(widths) * STEP > total:  # the floors of STEP took more than the ranking gave
        j = max((j for j in range(len(widths)) if widths[j] > 1), key=lambda j: widths[j] - raw[j])
        widths[j] -= 1
    return [w * STEP for w in widths]


@torch.no_grad()
def cut_ffn(student: nn.Module, importance: list[torch.Tensor], widths: list[int]) -> nn.Module:
    """`student`'s FFN of layer s cut to its `widths[s]` most important neurons (`importance[s]`, of the
    full-width FFN it inherited). BERT, RoBERTa and MPNet layers name their FFN `intermediate.dense` (in)
    and `output.dense` (out); nothing else in a layer depends on its FFN width."""
    for layer, scores, width in zip(student.encoder.layer, importance, widths):
        keep = torch.sort(torch.argsort(scores, descending=True)[:width]).values
        ffn_in, ffn_out = layer.intermediate.dense, layer.output.dense
        new_in, new_out = nn.Linear(ffn_in.in_features, width), nn.Linear(width, ffn_out.out_features)
        new_in.weight.copy_(ffn_in.weight[keep])
        new_in.bias.copy_(ffn_in.bias[keep])
        new_out.weight.copy_(ffn_out.weight[:, keep])
        new_out.bias.copy_(ffn_out.bias)
        layer.intermediate.dense, layer.output.dense = new_in, new_out
    return student


class Bench:
    """The teacher, its transfer set and targets, the held-out sentences and the final recipe, loaded once."""

    def __init__(self, teacher: str, steps: int, sentences: int) -> None:
        from kdnas.distill import TeacherCache, load_corpus, load_teacher
        from kdnas.distill.data import heldout_sentences
        from kdnas.evaluation import sentence_embeddings
        from kdnas.nas import SearchConfig
        from kdnas.nas.recipe import final_config, final_transfer_set

        self.cfg = SearchConfig.from_flags(teacher=teacher, final_steps=steps)
        self.teacher, texts = load_teacher(teacher), load_corpus(self.cfg.corpus)
        self.cache = TeacherCache(self.teacher, final_transfer_set(self.cfg, self.teacher, texts))
        self.importance = self.cache.importance()
        self.config = replace(final_config(self.cfg), freeze_embeddings=True)  # as an inherited student's are
        self.sentences = heldout_sentences(texts, sentences, seed=self.cfg.seed)
        self.reference = sentence_embeddings(self.teacher, self.sentences, max_len=self.cfg.latency.seq)

    def students(self, layers: int, ffn: int) -> dict[str, tuple[nn.Module, list[int]]]:
        """The uniform student of `layers` x `ffn` and, where `ffn` is below the teacher's, the per-layer one."""
        from kdnas.distill import StudentSpec, inherit_student

        d = self.teacher.dims
        spec = StudentSpec(layers=layers, heads=d.heads, hidden=d.hidden, ffn=ffn, **self.teacher.student_sizes())
        uniform, _ = inherit_student(self.teacher, spec, self.importance, self.cfg.layer_rule)
        out = {"uniform": (uniform, [ffn] * layers)}
        if ffn < d.ffn:
            full, chosen = inherit_student(self.teacher, replace(spec, ffn=d.ffn), self.importance, self.cfg.layer_rule)
            scores = [self.importance.neurons[j] for j in chosen.layers]
            widths = per_layer_widths(scores, layers * ffn, d.ffn)
            out["per layer"] = (cut_ffn(full, scores, widths), widths)
        return out

    def run(self, name: str, layers: int, student: nn.Module, widths: list[int], work: Path) -> dict:
        from kdnas.distill import StudentSpec
        from kdnas.distill import distill as run_distill
        from kdnas.evaluation import embedding_fidelity, sentence_embeddings
        from kdnas.export import export_onnx
        from kdnas.latency import profile_pair
        from kdnas.nas.baselines import PAIRS

        d = self.teacher.dims
        spec = StudentSpec(layers=layers, heads=d.heads, hidden=d.hidden, ffn=max(widths), **self.teacher.student_sizes())
        t0 = time.perf_counter()
        result = run_distill(spec, self.teacher, self.cache.data, self.config, cache=self.cache, student=student)
        trained = result.student.eval()
        emb = sentence_embeddings((trained, self.teacher.tokenizer), self.sentences, max_len=self.cfg.latency.seq)
        fidelity = embedding_fidelity(self.reference, emb, pairs=PAIRS, seed=self.cfg.seed)
        graph = work / f"{layers}-{name.replace(' ', '-')}.onnx"
        export_onnx(trained, graph, optimize=True)
        pair = profile_pair(str(graph), self.cfg.teacher, seq=self.cfg.latency.seq, threads=self.cfg.latency.threads)
        return {"variant": name, "layers": layers, "ffn_per_layer": widths, "ffn_total": sum(widths),
                "params": sum(p.numel() for p in trained.parameters()), "steps": result.steps,
                "spearman": round(fidelity["spearman"], 4), "spearman_se": round(fidelity.get("spearman_se", 0.0), 4),
                "mean_cosine": round(fidelity["mean_cosine"], 4), "of_teacher": round(pair.ratio, 4),
                "of_teacher_range": [round(pair.ratio_low, 4), round(pair.ratio_high, 4)],
                "ms": round(pair.target_ms, 3), "teacher_ms": round(pair.reference_ms, 3),
                "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--configs", default="3x1536,4x1024,5x768", help="LAYERSxMEAN_FFN, comma-separated")
    parser.add_argument("--steps", type=int, default=1200, help="the final recipe's steps (the search's default)")
    parser.add_argument("--sentences", type=int, default=1000, help="held-out sentences for fidelity")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "heterogeneous.json")
    args = parser.parse_args()
    bench, rows = Bench(args.teacher, args.steps, args.sentences), []
    with tempfile.TemporaryDirectory(prefix="kdnas-hetero-") as work:
        for item in args.configs.split(","):
            layers, ffn = (int(v) for v in item.split("x"))
            for name, (student, widths) in bench.students(layers, ffn).items():
                rows.append(bench.run(name, layers, student, widths, Path(work)))
                print(json.dumps(rows[-1]), flush=True)
    result = {"what": __doc__.strip().splitlines()[0], "teacher": args.teacher, "steps": args.steps,
              "recipe": {"method": bench.config.method, "lr": bench.config.lr, "batch_size": bench.config.batch_size,
                         "train_rows": bench.cache.data.num_train, "precision": bench.config.precision},
              "rows": rows, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
