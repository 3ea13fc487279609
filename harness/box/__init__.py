"""Runs on the box: probe, plan and the sweep job (stdlib + torch + triton only)."""

import os
from pathlib import Path

# What ``--box-install`` puts in BOX_DIR/venv (and the ``box`` extra of pyproject.toml pins):
# the versions the kernels and timings were checked with on an H200.
BOX_PINS = ("torch==2.11.0", "triton==3.6.0", "numpy<2.3")


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere): the budget counts the
    job's own start-up (imports, probe, pool build) too."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
