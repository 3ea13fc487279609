"""Other cards' anchors from public tuned configs: vLLM's per-device Triton GEMM configs.

vLLM ships, per device, the configurations it tuned for its fused MoE GEMM kernel
(``vllm/model_executor/layers/fused_moe/configs/E=…,N=…,device_name=….json``), keyed by the
number of tokens M: ``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``.
Mapped onto the matmul-like kinds' knobs for each golden shape (the entry of the nearest M
key), they are anchors of cards this project may never have measured, so a card's cross slice
holds real neighbours and ``transfer`` has other cards' choices to go by.

:data:`TABLES` holds, per device, the file it comes from (repository, path, commit) and the
entries of the M keys the golden shapes use (16, 2048, 4096), as published.  The dense files
(``E=1``) are taken where vLLM has one for the device; else the file with the fewest experts.
``python -m harness.goldens.vllm`` writes ``anchors/vllm-<card>.json`` from them.

A tile larger than the problem is clamped to it, and a ``GROUP_SIZE_M`` at least the number of
M tiles becomes the smallest group that holds them all (the same launch order): the knob
spaces hold one spelling of each configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import goldens, shipped
from harness.cards import DEPLOYABLE, Card, by_alias
from harness.goldens import Anchor
from harness.points import make_spec

REPOSITORY = "github.com/vllm-project/vllm"
GEMM_KINDS = ("matmul", "mlp_geglu", "norm_linear", "linear_norm")

# card alias → (path under vllm/model_executor/layers/fused_moe/configs/, commit,
#               {M key: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps,
#                        num_stages)})
TABLES: dict[str, tuple[str, str, dict[int, tuple[int, int, int, int, int, int]]]] = {
    "a100-80": ("E=1,N=14336,device_name=NVIDIA_A100-SXM4-80GB.json",
                "e5fd201ab77b993462f5b1cc3e55c74dc74bed95",
                {16: (16, 64, 256, 64, 4, 4), 2048: (128, 128, 64, 32, 4, 3),
                 4096: (128, 128, 64, 16, 4, 3)}),
    "h100": ("E=1,N=3072,device_name=NVIDIA_H100_80GB_HBM3.json",
             "2e1874a69789693aebe17031e59bdd7859fb83bf",
             {16: (16, 64, 256, 1, 4, 3), 2048: (128, 128, 64, 16, 4, 3),
              4096: (128, 128, 64, 16, 4, 3)}),
    "h200": ("E=8,N=14336,device_name=NVIDIA_H200.json",
             "432a38c440655622ff7875c4877f0756c44e1fbf",
             {16: (16, 64, 256, 16, 4, 3), 2048: (128, 256, 64, 32, 8, 4),
              4096: (128, 256, 64, 16, 8, 4)}),
    "l40s": ("E=128,N=1856,device_name=NVIDIA_L40S.json",
             "b4ba912cbbdeb65d05ad41f990a7b5f3dd61ecfa",
             {16: (32, 64, 256, 16, 4, 3), 2048: (64, 128, 256, 64, 8, 2),
              4096: (128, 128, 128, 32, 8, 2)}),
    "rtx4090": ("E=128,N=352,device_name=NVIDIA_GeForce_RTX_4090.json",
                "dbc9fb1cbeec8386578398f1b6d411b564470a91",
                {16: (16, 64, 128, 1, 4, 4), 2048: (64, 128, 64, 1, 8, 3),
                 4096: (64, 128, 64, 1, 8, 3)}),
    "b200": ("E=128,N=1024,device_name=NVIDIA_B200.json",
             "47c4439a3b8ab40b269567c372569c11903a8024",
             {16: (16, 64, 128, 32, 4, 3), 2048: (128, 256, 64, 32, 8, 4),
              4096: (256, 256, 64, 16, 8, 3)}),
}
CONFIG_DIR = "vllm/model_executor/layers/fused_moe/configs"


def nearest_key(m: int, keys: Any) -> int:
    """The M key nearest ``m`` (on a log scale; the smaller on a tie)."""
    return min(sorted(keys), key=lambda k: abs(math.log(k) - math.log(max(1, m))))


def to_knobs(kind: str, shape: Mapping[str, Any], cfg: tuple[int, ...]) -> dict[str, Any]:
    """One vLLM entry as ``kind``'s knobs for ``shape`` (:func:`harness.shipped.gemm_knobs`)."""
    bm, bn, bk, group, warps, stages = cfg  # vLLM's order
    return shipped.gemm_knobs(kind, shape, bm=bm, bn=bn, bk=bk, group=group, warps=warps,
                              stages=stages)


def anchors_for(alias: str, shapes: list[goldens.GoldenShape] | None = None) -> list[Anchor]:
    """The anchors of the card ``alias`` names, one per golden shape of the matmul-like
    kinds that its card can run."""
    from harness import kinds as registry

    path, commit, table = TABLES[alias]
    card: Card = by_alias(alias)
    out = []
    for g in shapes if shapes is not None else goldens.shapes(DEPLOYABLE, kinds=list(GEMM_KINDS)):
        if g.kind not in GEMM_KINDS:
            continue
        key = nearest_key(g.shape["M"], table)
        knobs = to_knobs(g.kind, g.shape, table[key])
        if registry.get(g.kind).unrealizable(knobs, g.shape, card) is not None:
            continue
        out.append(Anchor(gpu=card.name, kind=g.kind, shape_id=g.shape_id, spec=make_spec(knobs),
                          source=f"{REPOSITORY} {CONFIG_DIR}/{path}@{commit[:12]} M={key}"))
    return out


def write(out_dir: Path | None = None) -> list[Path]:
    """``anchors/vllm-<alias>.json`` for every device of :data:`TABLES`."""
    out_dir = out_dir or goldens.ANCHOR_DIR
    written = []
    for alias, (path, commit, _) in TABLES.items():
        found = anchors_for(alias)
        target = out_dir / f"vllm-{alias}.json"
        goldens.write_anchor_file(
            target, by_alias(alias).name, found,
            f"Anchors of {by_alias(alias).name} from vLLM's tuned fused-MoE GEMM configs "
            f"({REPOSITORY}, {CONFIG_DIR}/{path}, commit {commit}), the entry of the nearest M "
            "key for each golden shape of the matmul-like kinds (python -m harness.goldens.vllm).")
        written.append(target)
    return written


if __name__ == "__main__":
    for p in write():
        print(p)
