"""What a BERT student loses of an MPNet teacher before any training: MPNet's relative position bias.

Every MPNet weight maps into a BERT layer except the relative position bias (docs/distill.md), so a
student inherited at the teacher's own shape is the teacher without that bias. Read side by side on the
1,000 held-out news sentences every student is scored on: the teacher; the teacher with its bias set to
zero (an MPNetModel still); the BERT student inherited at the full shape, 12x12x768x3072. When the last two
agree to float precision, the map is exact but for the bias, and the fidelity they share is what the bias
is worth to a student before training.

    python benchmarks/mpnet_bias.py
Writes benchmarks/results/mpnet_bias.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import environment  # noqa: E402
from _fidelity_setup import fidelity_setup  # noqa: E402


def without_bias(teacher):
    """The teacher's model with MPNet's relative position bias zeroed (every layer shares the one table)."""
    import torch

    model = copy.deepcopy(teacher.model).eval()
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.zero_()
    return model


def main() -> None:
    import torch

    from distill import StudentSpec
    from distill.inherit import inherit_student
    from evaluation import sentence_embeddings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mpnet_bias.json")
    args = parser.parse_args()

    t0 = time.time()
    setup = fidelity_setup("mpnet-base", 64)
    teacher = setup.teacher
    d = teacher.dims
    spec = StudentSpec(layers=d.layers, heads=d.heads, hidden=d.hidden, ffn=d.ffn, **teacher.student_sizes())
    student, chosen = inherit_student(teacher, spec, setup.cache.importance(), "even")
    assert chosen.layers == tuple(range(d.layers)), chosen.layers
    models = {"teacher without its relative position bias (MPNetModel)": without_bias(teacher),
              f"BERT student inherited at the full shape {spec.arch}, untrained": student.eval()}
    embedded = {name: sentence_embeddings((model, teacher.tokenizer), setup.sentences)
                for name, model in models.items()}
    rows = {"teacher": {"spearman": 1.0, "mean_cosine": 1.0}}
    rows.update({name: setup.fidelity(model) for name, model in models.items()})
    a, b = embedded.values()
    exact = float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())
    result = {"what": __doc__.strip().splitlines()[0], "sentences": len(setup.sentences), "rows": rows,
              "max_abs_between_the_two_without_bias": exact, "seconds": round(time.time() - t0, 1),
              "command": "python " + " ".join(sys.argv), "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, row in rows.items():
        print(f"| {name} | {row['spearman']:.3f} | {row['mean_cosine']:.3f} |")
    print(f"max-abs between the two without bias: {exact:.2e}")


if __name__ == "__main__":
    main()
