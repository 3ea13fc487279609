"""What the box is: its card, regime and software versions (``python -m harness.box probe``)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from typing import Any

from harness.cards import DEPLOYABLE, INTERPRET, INTERPRETER, Card, canonicalize

# Test seam: a CPU box may report another card's name.  Its rows stay labelled interpret.
CARD_NAME_ENV = "EMMY_BOX_CARD_NAME"
# Force the interpreter even where a GPU exists (debugging a kernel on the box by hand).
FORCE_INTERPRET_ENV = "EMMY_FORCE_INTERPRET"


def _nvidia_smi(fields: str) -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [v.strip() for v in out.stdout.strip().split(",")]


def probe() -> dict[str, Any]:
    """Probe the box.  Imports torch (never triton), so it is safe before the regime is set."""
    import torch

    versions: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        from importlib.metadata import version

        versions["triton"] = version("triton")
    except Exception:  # noqa: BLE001 - reported as missing, setup decides what that means
        versions["triton"] = None
    info: dict[str, Any] = {"versions": versions, "host": platform.node()}
    if torch.cuda.is_available() and not os.environ.get(FORCE_INTERPRET_ENV):
        props = torch.cuda.get_device_properties(0)
        versions["cuda"] = torch.version.cuda
        smi = _nvidia_smi("driver_version,uuid")
        versions["driver"] = smi[0] if smi else None
        card = canonicalize(props.name)
        info.update(
            regime=DEPLOYABLE, device_name=props.name, known_card=card is not None,
            card=card.name if card else props.name,
            cc=[props.major, props.minor], sm_count=props.multi_processor_count,
            smem_optin=getattr(props, "shared_memory_per_block_optin", None),
            smem_per_sm=getattr(props, "shared_memory_per_multiprocessor", None),
            l2_bytes=getattr(props, "L2_cache_size", None),
            mem_bytes=props.total_memory,
            # nvidia-smi -i 0 is the first GPU of the machine, CUDA's device 0 only when
            # CUDA_VISIBLE_DEVICES leaves it so
            gpu_uuid=((smi[1] if len(smi) > 1 else None)
                      if not os.environ.get("CUDA_VISIBLE_DEVICES") else None) or _uuid(props),
        )
    else:
        name = os.environ.get(CARD_NAME_ENV) or INTERPRETER.name
        info.update(regime=INTERPRET, device_name="cpu", known_card=True, card=name,
                    cc=list(INTERPRETER.cc), sm_count=os.cpu_count() or 1, smem_optin=None,
                    smem_per_sm=None, l2_bytes=None, mem_bytes=None, gpu_uuid=None)
    return info


def _uuid(props: Any) -> str | None:
    """The UUID of CUDA's device 0 as NVML and nvidia-smi write it (``GPU-…``); unlike
    ``nvidia-smi -i 0`` this follows ``CUDA_VISIBLE_DEVICES``."""
    raw = getattr(props, "uuid", None)
    if not raw:
        return None
    text = str(raw)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def card_from_probe(info: dict[str, Any]) -> Card:
    """The catalog card for a probe; an uncatalogued GPU gets an entry from its live limits."""
    if info["regime"] == INTERPRET:
        if info["card"] == INTERPRETER.name:
            return INTERPRETER
        # a CPU box labelled as another card (test seam): that name, the interpreter's limits
        from dataclasses import replace

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
