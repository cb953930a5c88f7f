"""The paper's hand-designed students (comparative analysis, Table 1), scaled to a teacher.

Table 1 shapes are for a BERT-base teacher (12 x 12 x 768 x 3072). Scaled: the same layer counts,
the same head count as the teacher, and hidden/FFN at the same ratios to the teacher's widths
(hidden rounded to a multiple of the heads). For a base-size teacher they are Table 1 exactly.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kdnas.distill import StudentSpec

from .measure import latency_record

if TYPE_CHECKING:
    from .context import SearchContext

# name, (layers, heads, hidden, ffn) for the BERT-base teacher, paper CPU latency in ms
TABLE1 = (
    ("6L-DistilBERT", (6, 12, 768, 3072), 33.28),
    ("6L", (6, 12, 384, 1536), 11.98),
    ("4L", (4, 12, 576, 768), 9.53),
    ("3L", (3, 12, 384, 1024), 5.41),
)
_PAPER_TEACHER = (12, 12, 768, 3072)


def reference_shapes(teacher_heads: int, teacher_hidden: int, teacher_ffn: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """[(name, (layers, heads, hidden, ffn))] of the Table 1 students scaled to this teacher."""
    out = []
    for name, (layers, _, hidden, ffn), _ in TABLE1:
        heads = teacher_heads
        scaled_hidden = max(heads, round(teacher_hidden * hidden / _PAPER_TEACHER[2] / heads) * heads)
        scaled_ffn = max(1, round(teacher_ffn * ffn / _PAPER_TEACHER[3]))
        out.append((name, (layers, heads, scaled_hidden, scaled_ffn)))
    return out


def evaluate_references(ctx: "SearchContext") -> list[dict[str, Any]]:
    """Measure and proxy-distill each scaled reference shape exactly like a trial (same budget)."""
    dims = ctx.teacher.dims
    results = []
    for name, (layers, heads, hidden, ffn) in reference_shapes(dims.heads, dims.hidden, dims.ffn):
        spec = StudentSpec(layers=layers, heads=heads, hidden=hidden, ffn=ffn, **ctx.sizes)
        ctx.progress.phase(f"reference {name} {spec.arch}: latency")
        t0 = time.perf_counter()
        latency = latency_record(ctx.judge.alone(spec))
        t1 = time.perf_counter()
        ctx.progress.phase(f"reference {name} {spec.arch}: distill")
        _, metrics = ctx.proxy(spec)
        t2 = time.perf_counter()
        results.append({"name": name, **ctx.score(spec, metrics, latency).record(),
                        "seconds": {"latency": round(t1 - t0, 3), "distill": round(t2 - t1, 3)}})
    return results
