"""The collection "tests": one sweep job per card × slice × kind.

A job passes when it ran to its allotment or its pool's end and its rows are in the node
table; bench failures are data (they are rows), not test failures.  A job fails when its box
process died or failed (with the tail of its log), when its rows could not be merged, or when
some of them were rejected (set aside with their reasons).  ``-k softmax`` or ``-k own`` select
jobs; the budget is re-planned over the selection.
"""

from __future__ import annotations

import pytest

from harness.boxctl import BoxError
from harness.collection import BoxUnusable
from harness.harvest import job_property
from harness.remote.transport import SSHError


def test_sweep(sweep_job, collection, boxes, progress, record_property, request):
    gpu, job = sweep_job
    record_property(*job_property(gpu=gpu, slice=job.slice, kind=job.kind))
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
    result = collection.run_job(sweep_job, box, progress, nodeid=request.node.nodeid)
    report = collection.job_report(sweep_job)  # the harvest's summary and --report-json read it
    record_property(*job_property(**report))
    if result.skipped:
        pytest.skip(result.skipped)
    out = result.outcome
    # the same numbers as plain JUnit properties
    for name in ("benched", "ok", "failed", "points_done", "points_total", "seconds", "allotment_s"):
        record_property(name, report[name])
    if out.state in ("died", "failed"):
        pytest.fail(f"{job.id} on {box.card.name}: the sweep job {out.state}; tail of sweep.log:\n"
                    f"{out.log_tail}", pytrace=False)
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
