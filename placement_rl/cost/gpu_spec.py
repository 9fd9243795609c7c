"""The GPU datasheet figures the calibrated cost model reads (``GpuSpec``), and the architecture facts it derives
from a product name (``datasheet``: compute capability, memory kind, FP32 lanes per SM, board power class)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuSpec:
    """The datasheet figures the model uses: FLOP/s, bytes/s, SM count, L2 bytes, and the architecture
    (``arch``: CUDA compute capability, 6.0 P100 ... 9.0 H100; ``gddr``: GDDR rather than HBM memory;
    ``fp32_lanes``: FP32 units per SM, 64 or 128; ``low_power``: a board power of at most 75 W, the cards
    powered by the PCIe slot alone, T4 / P4 / L4). ``datasheet(name)`` fills the last four from a product name;
    0 / False mean unknown (priced like a Volta-or-newer HBM GPU with 64 lanes and power to spare)."""

    peak_flops: float
    mem_bandwidth: float
    sm_count: int = 0
    l2_bytes: float = 0.0
    arch: float = 0.0
    gddr: bool = False
    fp32_lanes: int = 0
    low_power: bool = False


# Per product family (longest name match first): CUDA compute capability (NVIDIA's CUDA GPUs list), memory kind,
# FP32 units per SM (the architecture whitepapers: 64 on GP100 / GV100 / TU10x / GA100, 128 on GP10x, GA10x,
# AD10x and GH100) and whether the board is a <= 75 W card (the product datasheets: T4 70 W, P4 75 W, L4 72 W,
# A2 60 W).
_ARCH: tuple[tuple[str, float, bool, int, bool], ...] = (
    ("GH200", 9.0, False, 128, False), ("H100", 9.0, False, 128, False), ("H200", 9.0, False, 128, False),
    ("H800", 9.0, False, 128, False), ("L40", 8.9, True, 128, False), ("L4", 8.9, True, 128, True),
    ("RTX 40", 8.9, True, 128, False), ("A100", 8.0, False, 64, False), ("A800", 8.0, False, 64, False),
    ("A30", 8.0, False, 64, False), ("A40", 8.6, True, 128, False), ("A10", 8.6, True, 128, False),
    ("A2", 8.6, True, 128, True), ("RTX 30", 8.6, True, 128, False), ("A6000", 8.6, True, 128, False),
    ("T4", 7.5, True, 64, True), ("RTX 20", 7.5, True, 64, False), ("V100", 7.0, False, 64, False),
    ("P100", 6.0, False, 64, False), ("P40", 6.1, True, 128, False), ("P4", 6.1, True, 128, True),
    ("K80", 3.7, True, 192, False),
    # Blackwell (B200 / GB200 / B100: compute capability 10.0, HBM3e; GeForce RTX 50: 12.0, GDDR7), Hopper H20 and
    # Ada L20 / RTX 6000 Ada, Ampere RTX A-series workstation cards, Turing Quadro / Titan RTX, Volta Titan V,
    # Pascal GeForce GTX 10, Maxwell M40 / M60, Kepler K40: NVIDIA's CUDA GPUs list and the architecture whitepapers
    # (FP32 lanes per SM: 128 on GB100 / GB20x, like GH100 and AD10x; 192 on Kepler). ``low_power`` marks the cards
    # whose board power is low for their peak (P4 14 W, T4 9 W, L4 2.4 W per FP32 TFLOP/s against the V100's 19): a
    # GTX 1050 draws 75 W for 1.9 TFLOP/s (40 W per TFLOP/s) and holds its clock
    ("B200", 10.0, False, 128, False), ("GB200", 10.0, False, 128, False), ("B100", 10.0, False, 128, False),
    ("RTX 50", 12.0, True, 128, False), ("H20", 9.0, False, 128, False), ("L20", 8.9, True, 128, False),
    ("RTX A", 8.6, True, 128, False), ("QUADRO RTX", 7.5, True, 64, False), ("TITAN RTX", 7.5, True, 64, False),
    ("TITAN V", 7.0, False, 64, False), ("GTX 10", 6.1, True, 128, False), ("M40", 5.2, True, 128, False),
    ("M60", 5.2, True, 128, False), ("K40", 3.5, True, 192, False),
    # Blackwell Ultra B300 (10.3, HBM3e), RTX PRO Blackwell workstation cards (12.0, GDDR7), Ada workstation cards
    # named by their number (RTX 2000 ... 6000 Ada: 8.9, GDDR6), Turing GeForce GTX 16 (7.5, 64 lanes), Ampere A16
    # (8.6), Pascal Titan X / Xp (6.1): NVIDIA's CUDA GPUs list and the whitepapers
    ("B300", 10.3, False, 128, False), ("RTX PRO", 12.0, True, 128, False), ("2000 ADA", 8.9, True, 128, False),
    ("4000 ADA", 8.9, True, 128, False), ("4500 ADA", 8.9, True, 128, False), ("5000 ADA", 8.9, True, 128, False),
    ("6000 ADA", 8.9, True, 128, False), ("GTX 16", 7.5, True, 64, False), ("A16", 8.6, True, 128, False),
    ("TITAN X", 6.1, True, 128, False),
    # Quadro Pascal (P4000 ... P6000: GP104 / GP102) and RTX A-series named without "RTX" (A4000, A5000)
    ("P4000", 6.1, True, 128, False), ("P5000", 6.1, True, 128, False), ("P6000", 6.1, True, 128, False),
    ("A4000", 8.6, True, 128, False), ("A5000", 8.6, True, 128, False))
# A product number (A100, T4, L40) matches only as a whole number (A100 not in A1000, T4 not in RTX 4090, L4 not
# in L40); a series (RTX 40, GTX 10) only as the first digits of a four-digit model number (RTX 4090, GTX 1050).
_SERIES = ("RTX 20", "RTX 30", "RTX 40", "RTX 50", "GTX 10", "GTX 16")


def _pattern(key: str) -> re.Pattern[str]:
    words = key.upper().split()
    body = r"\s*".join(re.escape(w) for w in words)  # "RTX4090" and "RTX 4090" alike
    tail = r"(?=\d\d(?!\d))" if key in _SERIES else r"(?=\d)" if key == "RTX A" else r"(?!\d)"
    return re.compile(r"(?<![A-Z0-9])" + body + tail)


_PATTERNS = tuple((_pattern(r[0]), r[1:]) for r in sorted(_ARCH, key=lambda r: -len(r[0])))
_UNKNOWN: set[str] = set()


def datasheet(name: str) -> tuple[float, bool, int, bool]:
    """``(arch, gddr, fp32_lanes, low_power)`` of a GPU from its product name (``Tesla_P100-PCIE-16GB``,
    ``H100-SXM5-80GB``); ``(0.0, False, 0, False)`` if the name is not recognised."""
    up = name.upper().replace("_", " ").replace("-", " ")
    for pat, facts in _PATTERNS:  # the longest name first (H200 before H20)
        if pat.search(up):
            return facts
    return 0.0, False, 0, False


def arch_of(name: str) -> float:
    """Compute capability of a GPU from its product name; 0 if not recognised."""
    return datasheet(name)[0]


def spec_of_device(dev: Any) -> "GpuSpec":
    """``GpuSpec`` of a topology ``Device`` (datasheet figures, architecture from its ``architecture``, else its
    ``model``, else its name)."""
    name = str(getattr(dev, "architecture", "") or getattr(dev, "model", "") or dev.name)
    arch, gddr, lanes, low = datasheet(name)
    if arch == 0.0 and name not in _UNKNOWN and str(getattr(dev, "kind", "gpu")) == "gpu":
        _UNKNOWN.add(name)  # once per name and process
        logging.getLogger(__name__).warning(
            "GPU model '%s' is not in the datasheet table (placement_rl/cost/gpu_spec.py): priced as a Volta-or-newer "
            "HBM GPU with 64 FP32 lanes per SM; set the device's 'model' to its product name (e.g. H100, L4), or for "
            "a card not in the table 'architecture' to the product it is built like", name)
    return GpuSpec(dev.peak_flops, dev.mem_bandwidth, dev.sm_count, dev.l2_bytes, arch, gddr, lanes, low)
