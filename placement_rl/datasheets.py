"""GPU datasheet figures by product name, so that a topology can name its GPUs instead of copying their figures.

``lookup(name)`` -> ``Datasheet`` (or None): FP32 peak (no tensor cores), memory bandwidth, memory, SM count, L2,
the dense TF32 / BF16 / FP16 tensor-core peaks (0 where the GPU has none) and the FP64 peak, for a product name as
people write it or
as ``torch.cuda.get_device_name`` reports it (``H100-SXM5-80GB``, ``NVIDIA H100 80GB HBM3``, ``Tesla T4``,
``rtx4090``). A topology YAML device with ``kind: gpu`` and a known ``model`` may leave out any of these fields
(``placement_rl.topology``); ``placement_rl._local`` reads the same table for a detected GPU.

Figures are the vendors' datasheets and architecture whitepapers (tensor-core peaks: the datasheet's "with
sparsity" figure halved); memory in the vendor's GB taken as GiB, as the presets do, except where a row says the
figure is what the device itself reports (the H200 we measured). A family name without its variant (``A100``,
``V100``, ``P100``) gets the base variant's memory (40 / 16 / 16 GB): give ``memory_bytes`` for the larger one.

Spellings: case, ``-`` and ``_`` do not matter, a memory size may be written ``80 GB``, ``80G`` or ``80GiB`` (all
``80GB``) and a variant letter may stand apart (``L40-S`` is the L40S). A name that contradicts the row it matches
is refused rather than priced as another card (``resolve`` raises ``TopologyError`` naming the product's rows, a
topology device that would take figures from it is refused so, ``lookup`` returns None): a memory size the row
does not have (``H100 94GB`` matches the 80 GB H100 SXM5; the 94 GB card is the H100 NVL, so name it), a letter
glued to the model number that is no variant the table knows (``A100X``), or a variant word the row's own words do
not hold (``_VARIANTS``: ``Ti``, ``SUPER``, ``Laptop``, ``Mobile``, ``Max-Q``, ``DRIVE``, ``CNX``: ``RTX 3090 Ti``
and ``RTX 4090 Laptop GPU`` are other cards than the RTX 3090 and RTX 4090, while ``RTX 3080 Ti`` has its row). A
MIG slice (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``, as torch names it) is refused too: it is a part of the card, with
figures of its own. A memory size is the row's own (its product's ``<n>GB``); the GH200's row also takes 480 GB, its
Grace memory, as the device names itself (``NVIDIA GH200 480GB``). ``nearest(name)`` gives the known names closest
to an unknown one (difflib), for error messages.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from placement_rl.errors import TopologyError

GiB, MiB = 2**30, 2**20


@dataclass(frozen=True)
class Datasheet:
    product: str
    peak_flops: float       # FP32 FLOP/s without tensor cores
    mem_bandwidth: float    # bytes/s
    memory_bytes: float
    sm_count: int
    l2_bytes: float
    peak_flops_tf32: float  # dense tensor-core FLOP/s (0: none)
    peak_flops_bf16: float
    # dense FP16 with FP32 accumulation, as PyTorch runs it (-1: the BF16 peak, as on Ampere and newer, where one
    # rate serves both; a Volta / Turing row gives its own)
    peak_flops_fp16: float = -1.0
    # FP64 a GEMM reaches (the FP64 tensor cores' where there are some): ``_FP64`` for the data-centre cards that
    # run it at 1/2 of FP32 or better, else 1/64 of the FP32 peak (Ampere and newer GeForce, workstation and
    # inference cards, with BF16 tensor cores) or 1/32 (Turing, Pascal)
    peak_flops_fp64: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.peak_flops_fp16 < 0:
            object.__setattr__(self, "peak_flops_fp16", self.peak_flops_bf16)
        ratio = 1 / 64 if self.peak_flops_bf16 else 1 / 32
        object.__setattr__(self, "peak_flops_fp64", _FP64.get(self.product, self.peak_flops * ratio))

    def fields(self) -> dict[str, float | int]:
        return {"peak_flops": self.peak_flops, "mem_bandwidth": self.mem_bandwidth, "memory_bytes": self.memory_bytes,
                "sm_count": self.sm_count, "l2_bytes": self.l2_bytes, "peak_flops_tf32": self.peak_flops_tf32,
                "peak_flops_bf16": self.peak_flops_bf16, "peak_flops_fp16": self.peak_flops_fp16,
                "peak_flops_fp64": self.peak_flops_fp64}


# FP64 (tensor core where there is one) of the cards that run it fast: NVIDIA's datasheets (HGX B200 and GB200 NVL72
# per GPU; H100 / H200 / GH200, A100 / A800, A30 FP64 Tensor Core; V100, TITAN V and P100 FP64 at 1/2 of FP32; the
# K80 at 1/3)
_FP64 = {"GB200 186GB (one GPU of an NVL72)": 45e12, "B200 180GB (HGX)": 37e12, "GH200 96GB": 67e12,
         "H200 NVL": 60e12, "H200 SXM 141GB": 67e12, "H100 PCIe 80GB": 51e12, "H100 NVL 94GB": 60e12,
         "H100 SXM5 80GB": 67e12, "A100 80GB PCIe": 19.5e12, "A100 SXM4 80GB": 19.5e12, "A100 40GB": 19.5e12,
         "A800 80GB PCIe": 19.5e12, "A800 40GB PCIe": 19.5e12, "A800 SXM4 80GB": 19.5e12, "A30 24GB": 10.3e12,
         "V100S PCIe 32GB": 8.2e12, "V100 PCIe 32GB": 7.0e12, "V100 PCIe 16GB": 7.0e12, "V100 SXM2 32GB": 7.8e12,
         "V100 SXM2 16GB": 7.8e12, "TITAN V 12GB": 7.45e12, "P100 PCIe 12GB": 4.7e12, "P100 PCIe 16GB": 4.7e12,
         "P100 SXM2 16GB": 5.3e12, "K80 (one of the board's two GPUs)": 1.455e12}


# (words that must all appear in the name, product, FP32, bytes/s, memory, SMs, L2, TF32 dense, BF16 dense[, FP16
# dense with FP32 accumulation where it is not the BF16 figure]); the
# first row whose words all appear wins, so a variant comes before its family. A word matches whole: not inside a
# longer model number (A10 is not in A100, L4 not in L40, T4 not in RTX 4090).
_ROWS: tuple[tuple[Any, ...], ...] = (
    # Blackwell: the NVIDIA HGX B200 and GB200 NVL72 datasheets, per GPU (the 8- and 72-GPU figures divided); SM
    # count and L2 of the B200 as the device reports them (148 SMs, 126 MiB), also for the GB200, whose GPU is the
    # same B200 chip at a higher clock and power (with no SM count the cost model estimated 223 SMs from the FP32
    # peak, left out the L2 term and priced the GB200 up to 14% slower than the B200 on convs and GEMMs)
    (("GB200",), "GB200 186GB (one GPU of an NVL72)", 80e12, 8.0e12, 186 * GiB, 148, 126 * MiB, 1.25e15, 2.5e15),
    (("B200",), "B200 180GB (HGX)", 75e12, 8.0e12, 180 * GiB, 148, 126 * MiB, 1.125e15, 2.25e15),
    # Hopper: NVIDIA H100 / H200 / GH200 datasheets; SXM unless the name says PCIe or NVL
    (("GH200",), "GH200 96GB", 67e12, 4.0e12, 96 * GiB, 132, 50 * MiB, 494.7e12, 989.4e12),
    (("H200", "NVL"), "H200 NVL", 60e12, 4.8e12, 141 * GiB, 132, 50 * MiB, 417.5e12, 835.5e12),
    # the H200 we measured: FP32 132 SMs x 128 lanes x 2 x 1.98 GHz (datasheet 67), memory and L2 as it reports them
    (("H200",), "H200 SXM 141GB", 66.9e12, 4.8e12, 150109880320, 132, 60 * MiB, 494.7e12, 989.4e12),
    (("H100", "PCIE"), "H100 PCIe 80GB", 51e12, 2.0e12, 80 * GiB, 114, 50 * MiB, 378e12, 756e12),
    (("H100", "NVL"), "H100 NVL 94GB", 60e12, 3.9e12, 94 * GiB, 132, 50 * MiB, 417.5e12, 835.5e12),
    (("H100",), "H100 SXM5 80GB", 67e12, 3.35e12, 80 * GiB, 132, 50 * MiB, 494.7e12, 989.4e12),
    # H800 / A800: the export variants of the H100 / A100 (NVLink cut to 400 GB/s, compute and memory the same)
    (("H800", "PCIE"), "H800 PCIe 80GB", 51e12, 2.0e12, 80 * GiB, 114, 50 * MiB, 378e12, 756e12),
    (("H800",), "H800 SXM5 80GB", 67e12, 3.35e12, 80 * GiB, 132, 50 * MiB, 494.7e12, 989.4e12),
    # H20: the export Hopper (NVIDIA's H20 product brief: 96 GB HBM3 at 4.0 TB/s, 60 MB L2; SMs not published)
    (("H20",), "H20 96GB", 44e12, 4.0e12, 96 * GiB, 0, 60 * MiB, 74e12, 148e12),
    # Ampere: NVIDIA A100 / A30 / A40 / A10 datasheets, the GA100 / GA102 whitepapers
    (("A100", "80GB", "PCIE"), "A100 80GB PCIe", 19.5e12, 1.935e12, 80 * GiB, 108, 40 * MiB, 156e12, 312e12),
    (("A100", "80GB"), "A100 SXM4 80GB", 19.5e12, 2.039e12, 80 * GiB, 108, 40 * MiB, 156e12, 312e12),
    (("A100",), "A100 40GB", 19.5e12, 1.555e12, 40 * GiB, 108, 40 * MiB, 156e12, 312e12),
    (("A800", "80GB", "PCIE"), "A800 80GB PCIe", 19.5e12, 1.935e12, 80 * GiB, 108, 40 * MiB, 156e12, 312e12),
    (("A800", "40GB"), "A800 40GB PCIe", 19.5e12, 1.555e12, 40 * GiB, 108, 40 * MiB, 156e12, 312e12),
    (("A800",), "A800 SXM4 80GB", 19.5e12, 2.039e12, 80 * GiB, 108, 40 * MiB, 156e12, 312e12),
    (("A30",), "A30 24GB", 10.3e12, 933e9, 24 * GiB, 56, 24 * MiB, 82e12, 165e12),
    (("A40",), "A40 48GB", 37.4e12, 696e9, 48 * GiB, 84, 6 * MiB, 74.8e12, 149.7e12),
    (("A10G",), "A10G 24GB (AWS G5; the A10's figures)", 31.2e12, 600e9, 24 * GiB, 72, 6 * MiB, 62.5e12, 125e12),
    (("A10",), "A10 24GB", 31.2e12, 600e9, 24 * GiB, 72, 6 * MiB, 62.5e12, 125e12),
    # A16 (per GPU of the board's four) and A2 datasheets: 1,280 CUDA cores (10 SMs) each; L2 not published
    (("A16",), "A16 16GB (one of the board's four GPUs)", 4.5e12, 200e9, 16 * GiB, 10, 0.0, 9e12, 17.9e12),
    (("A2",), "A2 16GB", 4.5e12, 200e9, 16 * GiB, 10, 0.0, 9e12, 18e12),
    (("A6000",), "RTX A6000 48GB", 38.7e12, 768e9, 48 * GiB, 84, 6 * MiB, 77.4e12, 154.8e12),
    # RTX A5000 / A4000 datasheets (workstation Ampere: tensor cores at the full rate)
    (("A5000",), "RTX A5000 24GB", 27.8e12, 768e9, 24 * GiB, 64, 6 * MiB, 55.6e12, 111.1e12),
    (("A4000",), "RTX A4000 16GB", 19.2e12, 448e9, 16 * GiB, 48, 4 * MiB, 38.4e12, 76.7e12),
    # GeForce Ampere (the GA102 / GA104 whitepaper; GeForce tensor cores: TF32 at the FP32 rate, BF16 twice it)
    (("RTX", "3090"), "GeForce RTX 3090 24GB", 35.6e12, 936e9, 24 * GiB, 82, 6 * MiB, 35.6e12, 71e12),
    (("RTX", "3080", "TI"), "GeForce RTX 3080 Ti 12GB", 34.1e12, 912e9, 12 * GiB, 80, 6 * MiB, 34.1e12, 68.2e12),
    (("RTX", "3080"), "GeForce RTX 3080 10GB", 29.8e12, 760e9, 10 * GiB, 68, 5 * MiB, 29.8e12, 59.5e12),
    (("RTX", "3070"), "GeForce RTX 3070 8GB", 20.3e12, 448e9, 8 * GiB, 46, 4 * MiB, 20.3e12, 40.6e12),
    # Ada: NVIDIA L40S / L40 / L4 / RTX 6000 Ada datasheets, the Ada whitepaper
    (("L40S",), "L40S 48GB", 91.6e12, 864e9, 48 * GiB, 142, 96 * MiB, 183e12, 366e12),
    (("L40",), "L40 48GB", 90.5e12, 864e9, 48 * GiB, 142, 96 * MiB, 90.5e12, 181e12),
    (("L4",), "L4 24GB", 30.3e12, 300e9, 24 * GiB, 58, 48 * MiB, 60e12, 121e12),
    # L20 datasheet: 11,776 CUDA cores (92 SMs), 48 GB GDDR6 at 864 GB/s; L2 not published
    (("L20",), "L20 48GB", 59.8e12, 864e9, 48 * GiB, 92, 0.0, 59.8e12, 119.5e12),
    (("6000", "ADA"), "RTX 6000 Ada 48GB", 91.1e12, 960e9, 48 * GiB, 142, 96 * MiB, 182.1e12, 364.2e12),
    (("RTX", "4090"), "GeForce RTX 4090 24GB", 82.6e12, 1.008e12, 24 * GiB, 128, 72 * MiB, 82.6e12, 165.2e12),
    (("RTX", "4080", "SUPER"), "GeForce RTX 4080 SUPER 16GB", 52.2e12, 736e9, 16 * GiB, 80, 64 * MiB, 52.2e12,
     104.4e12),
    (("RTX", "4080"), "GeForce RTX 4080 16GB", 48.7e12, 716.8e9, 16 * GiB, 76, 64 * MiB, 48.7e12, 97.5e12),
    # GeForce Blackwell (the RTX Blackwell whitepaper: FP16 / BF16 tensor peak with FP32 accumulate, dense)
    (("RTX", "5090"), "GeForce RTX 5090 32GB", 104.8e12, 1.792e12, 32 * GiB, 170, 96 * MiB, 104.8e12, 209.5e12),
    (("RTX", "5080"), "GeForce RTX 5080 16GB", 56.3e12, 960e9, 16 * GiB, 84, 64 * MiB, 56.3e12, 112.6e12),
    # Turing and Volta GeForce / Titan (the Turing and Volta whitepapers; FP16 tensor cores only: no TF32 / BF16;
    # GeForce Turing runs FP16 with FP32 accumulation at half its FP16-accumulate rate, the Titans at the full one)
    (("TITAN", "RTX"), "TITAN RTX 24GB", 16.3e12, 672e9, 24 * GiB, 72, 6 * MiB, 0.0, 0.0, 130.5e12),
    (("TITAN", "V"), "TITAN V 12GB", 14.9e12, 652.8e9, 12 * GiB, 80, 4.5 * MiB, 0.0, 0.0, 110e12),
    (("RTX", "2080", "TI"), "GeForce RTX 2080 Ti 11GB", 13.45e12, 616e9, 11 * GiB, 68, 5.5 * MiB, 0.0, 0.0,
     53.8e12),
    (("RTX", "2080", "SUPER"), "GeForce RTX 2080 SUPER 8GB", 11.15e12, 496e9, 8 * GiB, 48, 4 * MiB, 0.0, 0.0,
     44.6e12),
    (("RTX", "2080"), "GeForce RTX 2080 8GB", 10.07e12, 448e9, 8 * GiB, 46, 4 * MiB, 0.0, 0.0, 40.3e12),
    (("RTX", "2070", "SUPER"), "GeForce RTX 2070 SUPER 8GB", 9.06e12, 448e9, 8 * GiB, 40, 4 * MiB, 0.0, 0.0,
     36.3e12),
    (("RTX", "2070"), "GeForce RTX 2070 8GB", 7.46e12, 448e9, 8 * GiB, 36, 4 * MiB, 0.0, 0.0, 29.9e12),
    # Turing, Volta, Pascal, Kepler: NVIDIA T4 / V100 / P100 / P40 / P4 / K80 datasheets and whitepapers (no TF32 /
    # BF16 tensor cores; FP16 tensor cores on the T4 and V100; the P100's packed FP16 runs at twice the FP32 rate
    # with FP16 accumulation only, the other Pascal cards' FP16 at 1/64 of it, Kepler has none: 0, priced at FP32)
    (("T4",), "T4 16GB", 8.1e12, 320e9, 16 * GiB, 40, 4 * MiB, 0.0, 0.0, 65e12),
    (("V100S",), "V100S PCIe 32GB", 16.4e12, 1.134e12, 32 * GiB, 80, 6 * MiB, 0.0, 0.0, 130e12),
    (("V100", "PCIE", "32GB"), "V100 PCIe 32GB", 14e12, 900e9, 32 * GiB, 80, 6 * MiB, 0.0, 0.0, 112e12),
    (("V100", "PCIE"), "V100 PCIe 16GB", 14e12, 900e9, 16 * GiB, 80, 6 * MiB, 0.0, 0.0, 112e12),
    (("V100", "32GB"), "V100 SXM2 32GB", 15.7e12, 900e9, 32 * GiB, 80, 6 * MiB, 0.0, 0.0, 125e12),
    (("V100",), "V100 SXM2 16GB", 15.7e12, 900e9, 16 * GiB, 80, 6 * MiB, 0.0, 0.0, 125e12),
    (("P100", "12GB"), "P100 PCIe 12GB", 9.3e12, 549e9, 12 * GiB, 56, 3 * MiB, 0.0, 0.0, 0.0),
    (("P100", "PCIE"), "P100 PCIe 16GB", 9.3e12, 732e9, 16 * GiB, 56, 4 * MiB, 0.0, 0.0, 0.0),
    (("P100",), "P100 SXM2 16GB", 10.6e12, 732e9, 16 * GiB, 56, 4 * MiB, 0.0, 0.0, 0.0),
    (("P40",), "P40 24GB", 11.76e12, 346e9, 24 * GiB, 30, 3 * MiB, 0.0, 0.0),
    (("P4",), "P4 8GB", 5.5e12, 192e9, 8 * GiB, 20, 2 * MiB, 0.0, 0.0),
    # Pascal GeForce and Quadro (the GP102 / GP104 whitepaper and product pages)
    (("GTX", "1080", "TI"), "GeForce GTX 1080 Ti 11GB", 11.34e12, 484e9, 11 * GiB, 28, 2.75 * MiB, 0.0, 0.0),
    (("GTX", "1080"), "GeForce GTX 1080 8GB", 8.87e12, 320e9, 8 * GiB, 20, 2 * MiB, 0.0, 0.0),
    (("P4000",), "Quadro P4000 8GB", 5.3e12, 243e9, 8 * GiB, 14, 2 * MiB, 0.0, 0.0),
    (("GTX", "1050"), "GeForce GTX 1050 2GB", 1.862e12, 112e9, 2 * GiB, 5, 1 * MiB, 0.0, 0.0),
    (("K80",), "K80 (one of the board's two GPUs)", 4.37e12, 240e9, 12 * GiB, 13, 1.5 * MiB, 0.0, 0.0),
)


def _word(w: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Z0-9])" + re.escape(w) + r"(?![0-9])")


_TABLE = tuple((tuple(_word(w) for w in words), Datasheet(*rest)) for words, *rest in _ROWS)


def _normalise(name: str) -> str:
    up = name.upper().replace("_", " ").replace("-", " ")
    up = re.sub(r"(RTX|GTX)(?=\d)", r"\1 ", up)  # "rtx4090" -> "RTX 4090"
    up = re.sub(r"(?<=\d)(TI|SUPER)\b", r" \1", up)  # "2080Ti" -> "2080 TI"
    up = re.sub(r"(?<![A-Z0-9.])(\d{1,3}(?:\.\d+)?) ?G(?:I?B)?\b", r"\1GB", up)  # "80 GB", "32G", "80GiB" -> "80GB"
    up = re.sub(r"\b([A-Z]+\d+) ([A-Z])\b", r"\1\2", up)  # "L40-S" -> "L40S", "V100 S" -> "V100S"
    return re.sub(r"\bT4G\b", "T4", up)  # AWS's T4G (G5g instances) is a T4


# words that make a product another card than its base model (``RTX 3090 Ti``, ``RTX 4090 Laptop GPU``, ``DRIVE
# A100``, ``H100 CNX``): one that the matched row's own words do not hold is refused, not priced as the base card
_VARIANTS = re.compile(r"(?<![A-Z0-9])(TI|SUPER|LAPTOP|MOBILE|MAX ?Q|DRIVE|CNX)(?![A-Z0-9])")
# a MIG slice as torch names it (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``), read before ``_normalise`` makes 1g a size
_MIG = re.compile(r"(?<![A-Z0-9])MIG(?![A-Z0-9])(?: *(\d+G\.\d+GB))?")
# what may follow a model number without a space: a form factor, memory kind, Ti / SUPER, a count (``H100x8``);
# any other letters name a variant the table may not have (``A100X``)
_GLUE = re.compile(r"(SXM|PCIE|NVL|HBM|TI|SUPER)\d*E?|X\d+")
# memory sizes a row also answers to besides its own (GB): the GH200 names itself by its Grace memory
_ALSO_GB = {"GH200 96GB": (480.0,)}


def _model_word(words: tuple[str, ...]) -> str:
    """The model number among a row's words (``A100`` of A100 / 80GB / PCIE; ``3080`` of RTX / 3080 / TI)."""
    return next((w for w in words if any(c.isdigit() for c in w) and not w.endswith("GB")), words[0])


