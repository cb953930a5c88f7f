"""After the search: distill the winner(s) longer, export with checks, profile, write out.

The winner is the feasible trial with the best reward (for the Pareto objective: the front
member with the best KD-NAS reward), or the FFN neighbour of a finalist that the proxy ranks above
it (`nas.neighbours`: the budget's edge often lies between two FFN widths). It is distilled again
from its start (or, after a wider finalist of its shape was refused as shipped, from that one's
trained weights narrowed: `Stage.trained_wider`)
for `final.steps` on a transfer set of `final.rows` sequences (`final.train`, more
for a long run) with the proxy's held-out rows (so the losses compare), exported (ONNX + fused +
INT8, parity-checked by `export`; model.onnx the fused or the plain graph, whichever runs faster
here: `nas.variant`), made a sentence-transformers drop-in for the teacher (the
teacher's pooling and normalization, also inside model.onnx's `sentence_embedding`), given a model
card, and profiled with the same latency settings as the search. Results are kept in the study
(`final`), so a rerun of a finished search does not redo them.

The stage in parts: `_records` (candidates, the study's records, the claim), `_stage` (the loop and the
budget's gate before training), `_latency` (a finalist's graph as the budget judges it), `_train` (the final
run, fitted to a --timeout) and `_shipping` (from trained student to shipped folder).
"""

from ._latency import FP32_GRAPH, INT8_GRAPH, shipped_graphs
from ._records import claim_final, final_dir, finalists, is_done, state_file
from ._stage import MAX_OVER_BUDGET, run_final
from ._train import MIN_CONTINUED_STEPS

__all__ = ["finalists", "claim_final", "is_done", "run_final", "final_dir", "state_file", "shipped_graphs",
           "FP32_GRAPH", "INT8_GRAPH", "MAX_OVER_BUDGET", "MIN_CONTINUED_STEPS"]
