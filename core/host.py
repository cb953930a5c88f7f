"""What this CPU is: its model name and the instruction-set flags that decide INT8 speed and correctness."""

from __future__ import annotations

import platform
from pathlib import Path

# The int8 dot-product extensions: with one of them onnxruntime multiplies uint8 by int8 without the
# int16 saturation of the AVX2 / plain AVX-512 path, so weights may use their full 8-bit range.
INT8_DOT_EXTENSIONS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_info() -> tuple[str, set[str]]:
    """(the CPU model's name, its flags) from /proc/cpuinfo; the machine's name and no flags elsewhere."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def int8_extensions() -> list[str]:
    """This CPU's int8 dot-product extensions (INT8_DOT_EXTENSIONS it has), in that order."""
    flags = cpu_info()[1]
    return [f for f in INT8_DOT_EXTENSIONS if f in flags]