def _row_gb(sheet: Datasheet) -> float:
    m = re.search(r"(\d+)GB", sheet.product)
    return float(m.group(1)) if m else float(round(sheet.memory_bytes / GiB))


def _family(word: str) -> str:
    return f"{word} rows: " + ", ".join(sheet.product for row, (_, sheet) in zip(_ROWS, _TABLE)
                                         if _model_word(row[0]) == word)


def resolve(name: str) -> Datasheet | None:
    """The datasheet of the GPU product ``name``: the first row whose words all appear in it, None if none does.
    ``TopologyError`` (one line naming the product's rows) where the name contradicts that row: it states a memory
    size the row does not have, glues letters to the model number that are no variant the table knows, or holds a
    variant word (``_VARIANTS``) the row's words do not; and for a MIG slice (``_refuse_mig``)."""
    _refuse_mig(str(name))
    up = _normalise(str(name))
    for row, (patterns, sheet) in zip(_ROWS, _TABLE):
        if not all(w.search(up) for w in patterns):
            continue
        words = row[0]
        word = _model_word(words)
        variant = next((m.group(1) for m in _VARIANTS.finditer(up) if m.group(1) not in words), None)
        if variant is not None:
            raise TopologyError(f"GPU model '{name}': '{variant}' names a variant the table has no row for "
                                f"({_family(word)}); name one of them in 'model:', or give every figure on the device")
        glued = [m.group(1) for m in re.finditer(r"(?<![A-Z0-9])" + re.escape(word) + r"(?![0-9])([A-Z0-9]*)", up)]
        if glued and all(g and not _GLUE.fullmatch(g) and g not in words for g in glued):
            raise TopologyError(f"GPU model '{name}': '{word}{glued[0]}' is no {word} variant the table knows "
                                f"({_family(word)}); name one of them in 'model:', or give every figure on the device")
        stated = [float(x) for x in re.findall(r"(?<![A-Z0-9.])(\d+(?:\.\d+)?)GB\b", up)]
        ok = (_row_gb(sheet),) + _ALSO_GB.get(sheet.product, ())
        bad = next((x for x in stated if x not in ok), None)
        if bad is not None:
            raise TopologyError(f"GPU model '{name}' says {bad:g} GB, but its row '{sheet.product}' is "
                                f"{_row_gb(sheet):g} GB ({_family(word)}); name one of them in 'model:', or give "
                                "every figure on the device")
        return sheet
    return None


