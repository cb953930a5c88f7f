"""benchmarks/heterogeneous.py: per-layer FFN widths by importance, and the cut that keeps them."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from heterogeneous import STEP, cut_ffn, per_layer_widths  # noqa: E402


def test_widths_follow_the_shares_sum_to_the_total_and_stay_in_steps_within_bounds():
    flat, peaked = torch.ones(512), torch.cat([torch.full((64,), 100.0), torch.ones(448)])
    widths = per_layer_widths([flat, peaked], total=512, ceiling=512)
    assert sum(widths) == 512 and all(w % STEP == 0 and STEP <= w <= 512 for w in widths)
    assert widths[0] > widths[1]  # the peaked layer's few strong neurons hold most of its share: it needs fewer
    torch.manual_seed(0)
    alike = per_layer_widths([1 + torch.rand(512), 1 + torch.rand(512)], total=512, ceiling=512)
    assert sorted(alike) in ([256, 256], [192, 320])  # two layers of one distribution: an even split, give or take a step
    assert per_layer_widths([peaked, flat], total=128, ceiling=512) == [64, 64]  # no layer below one step


def test_a_cut_to_full_width_is_the_model_itself_and_a_narrower_cut_runs_with_its_own_widths():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, attn_implementation="eager")
    model, ids = BertModel(config).eval(), torch.randint(0, 50, (2, 7))
    before = model(input_ids=ids).last_hidden_state
    scores = [torch.rand(128), torch.rand(128)]
    assert torch.allclose(cut_ffn(model, scores, [128, 128])(input_ids=ids).last_hidden_state, before, atol=1e-6)
    cut = cut_ffn(model, scores, [64, 32])
    assert [layer.intermediate.dense.out_features for layer in cut.encoder.layer] == [64, 32]
    assert cut(input_ids=ids).last_hidden_state.shape == before.shape
