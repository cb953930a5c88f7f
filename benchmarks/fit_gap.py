"""Fidelity on the text a student was trained on, beside the held-out text it is scored on.

A student that orders the teacher's similarities better on sentences it saw in training than on unseen
ones is short of text: more of it (or inputs that stand in for it) would close the gap. One that scores
alike on both is short of capacity or steps, and more text would not help. Both samples are read in the
same form: 1,000 rows of the student's own transfer set (rebuilt from its distill.json, as
student_quality.py does) and 1,000 held-out sentences cut to the same row length, each decoded from the
teacher's tokenizer, so the two differ only in whether the student was trained on them. The student's
untrained baselines (the teacher's first layers, its inherited start) are read on both samples too: trained
on neither, their gap is what the samples differ by alone.

    python benchmarks/fit_gap.py runs/long30k-aug/3x12x384x1280-30000-0 runs/long40k-aug/3x12x384x1280-40000-0 \
        --out benchmarks/results/fit_gap.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from _env import environment  # noqa: E402
from _fidelity_setup import fidelity_setup  # noqa: E402

ROWS = 1000


def samples(setup, rows: int = ROWS, seed: int = 0) -> dict[str, list[str]]:
    """`rows` training rows and as many held-out sentences, decoded to one text form (the row length of
    the transfer set, the tokenizer's normalisation)."""
    from kdnas.distill.data import training_texts

    tokenizer, data = setup.teacher.tokenizer, setup.data
    trained = training_texts(tokenizer, data, rows, seed=seed)
    cut = tokenizer(setup.sentences[:rows], truncation=True, max_length=data.seq_len)["input_ids"]
    return {"held_out": tokenizer.batch_decode(cut, skip_special_tokens=True), "trained_on": trained}


def measure(folder: Path, setups: dict) -> dict:
    from kdnas.evaluation import embedding_fidelity, sentence_embeddings

    record = json.loads((folder / "distill.json").read_text())
    transfer = record["transfer_set"]
    key = (transfer["train"], transfer["eval"], transfer["seq_len"], transfer["unit"])
    if key not in setups:  # the same rows as the student's run: its held-out rows come first in the set
        setup = fidelity_setup("minilm-l6", transfer["train"], seq_len=transfer["seq_len"], unit=transfer["unit"],
                               num_eval=transfer["eval"])
        texts = samples(setup)
        setups[key] = (setup, texts, {k: sentence_embeddings(setup.teacher, v) for k, v in texts.items()})
    setup, texts, reference = setups[key]

    def scores(model) -> dict:
        out = {}
        for name, sentences in texts.items():
            scored = embedding_fidelity(reference[name], sentence_embeddings(model, sentences))
            out[name] = {k: round(scored[k], 4) for k in ("spearman", "spearman_se", "mean_cosine")}
        return {**out, "gap": round(out["trained_on"]["spearman"] - out["held_out"]["spearman"], 4)}

    row = {"model": str(folder), "arch": record.get("arch"), "steps": record.get("steps"),
           "augment": record.get("config", {}).get("augment"), "dropout": record.get("config", {}).get("dropout"),
           "transfer_set": transfer, **scores(str(folder))}
    # The control: models trained on neither sample. Their gap is what the two samples differ by alone.
    row["untrained"] = {name: scores((model.eval(), setup.teacher.tokenizer))
                        for name, model in _baselines(setup, record).items()}
    return row


def _baselines(setup, record: dict) -> dict:
    from kdnas.core.spec import StudentSpec
    from kdnas.evaluation.baselines import untrained_baselines

    spec = StudentSpec(**record["spec"])
    rule = (record.get("init") or {}).get("layer_rule") or record["config"]["layer_rule"]
    models, _ = untrained_baselines(setup.teacher, spec, setup.cache.importance(), rule, 128)
    return models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("students", nargs="+", type=Path,
                        help="folders saved by recipe_sweep.py --save, or a search's best/ (with its distill.json)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fit_gap.json"))
    args = parser.parse_args()
    setups: dict = {}
    rows = []
    for folder in args.students:
        rows.append(measure(folder, setups))
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows_per_sample": ROWS, "students": rows, "environment": environment()},
                                   indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