def _refuse_mig(name: str) -> None:
    """``TopologyError`` for a MIG slice's name: the slice has a part of the card's SMs, memory and bandwidth, which
    no row gives (``_normalise`` would read its ``1g`` as a memory size and say the name contradicts the card)."""
    m = _MIG.search(name.upper().replace("_", " ").replace("-", " "))
    if m:
        profile = f" ({m.group(1).lower()})" if m.group(1) else ""
        raise TopologyError(f"GPU model '{name}' is a MIG slice{profile}, a part of the card that its datasheet row "
                            "does not describe: give the slice's own figures on the device (peak_flops, mem_bandwidth, "
                            "memory_bytes; sm_count, l2_bytes and the tensor-core peaks where known) and name the full "
                            "card in 'architecture:' rather than 'model:'")


def lookup(name: str) -> Datasheet | None:
    """The datasheet of the GPU product ``name`` (None if the table does not know it, or ``resolve`` refuses it)."""
    try:
        return resolve(name)
    except TopologyError:
        return None


def nearest(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` names the table knows (each row's words, e.g. ``H100 PCIE``) closest to ``name`` (difflib,
    spaces and the vendor's brand words left out), for the error on an unknown model; [] when none is close."""
    known = {" ".join(words): "".join(words) for words, *_ in _ROWS}
    key = re.sub(r"\b(NVIDIA|TESLA|GEFORCE|QUADRO)\b|\s", "", _normalise(str(name)))
    close = difflib.get_close_matches(key, list(known.values()), n=n, cutoff=0.6)
    return [next(k for k, v in known.items() if v == c) for c in close]


def products() -> list[str]:
    return [sheet.product for _, sheet in _TABLE]


__all__ = ["Datasheet", "lookup", "nearest", "products", "resolve"]
