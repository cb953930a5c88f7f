"""The GPU path: run where CUDA exists, skipped with that reason elsewhere.

Real teacher, real data, real export: cached and live teacher targets agree at the bf16 tolerance
on a GPU; a search with `--device cuda` trains its proxy trials and its final student there,
records the device and dtype in the study settings, and ships a student exported on the CPU with
the usual parity check.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdnas.distill import DistillConfig, Evaluator, TeacherCache, distill, parse_arch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

REPO = Path(__file__).resolve().parents[1]


def test_cached_and_live_targets_agree_on_the_gpu(teacher, small_data):
    cache = TeacherCache(teacher, small_data)
    spec = parse_arch("2x12x384x512", **teacher.student_sizes())
    config = DistillConfig(method="hs", steps=4, batch_size=8, device="cuda", progress=False)
    cached = distill(spec, teacher, small_data, config, cache=cache)
    live = distill(spec, teacher, small_data, config, cache=None, evaluator=Evaluator(cache))
    # Live targets are bf16 activations, cached ones fp16-stored: equal up to bf16 rounding.
    assert math.isclose(cached.history[-1]["train_loss"], live.history[-1]["train_loss"], rel_tol=5e-2)
    assert next(cached.student.parameters()).device.type == "cpu"  # handed back on the CPU


def test_training_targets_live_on_the_gpu_and_read_the_same(teacher, small_data):
    from kdnas.distill.activations import Needs

    cache = TeacherCache(teacher, small_data)
    needs = Needs(hidden=frozenset({6}))
    index = torch.tensor([3, 1, 7])
    before = cache.batch("train", index, needs, width=20).hidden[6].clone()
    assert cache.place("train", torch.device("cuda"))
    after = cache.batch("train", index, needs, width=20).hidden[6]
    assert after.device.type == "cuda" and torch.equal(after.cpu(), before)
    assert cache.batch("eval", index, needs).hidden[6].device.type == "cpu"  # the evaluator's rows stay


def test_a_grown_set_joins_targets_placed_on_the_gpu_with_the_new_rows(teacher, news_texts):
    """What a final run does when its time allows more steps than its set was sized for, after its
    targets went to the GPU: the smaller set's rows are reused, the teacher runs on the new ones."""
    from kdnas.distill import make_transfer_set
    from kdnas.distill.activations import Needs

    small, big = (make_transfer_set(teacher.tokenizer, news_texts, seq_len=64, num_train=n, num_eval=16, seed=0)
                  for n in (48, 80))
    needs, cuda = Needs(hidden=frozenset({6})), torch.device("cuda")
    cache = TeacherCache(teacher, small)
    cache.ensure("train", needs)
    assert cache.place("train", cuda)
    grown = cache.grown(big)
    grown.ensure("train", needs)
    assert grown.teacher_passes == 1 and grown.place("train", cuda)
    fresh = TeacherCache(teacher, big)
    fresh.ensure("train", needs)
    every, real_tokens = torch.arange(80), big.train_mask.bool()
    torch.testing.assert_close(grown.batch("train", every, needs).hidden[6].cpu()[real_tokens].float(),
                               fresh.batch("train", every, needs).hidden[6][real_tokens].float(), atol=2e-2, rtol=1e-2)


def test_search_on_the_gpu_trains_there_and_ships_a_cpu_export(tmp_path):
    out = tmp_path / "gpu"
    args = ["search", "--out", str(out), "--device", "cuda", "--trials", "2", "--layers", "1-2", "--hidden", "96",
            "--ffn", "256", "--budget-ms", "1000", "--proxy-steps", "6", "--eval-every", "3", "--final-steps", "6",
            "--proxy-eval", "16", "--seq-len", "32",
            "--final-train", "48", "--final-batch-size", "8", "--quality-sentences", "48", "--proxy-sentences", "60", "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "kdnas.cli", *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["device"] == "cuda" and summary["settings"]["dtype"] == "bf16"
    export = json.loads((out / "best" / "export.json").read_text())
    assert export["parity"]["passed"] and (out / "best" / "model.onnx").is_file()
