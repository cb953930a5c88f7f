"""`kdnas distill`: distill one student of a given shape from a teacher on a corpus."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .trainer import DistillConfig

STATE_FILE = "checkpoint.pt"  # in --out until the finished student replaces the folder

EPILOG = """\
examples:
  kdnas distill --arch 4x12x192x768 --method minilmv2 --steps 300 --out runs/s4
  kdnas distill --teacher mpnet-base --arch 6x12x384x1536 --method hs --layer-map uniform+last --out runs/s6
  kdnas distill --teacher ./my-bert-mlm --method hs+od --out runs/od     (OD needs a *ForMaskedLM teacher)

methods (docs/methods.md):
  hs             hidden-state transfer, Eq. 6, learned linear maps, --layer-map
  minilmv2       multi-head self-attention relations (Q/K/V), Eq. 7-9, --relation-heads, --teacher-layer
  direct-minilm  DirectMiniLM, Eq. 10 (relation heads = attention heads)
  minilm         MiniLM v1: attention distributions + value relation (equal head counts)
  pkd | ckd | alp  ALP-KD paper family (--layer-map for pkd, --ckd-overlap for ckd)
  xtremedistil   multi-layer hidden + attention transfer (equal head counts); pair with --init svd
  od             output distribution on masked-LM logits, Eq. 5 (teacher needs an MLM head)
  hs+od          two stages: hs, then od from that checkpoint (App. B)
  embed          sentence-embedding transfer: token states, pooled cosine, in-batch relations

