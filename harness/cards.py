"""The card catalog: canonical GPU names, aliases, and the attributes kinds and priors need.

A *card* is one GPU model.  Its canonical name is the ``gpu`` column of the node table, so
two cards never share a name and one DB holds every card.  ``--gpu`` takes an alias; a box
reports a live device name that :func:`canonicalize` maps back to its catalog entry.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from typing import Any

KIB = 1024
MIB = 1024 * KIB

DEPLOYABLE = "deployable"
INTERPRET = "interpret"


class UnknownCardError(ValueError):
    """An alias or device name that is not in the catalog."""


@dataclass(frozen=True)
class Card:
    """One GPU model and the limits that decide which kernel configurations realize on it."""

    name: str
    aliases: tuple[str, ...]
    cc: tuple[int, int]
    sm_count: int
    smem_optin: int  # bytes of shared memory one block may opt into
    smem_per_sm: int
    l2_bytes: int
    mem_gb: float
    mem_bw_gbs: float
    peak_fp16_tflops: float  # dense tensor-core rate
    peak_fp32_tflops: float
    device_names: tuple[str, ...] = ()  # other names the driver reports for it
    regs_per_block: int = 65536
    regs_per_sm: int = 65536
    max_threads_per_block: int = 1024
    warp_size: int = 32
    regime: str = DEPLOYABLE
    tc_gen: int = field(default=0)

    @property
    def alias(self) -> str:
        return self.aliases[0]

    def features(self) -> dict[str, float | int]:
        """The ``H_*`` card attributes a prior may see."""
        return {
            "H_cc": self.cc[0] * 10 + self.cc[1],
            "H_tc_gen": self.tc_gen,
            "H_sm_count": self.sm_count,
            "H_smem_optin": self.smem_optin,
            "H_smem_per_sm": self.smem_per_sm,
            "H_regs_per_block": self.regs_per_block,
            "H_warp_size": self.warp_size,
            "H_l2_bytes": self.l2_bytes,
            "H_total_mem_gb": self.mem_gb,
            "H_mem_bw_gbs": self.mem_bw_gbs,
            "H_peak_fp16_tflops": self.peak_fp16_tflops,
            "H_peak_fp32_tflops": self.peak_fp32_tflops,
        }


def _card(name: str, aliases: tuple[str, ...], cc: tuple[int, int], **kw: object) -> Card:
    tc_gen = {7: 1, 8: 3, 9: 4, 10: 5, 12: 5}.get(cc[0], 0)
    if cc == (8, 9):
        tc_gen = 4  # Ada: fp8 tensor cores, no wgmma
    return Card(name=name, aliases=aliases, cc=cc, tc_gen=tc_gen, **kw)  # type: ignore[arg-type]


# Limits from the vendors' data sheets (NVIDIA product briefs and data sheets; the A10G, a
# cloud-only variant, from AWS's G5 documentation): SMs, memory and bandwidth, L2, and the
# dense (no sparsity) FP16 tensor-core and FP32 rates.  Shared memory per SM and per block
# follow the compute capability (CUDA programming guide): 8.0 164/163 KiB, 8.6 and 8.9 100/99,
# 9.0 and 10.0 228/227, 12.0 100/99.
_ADA = {"smem_optin": 99 * KIB, "smem_per_sm": 100 * KIB}
_AMPERE_GA10X = {"smem_optin": 99 * KIB, "smem_per_sm": 100 * KIB}
_A100 = {"smem_optin": 163 * KIB, "smem_per_sm": 164 * KIB, "sm_count": 108, "l2_bytes": 40 * MIB,
         "peak_fp16_tflops": 312.0, "peak_fp32_tflops": 19.5}
_HOPPER = {"smem_optin": 227 * KIB, "smem_per_sm": 228 * KIB}
_PRO6000 = {"sm_count": 188, "smem_optin": 99 * KIB, "smem_per_sm": 100 * KIB, "l2_bytes": 128 * MIB,
            "mem_gb": 96, "mem_bw_gbs": 1792, "peak_fp16_tflops": 503.8, "peak_fp32_tflops": 126.0}

CATALOG: tuple[Card, ...] = (
    _card("NVIDIA L40S", ("l40s",), (8, 9), sm_count=142, l2_bytes=96 * MIB, mem_gb=48,
          mem_bw_gbs=864, peak_fp16_tflops=362.0, peak_fp32_tflops=91.6, **_ADA),
    _card("NVIDIA L40", ("l40",), (8, 9), sm_count=142, l2_bytes=96 * MIB, mem_gb=48,
          mem_bw_gbs=864, peak_fp16_tflops=181.0, peak_fp32_tflops=90.5, **_ADA),
    _card("NVIDIA L4", ("l4",), (8, 9), sm_count=58, l2_bytes=48 * MIB, mem_gb=24,
          mem_bw_gbs=300, peak_fp16_tflops=121.0, peak_fp32_tflops=30.3, **_ADA),
    _card("NVIDIA RTX 6000 Ada Generation", ("rtx6000-ada", "rtx6000ada"), (8, 9), sm_count=142,
          l2_bytes=96 * MIB, mem_gb=48, mem_bw_gbs=960, peak_fp16_tflops=182.2,
          peak_fp32_tflops=91.1, **_ADA),
    _card("NVIDIA A10G", ("a10g",), (8, 6), sm_count=80, l2_bytes=6 * MIB, mem_gb=24,
          mem_bw_gbs=600, peak_fp16_tflops=70.0, peak_fp32_tflops=31.2, **_AMPERE_GA10X),
    _card("NVIDIA A10", ("a10",), (8, 6), sm_count=72, l2_bytes=6 * MIB, mem_gb=24,
          mem_bw_gbs=600, peak_fp16_tflops=125.0, peak_fp32_tflops=31.2, **_AMPERE_GA10X),
    _card("NVIDIA RTX A6000", ("rtxa6000", "a6000"), (8, 6), sm_count=84, l2_bytes=6 * MIB,
          mem_gb=48, mem_bw_gbs=768, peak_fp16_tflops=154.8, peak_fp32_tflops=38.7,
          **_AMPERE_GA10X),
    _card("NVIDIA H100 80GB", ("h100", "h100-80", "h100-sxm"), (9, 0), sm_count=132,
          l2_bytes=50 * MIB, mem_gb=80, mem_bw_gbs=3350, peak_fp16_tflops=989.0,
          peak_fp32_tflops=67.0, device_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100"), **_HOPPER),
    _card("NVIDIA H100 PCIe", ("h100-pcie",), (9, 0), sm_count=114, l2_bytes=50 * MIB, mem_gb=80,
          mem_bw_gbs=2000, peak_fp16_tflops=756.0, peak_fp32_tflops=51.0, **_HOPPER),
    _card("NVIDIA H100 NVL", ("h100-nvl",), (9, 0), sm_count=132, l2_bytes=50 * MIB, mem_gb=94,
          mem_bw_gbs=3900, peak_fp16_tflops=835.0, peak_fp32_tflops=60.0, **_HOPPER),
    _card("NVIDIA H200 141GB", ("h200",), (9, 0), sm_count=132, l2_bytes=60 * MIB, mem_gb=141,
          mem_bw_gbs=4800, peak_fp16_tflops=989.0, peak_fp32_tflops=67.0,
          device_names=("NVIDIA H200",), **_HOPPER),
    _card("NVIDIA H20", ("h20",), (9, 0), sm_count=78, l2_bytes=60 * MIB, mem_gb=96,
          mem_bw_gbs=4000, peak_fp16_tflops=148.0, peak_fp32_tflops=44.0, **_HOPPER),
    _card("NVIDIA GH200 480GB", ("gh200",), (9, 0), sm_count=132, l2_bytes=50 * MIB, mem_gb=96,
          mem_bw_gbs=4000, peak_fp16_tflops=989.0, peak_fp32_tflops=67.0,
          device_names=("NVIDIA GH200",), **_HOPPER),
    _card("NVIDIA A100 40GB", ("a100-40", "a100"), (8, 0), mem_gb=40, mem_bw_gbs=1555,
          device_names=("NVIDIA A100-SXM4-40GB",), **_A100),
    _card("NVIDIA A100 80GB", ("a100-80",), (8, 0), mem_gb=80, mem_bw_gbs=2039,
          device_names=("NVIDIA A100-SXM4-80GB",), **_A100),
    _card("NVIDIA A100-PCIE-40GB", ("a100-40-pcie",), (8, 0), mem_gb=40, mem_bw_gbs=1555, **_A100),
    _card("NVIDIA A100 80GB PCIe", ("a100-80-pcie", "a100-pcie"), (8, 0), mem_gb=80,
          mem_bw_gbs=1935, **_A100),
    _card("NVIDIA GeForce RTX 4090", ("rtx4090", "4090"), (8, 9), sm_count=128,
          l2_bytes=72 * MIB, mem_gb=24, mem_bw_gbs=1008, peak_fp16_tflops=330.3,
          peak_fp32_tflops=82.6, **_ADA),
    _card("NVIDIA GeForce RTX 5090", ("rtx5090", "5090"), (12, 0), sm_count=170,
          smem_optin=99 * KIB, smem_per_sm=100 * KIB, l2_bytes=96 * MIB, mem_gb=32,
          mem_bw_gbs=1792, peak_fp16_tflops=419.0, peak_fp32_tflops=104.8),
    _card("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", ("rtxpro6000",), (12, 0),
          **_PRO6000),
    _card("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", ("rtxpro6000-maxq",),
          (12, 0), **{**_PRO6000, "peak_fp16_tflops": 438.9, "peak_fp32_tflops": 110.0}),
    _card("NVIDIA RTX PRO 6000 Blackwell Server Edition", ("rtxpro6000-server",), (12, 0),
          **{**_PRO6000, "mem_bw_gbs": 1597}),
    _card("NVIDIA B200", ("b200",), (10, 0), sm_count=148, smem_optin=227 * KIB,
          smem_per_sm=228 * KIB, l2_bytes=126 * MIB, mem_gb=180, mem_bw_gbs=8000,
          peak_fp16_tflops=2250.0, peak_fp32_tflops=80.0),
    # Triton's CPU interpreter: the whole pipeline runs on a machine with no GPU.  Its rows
    # are labelled ``interpret`` and never trained on; its "limits" are generous so that the
    # small interpret pools all realize.
    Card(name="Triton CPU interpreter", aliases=("interpret", "cpu"), cc=(0, 0), sm_count=1,
         smem_optin=1024 * KIB, smem_per_sm=1024 * KIB, l2_bytes=0, mem_gb=0.0,
         mem_bw_gbs=0.0, peak_fp16_tflops=0.0, peak_fp32_tflops=0.0,
         regs_per_block=1 << 20, regs_per_sm=1 << 20, regime=INTERPRET),
)

INTERPRETER = CATALOG[-1]

# --gpu values that name no card: the box decides.
AUTO = "auto"
LOCAL = "local"


def aliases() -> list[str]:
    return [a for c in CATALOG for a in c.aliases]


def by_alias(alias: str) -> Card:
    """The card an alias (or canonical name) names; unknown → an error listing the valid ones."""
    key = alias.strip().lower()
    for card in CATALOG:
        if key in card.aliases or key == card.name.lower():
            return card
    near = difflib.get_close_matches(key, [*aliases(), AUTO, LOCAL], n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UnknownCardError(
        f"unknown card {alias!r}; {hint}valid aliases: {', '.join(aliases())} "
        f"(or '{AUTO}' to accept the box's card, '{LOCAL}' to use this machine)"
    )


def by_name(name: str) -> Card:
    """The catalog entry with this canonical name (as stored in the ``gpu`` column)."""
    for card in CATALOG:
        if card.name == name:
            return card
    raise UnknownCardError(f"no card named {name!r} in the catalog")


def canonicalize(device_name: str) -> Card | None:
    """Map a live device name (``torch.cuda.get_device_name()``) to its catalog card.

    ``NVIDIA H200`` is the H200 entry; an exact canonical name or a listed driver name wins,
    then an alias appearing as a word of the name (``NVIDIA L40S`` → l40s).  None when the
    card is not in the catalog.
    """
    norm = " ".join(device_name.split()).lower()
    for card in CATALOG:
        if norm == card.name.lower() or norm in (d.lower() for d in card.device_names):
            return card
    words = set(re.split(r"[\s\-_]+", norm))
    if words & {"pcie", "nvl"}:
        return None  # a variant with other SM counts or clocks: only listed names are trusted
    matches = [c for c in CATALOG if c.regime == DEPLOYABLE and _model_token(c) in words]
    if len(matches) > 1:  # the A100 comes in two memory sizes: the name says which
        sized = [c for c in matches if f"{int(c.mem_gb)}gb" in words]
        matches = sized or [c for c in matches if c.mem_gb == min(m.mem_gb for m in matches)]
    return matches[0] if matches else None


def _model_token(card: Card) -> str:
    return [w for w in card.name.lower().split() if w not in ("nvidia", "geforce", "rtx")][0]


def parse_gpu_option(value: str) -> list[str]:
    """Split ``--gpu`` (an alias, a comma list, ``auto`` or ``local``); validate each alias."""
    items = [v.strip().lower() for v in value.split(",") if v.strip()]
    if not items:
        raise UnknownCardError(f"--gpu={value!r} names no card; valid: {', '.join(aliases())}, auto, local")
    for item in items:
        if item in (AUTO, LOCAL):
            if len(items) > 1:
                raise UnknownCardError(
                    f"--gpu={value!r}: '{item}' cannot be combined with other cards"
                )
            continue
        by_alias(item)
    return items


def card_from_probe(info: dict[str, Any]) -> Card:
    """The catalog card for a probe; an uncatalogued GPU gets an entry from its live limits."""
    if info["regime"] == INTERPRET:
        if info["card"] == INTERPRETER.name:
            return INTERPRETER
        # a CPU box labelled as another card (test seam): that name, the interpreter's limits
        return replace(INTERPRETER, name=info["card"])
    card = canonicalize(info["device_name"])
    if card is not None:
        return card
    slug = re.sub(r"[^a-z0-9]+", "-", info["device_name"].lower()).strip("-")
    smem = info.get("smem_optin") or 48 * 1024
    return Card(name=info["device_name"], aliases=(slug,), cc=tuple(info["cc"]),  # type: ignore[arg-type]
                sm_count=info["sm_count"], smem_optin=smem,
                smem_per_sm=info.get("smem_per_sm") or smem, l2_bytes=info.get("l2_bytes") or 0,
                mem_gb=(info.get("mem_bytes") or 0) / 1e9, mem_bw_gbs=0.0,
                peak_fp16_tflops=0.0, peak_fp32_tflops=0.0)
