"""`kdnas target`'s design: which graphs of a teacher's search space a target profile reads.

The profile (`latency.TargetProfile`) must price every graph a search can ship on the target: any shape of the
teacher family's space, fp32 or all-INT8, and precision plans between the two. So the design spans the space —
its fastest and its largest shape, then shapes drawn evenly from the rest — in both precisions, with a few plans
that keep one kind of weight group fp32 in every layer (the cost of keeping each kind), and sets aside shapes and
plans of the same kinds the fit never sees, to judge it (`TargetProfile.held_out`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from kdnas.latency import DesignGraph, Settings, TargetProfile, TargetReading, fitted_profile, read_design
from kdnas.latency import Host

from .space import default_space

# Graphs per kind: enough design readings for the seven costs with room to judge each by leave-one-out, and
# held-out ones of every kind. 33 pairs: about 4 minutes for MiniLM-L6 and 15 for MPNet on 2 cores.
FP32_DESIGN, INT8_DESIGN, HELD_FP32, HELD_INT8 = 10, 10, 4, 4


def design(layers: int, heads: int, hidden: int, ffn: int, seed: int = 0) -> list[DesignGraph]:
    """The graphs a profile of a teacher of shape (layers, heads, hidden, ffn) reads, design first."""
    space = default_space(layers, heads, hidden, ffn, keep_head_size=True)
    shapes = [f"{n}x{h // space.head_size}x{h}x{f}" for n in space.layers for h in space.hidden for f in space.ffn]
    fastest, largest = shapes[0], f"{layers}x{heads}x{hidden}x{ffn}"
    rest = [s for s in shapes if s not in (fastest, largest)]
    rng = random.Random(seed)
    drawn = rng.sample(rest, min(len(rest), FP32_DESIGN + INT8_DESIGN + HELD_FP32 + HELD_INT8 - 4))
    fp32 = [fastest, largest, *drawn[:FP32_DESIGN - 2]]
    int8 = [fastest, largest, *drawn[FP32_DESIGN - 2:FP32_DESIGN + INT8_DESIGN - 4]]
    held = drawn[FP32_DESIGN + INT8_DESIGN - 4:]
    middle = f"{max(1, layers // 2)}x{heads}x{hidden}x{ffn}"
    out = [DesignGraph(s) for s in fp32] + [DesignGraph(s, int8=True) for s in int8]
    out += [DesignGraph(largest, True, ("ffn_out",)), DesignGraph(middle, True, ("qkv",)),
            DesignGraph(middle, True, ("attn_out", "ffn_in"))]
    out += [DesignGraph(s, held_out=True) for s in held[:HELD_FP32]]
    out += [DesignGraph(s, int8=True, held_out=True) for s in held[HELD_FP32:HELD_FP32 + HELD_INT8]]
    # plans as the planner grows them: a few groups of the first layers kept fp32, and one kind in every layer
    out += [DesignGraph(largest, True, ("embeddings", "0.ffn_out"), held_out=True),
            DesignGraph(middle, True, ("0.ffn_out", "0.attn_out", f"{max(0, layers // 2 - 1)}.ffn_in"), held_out=True),
            DesignGraph(middle, True, ("ffn_out",), held_out=True)]
    return out


def make_target(teacher_name: str, settings: Settings, *, seed: int = 0,
                on_reading: Callable[[int, int, TargetReading], None] | None = None) -> TargetProfile:
    """The target profile of this host for `teacher_name` on `settings`: the design read beside the teacher
    and fitted (`latency.fitted_profile`)."""
    from kdnas.distill import load_teacher

    start = time.monotonic()
    teacher = load_teacher(teacher_name)
    d = teacher.dims
    graphs = design(d.layers, d.heads, d.hidden, d.ffn, seed)
    readings = read_design(graphs, teacher_name, teacher.student_sizes(), settings,
                           None if on_reading is None else lambda i, r: on_reading(i, len(graphs), r))
    return fitted_profile(teacher_name, f"{d.layers}x{d.heads}x{d.hidden}x{d.ffn}", settings, Host.here(), readings,
                          seconds=time.monotonic() - start)
