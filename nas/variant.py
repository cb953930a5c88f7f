"""Which fp32 graph a search ships as `model.onnx`: onnxruntime's fused graph or the plain export,
whichever runs faster on this host.

Fusion is what makes the INT8 graph fast (a fused BERT attention becomes one `QAttention`), so
`model.int8.onnx` is always quantized from the fused graph. The fp32 graph is another matter: on a
2-core AMD EPYC the fused graph read 4-12 % slower than the plain export (docs/benchmarks/latency-table.md),
on other CPUs it is faster. So before a finalist trains, its shape is exported both ways with random
weights (latency does not depend on them) and the two are timed in alternation; the plain graph ships
only where it is faster in three rounds of four (the pair's upper quartile under 1), a tie keeps the
fused one. The choice is made once per shape and recorded in `export.json` (`fp32_variant`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

FUSED, PLAIN = "fused", "plain"


@dataclass(frozen=True)
class VariantChoice:
    """The fp32 graph shipped, and the plain graph's latency over the fused one's, timed side by side."""

    shipped: str  # FUSED or PLAIN
    plain_over_fused: float  # median of the rounds' ratios
    low: float  # their quartiles
    high: float
    fused_ms: float
    plain_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_variant(fused: Path, plain: Path, pair: Callable[[Path, Path], Any]) -> VariantChoice:
    """Time `plain` beside `fused` with `pair(target, reference) -> latency.PairResult` (or anything with
    its `ratio`, `ratio_low`, `ratio_high`, `target_ms` and `reference_ms`) and choose."""
    timed = pair(plain, fused)
    shipped = PLAIN if timed.ratio_high < 1.0 else FUSED
    return VariantChoice(shipped=shipped, plain_over_fused=round(float(timed.ratio), 4),
                         low=round(float(timed.ratio_low), 4), high=round(float(timed.ratio_high), 4),
                         fused_ms=round(float(timed.reference_ms), 4), plain_ms=round(float(timed.target_ms), 4))


# What export.json says of model.onnx: taken from the plain export's report where the plain graph ships.
GRAPH_FIELDS = ("optimized", "fused", "attention_fused", "fusion", "parity")


def ship_plain(model: Any, dest: Path, export: Callable[[Any, Path], Any]) -> dict[str, Any]:
    """Replace `dest/model.onnx` (the fused graph of a finished export) by `model`'s plain export,
    written by `export(model, folder)` with the same tokenizer and sentence pipeline and its own
    parity check; returns the plain report's graph fields for export.json."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".plain-") as tmp:
        report = export(model, Path(tmp) / "plain").to_dict()
        os.replace(Path(tmp) / "plain" / "model.onnx", dest / "model.onnx")
    return {key: report[key] for key in GRAPH_FIELDS}
