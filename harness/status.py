"""``python -m harness status``: a box's session as the box has it, from any terminal.

Reads the box folder (this machine's, or a ``--remote`` server's over SSH) in a few short calls
and touches nothing: the box's lock, the session the folder's service runs or ran last
(``current-session.json``, its ``status.json``), whether its tmux session is alive, and the
last lines of ``sweep.log`` (kept on the box until the next run starts a session).
"""

from __future__ import annotations

import json
import time
from typing import Any

from harness.boxctl import CURRENT_SESSION, BoxDriver, BoxError
from harness.contract import Layout, SessionStatus
from harness.owner import Owner
from harness.progress import format_us


def box_status(driver: BoxDriver, lines: int = 10) -> dict[str, Any]:
    """What the box folder says of its session, as plain values (``--json`` prints them)."""
    out: dict[str, Any] = {"box": driver.transport.name, "box_dir": driver.base,
                           "tmux_session": driver.sweep_session, "lock": None,
                           "session": None, "alive": driver.tmux.alive(driver.sweep_session),
                           "log": []}
    if driver.transport.run(["test", "-d", driver.base], check=False, timeout=60).rc != 0:
        out["error"] = f"no box folder {driver.base} on {driver.transport.name}"
        return out
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
        cur = driver.read_json(driver.path(CURRENT_SESSION))
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
    alive = "alive" if st["alive"] else "not running"
    if s is None:
        lines.append(f"session: none yet in this box folder (tmux session {st['tmux_session']}: "
                     f"{alive})")
    else:
        left = max(0.0, s["budget_s"] - s["spent_s"])
        lines.append(f"session {s['session_id']} (run {s['run_id']}): {s['state']}"
                     + (f" ({s['error']})" if s.get("error") else "")
                     + f"; tmux session {st['tmux_session']}: {alive}")
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
