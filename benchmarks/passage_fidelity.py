"""Does the student hold up on passages, not only the sentences it was distilled on?

The final run trains on single sentences of at most 64 tokens, and embedding fidelity is scored on
held-out sentences (6-60 words). Users of a sentence-embedding model also embed passages, the
latency budget is stated at 128 tokens, and the shipped `best/` accepts the teacher's 256. This
scores fidelity (`evaluation.fidelity`: Spearman's rho of pairwise cosines against the teacher, and
mean cosine) on held-out *passages* — runs of consecutive sentences of 60-200 words from documents
no transfer set contains, several per document — truncated at 128 and at 256 tokens, beside the
held-out sentences, for the student(s) and the two untrained baselines of `student_quality.py`.

    python benchmarks/passage_fidelity.py runs/demo/best
Writes benchmarks/results/passage_fidelity.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402
from student_quality import build_baselines, refuse_non_students  # noqa: E402

MIN_WORDS, MAX_WORDS = 60, 200
PER_DOCUMENT = 5


def heldout_passages(texts: list[str], n: int = 1000, *, seed: int = 0) -> list[str]:
    """Up to `n` passages of the held-out documents (`distill.data.is_heldout`): each a run of whole
    consecutive sentences of MIN_WORDS..MAX_WORDS words (a length drawn per passage), at most
    PER_DOCUMENT non-overlapping ones per document, a seeded sample."""
    from kdnas.distill.data import is_heldout, split_sentences

    rng = random.Random(f"kdnas-passages:{seed}")
    passages: list[str] = []
    for doc in texts:
        if not is_heldout(doc):
            continue
        sentences, i, taken = split_sentences(doc), 0, 0
        while i < len(sentences) and taken < PER_DOCUMENT:
            target, words = rng.randint(MIN_WORDS, MAX_WORDS), []
            while i < len(sentences) and len(words) + len(sentences[i].split()) <= MAX_WORDS:
                words += sentences[i].split()
                i += 1
                if len(words) >= target:
                    break
            if len(words) >= MIN_WORDS:
                passages.append(" ".join(words))
                taken += 1
            elif not words:
                i += 1  # a single sentence longer than MAX_WORDS: skip it
    rng.shuffle(passages)
    return passages[:n]


def main() -> int:
    from kdnas.distill import load_corpus
    from kdnas.distill.data import heldout_sentences
    from kdnas.evaluation.fidelity import fidelity_scores
    from kdnas.evaluation.models import encode, resolve_model
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("students", nargs="+", type=Path, help="student folders; the first one's baselines are built")
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--corpus", default="news")
    parser.add_argument("--work", type=Path, default=Path("runs/student-quality"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "passage_fidelity.json")
    args = parser.parse_args()
    refuse_non_students(args.students)

    texts = load_corpus(args.corpus)
    teacher = resolve_model(args.teacher)
    tokenizer = AutoTokenizer.from_pretrained(teacher.path)
    passages = heldout_passages(texts)
    sets = {"sentences": (heldout_sentences(texts, 1000), 128), "passages, 128 tokens": (passages, 128),
            "passages, 256 tokens": (passages, 256)}
    lengths = {name: sum(len(r) for r in encode(tokenizer, t, ml)) / len(t) for name, (t, ml) in sets.items()}
    baselines = build_baselines(args.students[0], args.teacher, args.corpus, args.work)
    rows = []
    for folder in [*map(str, args.students), *map(str, baselines.values())]:
        model = resolve_model(folder)
        scores = {name: fidelity_scores(teacher, model, t, max_len=ml) for name, (t, ml) in sets.items()}
        rows.append({"model": folder, "fidelity": scores})
        print(folder, {k: round(v["spearman"], 3) for k, v in scores.items()}, file=sys.stderr, flush=True)
    report = {"sets": {name: {"texts": len(t), "max_len": ml, "mean_tokens": lengths[name]}
                       for name, (t, ml) in sets.items()},
              "models": rows, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def table(report: dict) -> str:
    sets = list(report["sets"])
    head = ["model"] + [f"{s} ({report['sets'][s]['texts']}, {report['sets'][s]['mean_tokens']:.0f} tokens): ρ / cos"
                        for s in sets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["models"]:
        cells = [row["model"]] + [f"{row['fidelity'][s]['spearman']:.3f} ± {row['fidelity'][s]['spearman_se']:.3f} / "
                                  f"{row['fidelity'][s]['mean_cosine']:.3f}" for s in sets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
