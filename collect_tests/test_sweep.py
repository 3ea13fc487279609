"""The collection "tests": one sweep job per card × slice × kind.

The box runs the card's whole session on its own clock; each test waits for its job there,
brings its rows home and merges them while the box measures the next.  A job passes when it
ran to its allotment or its pool's end and its rows are in the node table; bench failures are
data (they are rows), not test failures.  A job fails when the box's service died or failed
(with the tail of its log), when its rows could not be merged, or when some of them were
rejected (set aside with their reasons).  ``-k softmax`` or ``-k own`` select jobs; the budget
is planned over the selection.
"""

from __future__ import annotations

import pytest

from harness.boxctl import BoxError
from harness.collection import BoxUnusable
from harness.harvest import job_property, top_ups_property
from harness.remote.transport import SSHError


def test_sweep(sweep_job, collection, boxes, progress, record_property, request):
    gpu, job = sweep_job
    try:
        _sweep(sweep_job, collection, boxes, progress, record_property, request)
    finally:  # one property, whatever happened: the harvest, JUnit and --report-json read it
        record_property(*job_property(**collection.job_report(sweep_job)))
        if sweep_job == collection.last_job(gpu):
            record_property(*top_ups_property(collection.top_ups_report(gpu)))


def _sweep(sweep_job, collection, boxes, progress, record_property, request):
    gpu, job = sweep_job
    try:
        box = boxes(gpu)
    except BoxUnusable as exc:  # said once, by the first job of that box
        skipped = str(exc)
        unusable = ""
    except (BoxError, SSHError) as exc:
        unusable, skipped = str(exc), ""
    else:
        unusable = skipped = ""
    if skipped:
        pytest.skip(skipped)
    if unusable:  # the message says what was wrong and what to do: no traceback
        pytest.fail(unusable, pytrace=False)
    try:
        result = collection.run_job(sweep_job, box, progress, nodeid=request.node.nodeid)
    except BoxUnusable as exc:  # a batch job that ended before its session: said once
        skipped = str(exc)
    except BoxError as exc:
        unusable = str(exc)
    if skipped:
        pytest.skip(skipped)
    if unusable:
        pytest.fail(unusable, pytrace=False)
    if result.skipped:
        pytest.skip(result.skipped)
    out = result.outcome
    report = collection.job_report(sweep_job)
    # the same numbers as plain JUnit properties
    for name in ("benched", "ok", "failed", "points_done", "points_total", "seconds", "allotment_s"):
        record_property(name, report.get(name))
    if out.state in ("died", "failed"):
        why = out.summary.get("stop")
        pytest.fail(f"{job.id} on {box.card.name}: the sweep job {out.state}"
                    f"{f' ({why})' if why else ''}; tail of sweep.log:\n{out.log_tail}",
                    pytrace=False)
    if out.fetch_error:
        pytest.fail(f"{job.id}: {out.fetch_error}", pytrace=False)
    if result.merge_error:
        pytest.fail(f"{job.id}: its {result.stat('benched')} rows were measured but could not be "
                    f"merged: {result.merge_error}. They are kept in {out.rows_path} (and on the "
                    "box); the next run with this node table merges them first", pytrace=False)
    if result.merge is not None and result.merge.rejected:
        m = result.merge
        pytest.fail(f"{job.id}: {m.rejected} of its rows could not be merged and were set aside "
                    f"with their reasons in {m.rejected_file} (first: {m.first_rejected})",
                    pytrace=False)
    assert out.rows_path is not None or result.stat("benched") == 0, "rows did not come back"
