"""What the box is: its card, regime and software versions (``python -m harness.box probe``)."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from typing import Any

from harness.cards import DEPLOYABLE, INTERPRET, INTERPRETER, Card, canonicalize
from harness.contract import BoxGpus, LaneError, format_box_gpus

# Test seam: a CPU box may report another card's name.  Its rows stay labelled interpret.
CARD_NAME_ENV = "EMMY_BOX_CARD_NAME"
# Force the interpreter even where a GPU exists (debugging a kernel on the box by hand).
FORCE_INTERPRET_ENV = "EMMY_FORCE_INTERPRET"


def _nvidia_smi_lines(fields: str, *extra: str, run: Any = subprocess.run) -> list[str]:
    """nvidia-smi's CSV lines for ``fields`` (one per GPU); [] without nvidia-smi."""
    try:
        out = run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                   *extra], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line for line in out.stdout.splitlines() if line.strip()]


def _nvidia_smi(fields: str) -> list[str]:
    """``fields`` of the first GPU of the machine."""
    lines = _nvidia_smi_lines(fields, "-i", "0")
    return [v.strip() for v in lines[0].split(",")] if lines else []


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


# -- measuring lanes: one bench worker per GPU of the box (``--box-gpus``) -------------------------
@dataclass(frozen=True)
class Lane:
    """One measuring lane of the box: its number (0, 1, …; rows say it as ``lane``) and the GPU
    its bench worker is pinned to.  ``gpu_index`` None: the box's default device (one lane, as
    ever) or the interpreter on the CPU."""

    index: int
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    gpu_name: str | None = None

    def env(self) -> dict[str, str]:
        """The environment that pins the lane's worker to its GPU.  By UUID where it is known:
        CUDA's own order of devices need not be nvidia-smi's."""
        if self.gpu_uuid:
            return {"CUDA_VISIBLE_DEVICES": self.gpu_uuid}
        if self.gpu_index is not None:
            return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(self.gpu_index)}
        return {}

    def describe(self) -> str:
        if self.gpu_index is None:
            return f"lane {self.index}"
        return f"lane {self.index} on GPU {self.gpu_index} ({self.gpu_uuid or self.gpu_name})"


ONE_LANE = (Lane(0),)


def list_gpus(run: Any = subprocess.run) -> list[tuple[int, str, str]]:
    """The box's GPUs as nvidia-smi lists them: (index, name, uuid); [] without nvidia-smi."""
    gpus = []
    for line in _nvidia_smi_lines("index,name,uuid", run=run):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            gpus.append((int(parts[0]), ",".join(parts[1:-1]), parts[-1]))
    return gpus


def gpu_lanes(want: BoxGpus, listed: list[tuple[int, str, str]]) -> tuple[Lane, ...]:
    """The lanes ``--box-gpus`` asks for among the box's GPUs (``list_gpus``).  One lane
    (``1``) is the box's default device, pinned to nothing, as a box of one GPU always was."""
    if want == 1:
        return ONE_LANE
    value = format_box_gpus(want)
    have = ", ".join(str(i) for i, _, _ in listed) or "none"
    if not listed:
        raise LaneError(f"--box-gpus={value}: nvidia-smi lists no GPU on this box; give "
                        "--box-gpus=1 (the default)")
    if want == "all":
        chosen = listed
    elif isinstance(want, int):
        if want > len(listed):
            raise LaneError(f"--box-gpus={value}: this box has {len(listed)} GPU(s) ({have}); "
                            f"give at most --box-gpus={len(listed)}, or --box-gpus=all")
        chosen = listed[:want]
    else:
        by_index = {g[0]: g for g in listed}
        missing = [i for i in want if i not in by_index]
        if missing:
            raise LaneError(f"--box-gpus={value}: no GPU {', '.join(map(str, missing))} on this "
                            f"box; its GPUs are {have}")
        chosen = [by_index[i] for i in want]
    return tuple(Lane(n, index, uuid or None, name)
                 for n, (index, name, uuid) in enumerate(chosen))


def cpu_lanes(want: BoxGpus) -> tuple[Lane, ...]:
    """On a box without a GPU the interpreter stands in: ``N`` lanes are N interpreter
    workers, ``all`` is one."""
    if isinstance(want, tuple):
        raise LaneError(f"--box-gpus={format_box_gpus(want)} names GPU indices, but this box "
                        "measures on the CPU (the Triton interpreter); give a number of lanes, "
                        "e.g. --box-gpus=2")
    n = 1 if want == "all" else int(want)
    return tuple(Lane(i) for i in range(n))


def check_lanes_card(lanes: tuple[Lane, ...], card: Card) -> None:
    """Every lane's GPU is the box's card (the merge labels their rows with it): a GPU of
    another card is refused, naming the GPUs of the box's card."""
    other = []
    for lane in lanes:
        if lane.gpu_name is None:
            continue
        known = canonicalize(lane.gpu_name)
        if (known.name if known else " ".join(lane.gpu_name.split())) != card.name:
            other.append(lane)
    if other:
        same = [str(lane.gpu_index) for lane in lanes if lane not in other]
        fix = (f"name the GPUs of that card, e.g. --box-gpus={','.join(same)}"
               + ("," if len(same) == 1 else "")) if same else "give --box-gpus=1"
        names = "; ".join(f"GPU {lane.gpu_index} is {lane.gpu_name}" for lane in other)
        raise LaneError(f"--box-gpus: {names}, not the box's card {card.name}; one box measures "
                        f"one card: {fix}")
