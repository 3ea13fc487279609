"""``python -m harness status``: a box's session as the box has it, from any terminal.

Reads the box folder (this machine's, or a ``--remote`` server's over SSH) in a few short calls
and touches nothing: the box's lock, the session the folder's service runs or ran last
(``current-session.json``, its ``status.json``), whether its tmux session is alive, and the
last lines of ``sweep.log`` (kept on the box until the next run starts a session).  Where the
session is a Slurm batch job's (``--provider slurm``: the box folder is a card's on the
cluster's shared filesystem, read from the login node), what ``squeue`` says of the job stands
in for tmux: its id, its state, its node, and while it waits the reason ``squeue`` gives.
"""

from __future__ import annotations

import json
import time
from typing import Any

from harness.boxctl import CURRENT_SESSION, BoxDriver, BoxError
from harness.contract import Layout, SessionStatus
from harness.owner import Owner
from harness.progress import format_us
from harness.remote.slurm import Slurm, SlurmError


def box_status(driver: BoxDriver, lines: int = 10) -> dict[str, Any]:
    """What the box folder says of its session, as plain values (``--json`` prints them).
    ``alive``: the tmux session runs, or, for a Slurm job (``slurm``), the job may still run
    the session."""
    out: dict[str, Any] = {"box": driver.transport.name, "box_dir": driver.base,
                           "tmux_session": driver.sweep_session, "lock": None,
                           "session": None, "alive": False, "slurm": None, "log": []}
    if driver.transport.run(["test", "-d", driver.base], check=False, timeout=60).rc != 0:
        out["error"] = f"no box folder {driver.base} on {driver.transport.name}"
        return out
    try:
        cur = driver.read_json(driver.path(CURRENT_SESSION))
    except (BoxError, ValueError):
        cur = None
    job_id = cur.get("slurm_job") if isinstance(cur, dict) else None
    if isinstance(job_id, str):
        out["tmux_session"] = None
        out["slurm"] = _slurm_job(driver, job_id)
        out["alive"] = out["slurm"]["alive"]
    else:
        out["alive"] = driver.tmux.alive(driver.sweep_session)
    try:
        lock_text = driver.transport.run(["cat", driver.path("lock.json")], check=False,
                                         timeout=60).stdout.strip()
        age = driver.transport.run(["stat", "-c", "%Y", driver.path("lock.json")], check=False,
                                   timeout=60).stdout.strip()
        if lock_text:
            owner = Owner.from_data(json.loads(lock_text))
            out["lock"] = {"holder": owner.describe() if owner else lock_text[:200],
                           "touched_s_ago": round(time.time() - int(age)) if age.isdigit() else None}
    except ValueError:
        out["lock"] = {"holder": "unreadable lock.json", "touched_s_ago": None}
    try:
        if not isinstance(cur, dict):
            raise ValueError("no current session")
        layout = Layout(driver.base, str(cur["run_id"]), str(cur["session_id"]))
        status = SessionStatus.from_json(
            driver.transport.run(["cat", layout.service("status.json")], check=False,
                                 timeout=60).stdout)
    except (BoxError, ValueError, TypeError, KeyError):
        status = None
    if status is not None:
        out["session"] = json.loads(status.to_json())
    out["log"] = driver.tail(driver.path("sweep.log"), lines).splitlines() if lines > 0 else []
    return out


def _slurm_job(driver: BoxDriver, job_id: str) -> dict[str, Any]:
    """What Slurm says of the job (``squeue``, or ``sacct`` once squeue has forgotten it);
    ``state`` None when Slurm did not answer."""
    job: dict[str, Any] = {"job_id": job_id, "state": None, "reason": "", "node": "",
                           "alive": False}
    try:
        info = Slurm(driver.transport).info(job_id)
    except SlurmError as exc:
        job["error"] = str(exc)
        return job
    if info is None:
        job["error"] = (f"squeue -j {job_id} did not answer on {driver.transport.name} (is "
                        "slurmctld up?)")
        return job
    job.update(state=info.state, reason=info.reason, node=info.node, alive=info.alive)
    return job


def format_slurm(job: dict[str, Any]) -> str:
    """``Slurm job 4711: PENDING (Resources)``, ``…: RUNNING on gpu017``, ``…: COMPLETED``."""
    head = f"Slurm job {job['job_id']}: "
    if job.get("error"):
        return head + job["error"]
    if not job["state"]:
        return head + "no longer known to Slurm (squeue nor sacct knows it)"
    more = f" on {job['node']}" if job["node"] and job["state"] != "PENDING" else ""
    if job["reason"] and (job["state"] == "PENDING" or not job["alive"]):
        more += f" ({job['reason']})"  # why it waits, or why it ended
    return head + job["state"] + more


def format_status(st: dict[str, Any]) -> list[str]:
    """The lines a person reads."""
    head = f"box {st['box']}: {st['box_dir']}"
    if st.get("error"):
        return [head, st["error"]]
    lock = st.get("lock")
    lines = [head, "lock: " + (f"held by {lock['holder']}" + (
        f", touched {lock['touched_s_ago']}s ago" if lock.get("touched_s_ago") is not None else "")
        if lock else "free (no run holds this box)")]
    s = st.get("session")
    if st.get("slurm"):
        runs_in = format_slurm(st["slurm"])
    else:
        runs_in = f"tmux session {st['tmux_session']}: {'alive' if st['alive'] else 'not running'}"
    if s is None:
        none = "not started yet" if st.get("slurm") else "none yet in this box folder"
        lines.append(f"session: {none} ({runs_in})")
    else:
        left = max(0.0, s["budget_s"] - s["spent_s"])
        lines.append(f"session {s['session_id']} (run {s['run_id']}): {s['state']}"
                     + (f" ({s['error']})" if s.get("error") else "")
                     + f"; {runs_in}")
        eta = s.get("eta_s")
        lines.append(f"card {s.get('card') or '?'} ({s.get('regime') or '?'}), "
                     f"{s['spent_s']:.0f}s of {s['budget_s']:.0f}s budget spent, "
                     f"{left:.0f}s left" + (f", about {eta:.0f}s to go" if eta is not None
                                            and s["state"] == "running" else ""))
        entries = s.get("entries") or []
        planned = [e for e in entries if e.get("round", 0) == 0]
        for i, e in enumerate(entries, 1):
            ident = f"{e['slice']}-{e['kind']}" + (f".top{e['round']}" if e.get("round") else "")
            place = f"job {i} of {len(planned)}" if e.get("round", 0) == 0 else "top-up"
            to_go = e.get("eta_s")
            to_go = max(0.0, e["allotment_s"] - e["elapsed_s"]) if to_go is None else to_go
            best = (f"; best {format_us(e['best_us'])} on {e['shape']}"
                    if e.get("best_us") is not None and e.get("shape") else "")
            detail = {
                "running": f"{e['elapsed_s']:.0f}s of {e['allotment_s']:.0f}s allotted (about "
                           f"{to_go:.0f}s to go), {e.get('benched', 0)} measured, "
                           f"{e['points_left']} of {e['points_total']} points left{best}",
                "planned": (f"{e['allotment_s']:.0f}s allotted" if e.get("allotment_s") else
                            "waiting"),
            }.get(e["state"], f"{e['benched']} benched ({e['ok']} ok) in {e['elapsed_s']:.0f}s"
                  + (f"; {e['reason']}" if e.get("reason") else ""))
            lines.append(f"  {place:11} {ident:22} {e['state']:8} {detail}")
    if st["log"]:
        lines.append("last lines of sweep.log:")
        lines.extend(f"  {line}" for line in st["log"])
    return lines
