"""Jobs that leave a Dagster run open, run through Dagster's multiprocess executor in a process of
their own (``python -m tests.stuck_jobs JOB``, with ``DAGSTER_HOME`` set), for the doctor's tests."""

import concurrent.futures
import sys
import time

import dagster as dg

_KEPT: list[concurrent.futures.ProcessPoolExecutor] = []


@dg.op
def leave_a_pool() -> None:
    """Succeeds, leaving an idle worker pool for the interpreter's exit: the step process then never
    exits (what ingest did before its pools were owned by the call)."""
    pool = concurrent.futures.ProcessPoolExecutor(1)
    pool.submit(abs, -1).result()
    _KEPT.append(pool)


@dg.op
def work_long() -> None:
    """Works for five minutes."""
    time.sleep(300)


@dg.job(executor_def=dg.multiprocess_executor)
def hangs_after_its_step() -> None:
    """One step that succeeds and a step process that never exits."""
    leave_a_pool()


@dg.job(executor_def=dg.multiprocess_executor)
def works_long() -> None:
    """One step that works for five minutes."""
    work_long()


def hangs_job() -> dg.JobDefinition:
    """For :func:`dagster.reconstructable`."""
    return hangs_after_its_step


def works_job() -> dg.JobDefinition:
    """For :func:`dagster.reconstructable`."""
    return works_long


if __name__ == "__main__":
    target = {"hangs_after_its_step": hangs_job, "works_long": works_job}[sys.argv[1]]
    with dg.DagsterInstance.get() as instance:
        dg.execute_job(dg.reconstructable(target), instance=instance)
