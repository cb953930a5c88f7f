"""Untrained MPNet students of `mpnet-base`: which teacher layers to keep, and what the position bias is worth.

Every student of an MPNet teacher is an MPNetModel (core.families), so at the teacher's own shape it is
the teacher. Read side by side on the 1,000 held-out news sentences every student is scored on, no
training: the full-shape student (the check: max-abs to the teacher's states); the teacher with its
relative position bias set to zero (what the BERT students kdnas built before this family support
started as); and full-width students of k = 3, 4 and 6 layers kept by each layer rule (`first`,
`even`, `bi`: distill.inherit.select_layers). The rule a base-size search should use is the one whose
untrained students start closest to the teacher.

    python benchmarks/mpnet_layers.py
Writes benchmarks/results/mpnet_layers.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path


from _env import environment  # noqa: E402
from _fidelity_setup import fidelity_setup  # noqa: E402


def without_bias(teacher):
    """The teacher's model with MPNet's relative position bias zeroed (every layer shares the one table)."""
    import torch

    model = copy.deepcopy(teacher.model).eval()
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.zero_()
    return model


def full_shape_gap(teacher, student, setup) -> float:
    """Max-abs between the teacher's and the full-shape student's token states on held-out rows."""
    import torch

    ids, mask = setup.data.split("eval")
    with torch.no_grad():
        want = teacher.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = student(input_ids=ids, attention_mask=mask).last_hidden_state
    return float((want - got)[mask.bool()].abs().max())


def main() -> None:
    from kdnas.distill import StudentSpec
    from kdnas.distill.inherit import inherit_student

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="3,4,6", help="student depths (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mpnet_layers.json")
    args = parser.parse_args()

    t0 = time.time()
    setup = fidelity_setup("mpnet-base", 256)
    teacher = setup.teacher
    d = teacher.dims
    importance = setup.cache.importance()
    sizes = teacher.student_sizes()
    full, _ = inherit_student(teacher, StudentSpec(layers=d.layers, heads=d.heads, hidden=d.hidden, ffn=d.ffn,
                                                   **sizes), importance, "first")
    full.eval()
    rows = {f"MPNet student at the full shape {d.layers}x{d.heads}x{d.hidden}x{d.ffn}": setup.fidelity(full),
            "teacher without its relative position bias": setup.fidelity(without_bias(teacher))}
    gap = full_shape_gap(teacher, full, setup)
    del full
    by_rule = []
    for k in (int(x) for x in args.depths.split(",")):
        for rule in ("first", "even", "bi"):
            spec = StudentSpec(layers=k, heads=d.heads, hidden=d.hidden, ffn=d.ffn, **sizes)
            student, chosen = inherit_student(teacher, spec, importance, rule)
            row = {"layers": k, "rule": rule, "teacher_layers": [j + 1 for j in chosen.layers],
                   **setup.fidelity(student.eval())}
            by_rule.append(row)
            print(f"| {k} | {rule} | {row['teacher_layers']} | {row['spearman']:.3f} | {row['mean_cosine']:.3f} |",
                  flush=True)
    result = {"what": __doc__.strip().splitlines()[0], "sentences": len(setup.sentences),
              "full_shape_max_abs": gap, "rows": rows, "layer_rules": by_rule,
              "block_influence": list(importance.block_influence), "seconds": round(time.time() - t0, 1),
              "command": "python " + " ".join(sys.argv), "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, row in rows.items():
        print(f"| {name} | {row['spearman']:.3f} | {row['mean_cosine']:.3f} |")
    print(f"full shape: max-abs {gap:.2e} to the teacher's states")


if __name__ == "__main__":
    main()
