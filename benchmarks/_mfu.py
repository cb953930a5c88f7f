"""Model FLOPs utilisation: a student's training FLOPs per second against its device's dense peak."""

from __future__ import annotations

# Dense bf16 peaks (TFLOP/s) from the vendors' data sheets, without sparsity; the first key in a
# device's name wins ("H100 PCIe" before "H100").
BF16_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0}


def known_peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a known GPU, else None (no MFU is reported for it)."""
    return next((peak for key, peak in BF16_PEAK_TFLOPS.items() if key in device_name), None)


def train_flops_per_token(spec, seq_len: int) -> float:
    """The student's model FLOPs per token at `seq_len` (`StudentSpec.flops`), x3 for forward and backward."""
    return 3 * spec.flops(seq_len) / seq_len


def mfu(tokens_per_s: float, spec, seq_len: int, peak_tflops: float) -> float:
    return tokens_per_s * train_flops_per_token(spec, seq_len) / (peak_tflops * 1e12)