The output folder loads with AutoModel.from_pretrained(DIR) and holds the teacher's tokenizer and
distill.json (config, per-evaluation losses, final held-out L_HS raw and normalized).
Teacher targets are cached on disk (--cache-dir) and reused by later runs on the same data.
A long run saves its state in DIR every --save-every steps; if it stops, run the same command again
and it goes on from the last save, ending as the run would have.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from kdnas.core.assets import DEFAULT_CORPUS, DEFAULT_TEACHER
    from kdnas.core.families import families_help
    from .loop import PRECISIONS
    from .trainer import DistillConfig

    d = DistillConfig()  # one source for the defaults: the CLI shows the dataclass's
    p = subparsers.add_parser(
        "distill", help="distill one student architecture from a teacher",
        description="Distill a teacher into a student of the given shape (task-agnostic, unlabeled text); "
                    + families_help() + ".",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--teacher", default=DEFAULT_TEACHER,
                   help="bundled name (minilm-l6, mpnet-base), local model folder, or hub name (default: %(default)s)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS,
                   help="bundled name (news), a .txt/.jsonl/.csv file or folder, or a saved datasets folder (default: %(default)s)")
    p.add_argument("--arch", default="4x12x192x768",
                   help="student shape LAYERSxHEADSxHIDDENxFFN (default: %(default)s)")
    p.add_argument("--method", default=d.method, help="distillation method, see below (default: %(default)s)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps (per stage for recipes; default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate, App. B (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: %(default)s)")
    p.add_argument("--train-size", type=int, default=2048, help="training sequences in the transfer set (default: %(default)s)")
    p.add_argument("--unit", default="window", choices=["window", "sentence"],
                   help="training rows: windows of running text, or one sentence each (default: %(default)s)")
    p.add_argument("--eval-size", type=int, default=64, help="held-out sequences for L_HS (default: %(default)s)")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="evaluate every N steps; 0 = at the end (default: %(default)s)")
    _method_options(p, d)
    p.add_argument("--assistant", default="off", choices=["off", "on", "auto"],
                   help="teacher assistant (MiniLM 3.3): on, off, or auto (when L_S <= L_T/2 and d_S <= d_T/2)")
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda (default: %(default)s)")
    p.add_argument("--precision", default=d.precision, choices=PRECISIONS,
                   help="auto: bf16 autocast where the device multiplies bf16 natively (CUDA, CPUs with "
                        "AVX512-BF16 or AMX), else fp32 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed)
    _output_options(p)
    p.set_defaults(func=run)


def _method_options(p: argparse.ArgumentParser, d: DistillConfig) -> None:
    """What a method takes, how the student starts, and the perturbed batches."""
    from .augment import WORD_SOURCES
    from .methods import EMBED_DEFAULT_TERMS, EMBED_TERMS

    p.add_argument("--layer-map", default=None,
                   help="single | last | uniform | uniform-cons | uniform+last (hs, pkd; default: uniform)")
    p.add_argument("--relation-heads", type=int, default=None,
                   help="MiniLMv2 relation heads; must divide both hidden sizes (default: largest divisor <= 48 keeping head size >= 8)")
    p.add_argument("--teacher-layer", default=None, help="MiniLMv2 teacher layer: L, L-1 or L-2 (default: L)")
    p.add_argument("--ckd-overlap", default=None, help="CKD/ALP buckets: NO (no overlap) or PO (partial overlap; default: NO)")
    p.add_argument("--alp-scope", default=None, help="ALP attention over: all teacher layers or a bucket (default: all)")
    p.add_argument("--temperature", type=float, default=None, help="OD temperature tau (default: 1.0)")
    p.add_argument("--init", default=d.init, choices=["inherit", "svd", "random"],
                   help="inherit: the teacher's own layers, heads, neurons and channels, ranked by activation "
                        "importance; svd: SVD of the teacher's word embeddings (XtremeDistil), the rest random; "
                        "random (default: %(default)s)")
    p.add_argument("--layer-rule", default=d.layer_rule, choices=["first", "even", "bi"],
                   help="which teacher layers an inherited student keeps: the first, evenly spaced, or the "
                        "largest block influence (default: %(default)s)")
    p.add_argument("--embed-terms", default=None,
                   help=f"embed method: '+'-joined terms of {', '.join(EMBED_TERMS)} (default: {EMBED_DEFAULT_TERMS})")
    p.add_argument("--augment", type=float, default=d.augment, metavar="SHARE", help="share of the batches perturbed "
                   "(15 %% of the words replaced), the teacher labelling them live (default: %(default)s)")
    p.add_argument("--augment-words", default=d.augment_words, choices=list(WORD_SOURCES),
                   help="where a perturbed row's new words come from: batch, words of the same batch; neighbours, "
                        "the replaced word's nearest words in the teacher's embeddings (TinyBERT) "
                        "(default: %(default)s)")


def _output_options(p: argparse.ArgumentParser) -> None:
    """Where targets, the student and its saves go, and what is printed."""
    from .checkpoint import SAVE_EVERY

    p.add_argument("--cache-dir", default=None,
                   help="where teacher targets are stored (default: $KDNAS_CACHE/targets); 'none' keeps them in memory only")
    p.add_argument("--out", required=True, help="output folder for the student (replaced if it holds an earlier kdnas student)")
    p.add_argument("--save-every", type=int, default=SAVE_EVERY, metavar="N",
                   help="save the run's state in --out every N steps, to go on from if it stops; 0: never "
                        "(default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _record(args: argparse.Namespace, data, use_assistant: bool) -> dict:
    """What distill.json adds to the run's summary: where the student came from. The transfer set is
    described as the search describes it, so `kdnas evaluate --baselines` can rebuild the start."""
    return {"teacher": args.teacher, "corpus": args.corpus, "method": args.method, "assistant": use_assistant,
            "transfer_set": {"train": data.num_train, "eval": data.num_eval, "seq_len": data.seq_len,
                             "unit": args.unit, "fingerprint": data.fingerprint}}


def run(args: argparse.Namespace) -> int:
    from kdnas.core import assets
    from kdnas.core.errors import InputError
    from .cache import TeacherCache, targets_dir
    from .data import load_corpus, make_transfer_set
    from .inherit import inherit_reason
    from .recipes import hs_then_od, wants_assistant, with_assistant
    from kdnas.core.spec import parse_arch
    from .teachers import load_teacher
    from .loop import emulation_notice
    from .checkpoint import Checkpoints
    from .trainer import DistillConfig, distill, resolve_device

    out = _check_args(args)
    saves = Checkpoints(out / STATE_FILE, args.save_every) if args.save_every else None
    config = DistillConfig(
        method="hs" if args.method == "hs+od" else args.method,
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, eval_every=args.eval_every,
        layer_map=args.layer_map, relation_heads=args.relation_heads, teacher_layer=args.teacher_layer,
        ckd_overlap=args.ckd_overlap, alp_scope=args.alp_scope, temperature=args.temperature, init=args.init, seed=args.seed,
        layer_rule=args.layer_rule, embed_terms=args.embed_terms, augment=args.augment,
        augment_words=args.augment_words, device=args.device, precision=args.precision, progress=not args.quiet,
    )
    if (notice := emulation_notice(config.precision, resolve_device(config.device))) is not None:
        print(f"kdnas distill: {notice}", file=sys.stderr)
    needs_mlm = args.method in ("od", "hs+od")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    parse_arch(args.arch)  # fail on a malformed shape before loading anything
    teacher = load_teacher(args.teacher, mlm=needs_mlm)
    spec = parse_arch(args.arch, **teacher.student_sizes())
    if config.init == "inherit" and (reason := inherit_reason(teacher, spec)) is not None:
        raise InputError(f"--init inherit: {reason}; use --init svd or random for this shape")
    log(f"teacher {args.teacher}: {teacher.dims.layers}x{teacher.dims.heads}x{teacher.dims.hidden}x{teacher.dims.ffn}; "
        f"student {spec.arch} ({spec.num_parameters() / 1e6:.1f}M parameters)")
    texts = load_corpus(args.corpus)
    data = make_transfer_set(teacher.tokenizer, texts, seq_len=args.seq_len, num_train=args.train_size,
                             num_eval=args.eval_size, seed=args.seed, unit=args.unit)
    log(f"corpus {args.corpus}: {data.num_train} training and {data.num_eval} held-out sequences of {data.seq_len} tokens")
    cache = TeacherCache(teacher, data, directory=targets_dir(args.cache_dir))

    use_assistant = args.assistant == "on" or (args.assistant == "auto" and wants_assistant(teacher, spec))
    if args.method == "hs+od":
        if use_assistant:
            raise InputError("--assistant cannot be combined with --method hs+od; pick one recipe")
        result = hs_then_od(spec, teacher, data, config, cache=cache, checkpoints=saves)
    elif use_assistant:
        result = with_assistant(spec, teacher, data, config, cache=cache, checkpoints=saves)
    else:
        result = distill(spec, teacher, data, config, cache=cache, checkpoints=saves)

    extra = _record(args, data, use_assistant)
    result.save(out, teacher.tokenizer, extra=extra, sentence_from=assets.teacher_path(args.teacher))
    m = result.metrics
    log(f"done in {result.seconds:.1f}s: held-out L_HS {m['l_hs_norm']:.4f} normalized "
        f"({m['l_hs_raw']:.4f} raw), train loss {m['train_loss']:.4f} -> {out}")
    log(f"is it any good? kdnas evaluate {shlex.quote(str(out))} --baselines --measures fidelity,probe "
        "(minutes: beside the teacher and its untrained baselines)")
    if args.json:
        print(json.dumps({**result.summary(), **extra, "out": str(out)}, indent=2))
    return 0


def _check_args(args: argparse.Namespace) -> Path:
    """Refuse a bad method, output folder or size before anything loads; returns the output folder."""
    from kdnas.core.errors import InputError, check_choice
    from kdnas.core.files import check_out_folder
    from .methods import METHODS

    check_choice("method", args.method, (*METHODS, "hs+od"))
    # A stopped run's saved state is ours too: a rerun goes on from it. Below a file: refused now, not once trained.
    out = check_out_folder(args.out, "an earlier kdnas student", "distill.json",
                           also_ours=lambda names: all(n.startswith(Path(STATE_FILE).stem) for n in names))
    for name in ("steps", "batch_size", "train_size", "eval_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid: must be >= 1")
    if args.save_every < 0:
        raise InputError(f"--save-every {args.save_every} is invalid: must be >= 0 (0: never save)")
    return out


