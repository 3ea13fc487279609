"""Runs on the box: probe, plan, the session service and its jobs (stdlib + torch + triton
only; of this project, the pure core and :mod:`harness.contract`)."""

import os
from pathlib import Path


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere): the budget counts the
    job's own start-up (imports, probe, pool build) too."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
