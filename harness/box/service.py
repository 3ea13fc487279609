"""The box service: one process per session that runs the session's jobs, its tools kept warm.

Started once after setup in the tmux session ``emmy-node-sweep`` (``python -m harness.box serve
--run-dir BOX/rows/<run_id> --service-dir BOX/service/<run_id> …``), it probes the box and
starts the compile pool and the bench worker once, then takes the controller's requests, one
job at a time, through files in the service folder (kept apart from the rows, so a full rows
disk cannot stop the service from saying a job failed):

- ``job-NNNN.json``: a job (slice, kind, allotment, rows file, summary file), written by the
  controller; the service runs it (:func:`harness.box.runner.run_job` with its tools) and writes
  ``job-NNNN.done`` (``{"status": "ok"|"failed", "error": …}``) after the job's summary;
- ``job-NNNN.stop``: stop that job at its next point (the controller's ``--timeout-s``, Ctrl-C);
- ``alive``: touched by every poll of the controller; when nobody has touched it for
  ``--idle-s`` and no job runs, the service ends (its controller is gone);
- ``quit``: end now (the session is over).

``ready.json`` says the service is up (its pid, card, regime and measuring lanes).  With
``--box-gpus`` the service measures on several GPUs of the box, one lane (a bench worker pinned
to its GPU) each, and every job is shared by all of them.  A kernel that kills a bench worker
costs that point (that lane's worker restarts); a job that fails (a full disk) is reported
failed and the service takes the next one.  Stdlib + torch + triton only.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from harness.box.runner import JobConfig, Tools, run_job

JOB_FIELDS = ("slice", "kind", "budget_s", "rows_path", "ledger_path", "summary_path", "run_id",
              "batch", "seed", "max_dist", "tail_cap", "filter", "max_attempts", "point_timeout_s",
              "baselines")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Service:
    def __init__(self, run_dir: Path, defaults: JobConfig, idle_s: float = 600.0,
                 log: Any = sys.stdout, poll_s: float = 0.2,
                 service_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        self.dir = service_dir or run_dir / "service"
        self.defaults = defaults
        self.idle_s = idle_s
        self.log = log
        self.poll_s = poll_s

    def _pending(self) -> Path | None:
        for req in sorted(self.dir.glob("job-*.json")):
            if not req.with_suffix(".done").exists():
                return req
        return None

    def _idle_for(self) -> float:
        try:
            return time.time() - (self.dir / "alive").stat().st_mtime
        except OSError:
            return 0.0  # never touched yet: the controller is starting

    def serve(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "alive").touch()
        t = time.monotonic()
        tools = Tools.start(self.defaults, self.run_dir / "worker.log")
        try:
            _write_json(self.dir / "ready.json", {
                "pid": os.getpid(), "card": tools.card.name, "regime": tools.regime,
                "start_s": round(time.monotonic() - t, 2),
                "compile_workers": tools.pool.workers if tools.pool is not None else 0,
                "lanes": [{"lane": lane.index, "gpu_index": lane.gpu_index,
                           "gpu_uuid": lane.gpu_uuid} for lane in tools.lanes]})
            lanes = (f" with {len(tools.lanes)} lanes ("
                     + ", ".join(lane.describe() for lane in tools.lanes) + ")"
                     if len(tools.lanes) > 1 else "")
            print(f"[service] up on {tools.card.name} ({tools.regime}){lanes} in "
                  f"{time.monotonic() - t:.1f}s; waiting for jobs", file=self.log, flush=True)
            while not (self.dir / "quit").exists():
                req = self._pending()
                if req is None:
                    if self._idle_for() > self.idle_s:
                        print(f"[service] no word from the controller for {self.idle_s:.0f}s: "
                              "ending", file=self.log, flush=True)
                        break
                    time.sleep(self.poll_s)
                    continue
                self._run(req, tools)
        finally:
            tools.close()
        print("[service] ended", file=self.log, flush=True)
        return 0

    def _run(self, req: Path, tools: Tools) -> None:
        started = time.monotonic()
        stop_file = req.with_suffix(".stop")
        done: dict[str, Any] = {"status": "ok"}
        try:
            data = json.loads(req.read_text())
            fields = {k: data[k] for k in JOB_FIELDS if k in data}
            for k in ("rows_path", "ledger_path", "summary_path"):
                fields[k] = Path(fields[k])
            base = {k: getattr(self.defaults, k) for k in ("warmup", "iters", "compile_workers",
                                                          "max_cv", "remeasure", "box_gpus")}
            cfg = JobConfig(**{**base, **fields})
            summary = run_job(cfg, log=self.log, tools=tools, started=started,
                              should_stop=stop_file.exists)
            done["stop"] = summary.get("stop")
        except SystemExit as exc:  # the job's own failure (a rows file it cannot write)
            done = {"status": "failed", "error": str(exc.code)}
        except Exception as exc:  # noqa: BLE001 - one job's failure never ends the service
            done = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-3000:]}
            print(f"[service] job {req.name} failed: {done['error']}", file=self.log, flush=True)
        done["elapsed_s"] = round(time.monotonic() - started, 2)
        _write_json(req.with_suffix(".done"), done)
