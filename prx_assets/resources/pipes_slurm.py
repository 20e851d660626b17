"""Dagster Pipes over SLURM: run a Python module as a job and stream its logs and results back.

The context and message files live in the shared job folder (``PipesFileContextInjector``,
``PipesFileMessageReader``), so the job's logs, metadata and materialization reach the Dagster
run wherever the job ran. A failed, cancelled or timed-out job fails the step with the tail of
the job log; interrupting the step (run termination) cancels the job.
"""

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from prx_assets.core.jobs.executors import Executor
from prx_assets.core.jobs.parse import JobStatus
from prx_assets.core.jobs.render import render_sbatch
from prx_assets.resources.slurm import SlurmResource


def log_tail(path: str | os.PathLike[str], lines: int = 40) -> str:
    """The last ``lines`` lines of a job log ('' when it doesn't exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class PipesSlurmClient(dg.PipesClient):
    """Runs ``python -m MODULE ARGS`` as a SLURM (or local) job inside a Dagster Pipes session."""

    def __init__(self, slurm: SlurmResource) -> None:
        self.slurm = slurm

    def run(self, *, context: dg.AssetExecutionContext | dg.OpExecutionContext, module: str,  # type: ignore[override]
            args: Sequence[str] = (), job_name: str, extras: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None, training: bool = False) -> dg.PipesClientCompletedInvocation:
        """Submit, follow and collect one job; raises ``dg.Failure`` with the log tail if it fails."""
        mode = self.slurm.effective_mode()
        executor = self.slurm.executor(mode)
        queue = getattr(executor, "queue", None)
        if queue is not None:  # a job of this name still queued or running (e.g. its run was killed)
            for job in queue():
                if job["name"] == job_name and job["state"] in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED"):
                    raise dg.Failure(
                        description=f"SLURM job {job['job_id']} ({job_name}) is already {job['state']}: a second "
                                    "job for the same work is not submitted. Wait for it to finish, or cancel it "
                                    f"with `scancel {job['job_id']}` and materialize again.",
                        metadata={"job_id": job["job_id"], "state": job["state"]})
        job_dir = self.slurm.jobs_dir() / f"{job_name}-{uuid.uuid4().hex[:8]}"
        job_dir.mkdir(parents=True)
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesFileContextInjector(str(job_dir / "pipes_context.json")),
            message_reader=dg.PipesFileMessageReader(str(job_dir / "pipes_messages.jsonl"), cleanup_file=False),
            extras=dict(extras or {}),
        ) as session:
            exports = {**(env or {}), **session.get_bootstrap_env_vars()}
            spec = self.slurm.job_spec(job_name=job_name, module=module, args=args, script_dir=job_dir,
                                       exports=exports, training=training)
            script = job_dir / "job.sbatch"
            script.write_text(render_sbatch(self.slurm.template_text(), spec))
            log_path = Path(spec.log_path)
            job_id = executor.submit(script, log_path)
            context.log.info(f"submitted {job_name} as {mode} job {job_id}; script {script}, log {log_path}")
            status = self._follow(context, executor, job_id)
            if status.state != "COMPLETED":
                tail = log_tail(log_path)
                raise dg.Failure(
                    description=f"{mode} job {job_id} ({job_name}) ended {status.state} "
                                f"(exit {status.exit_code or '?'}{', ' + status.reason if status.reason else ''})."
                                f" Last lines of {log_path}:\n{tail}",
                    metadata={"job_id": job_id, "state": status.state, "log": dg.MetadataValue.path(str(log_path)),
                              "log_tail": dg.MetadataValue.text(tail)},
                )
            context.log.info(f"job {job_id} COMPLETED")
        return dg.PipesClientCompletedInvocation(session, metadata={"job_id": job_id, "job_mode": mode})

    def _follow(self, context: Any, executor: Executor, job_id: str) -> JobStatus:
        last = ""
        unknown_since: float | None = None
        try:
            while True:
                st = executor.status(job_id)
                if st.state != last:
                    context.log.info(f"job {job_id}: {st.state}{' (' + st.reason + ')' if st.reason else ''}")
                    last = st.state
                if st.done:
                    return st
                if st.state == "UNKNOWN":  # e.g. sacct not yet aware of a just-finished job
                    unknown_since = unknown_since or time.monotonic()
                    if time.monotonic() - unknown_since > 120:
                        return st
                else:
                    unknown_since = None
                time.sleep(self.slurm.poll_seconds)
        except BaseException:  # run terminated (DagsterExecutionInterruptedError), KeyboardInterrupt, ...
            context.log.warning(f"interrupted: cancelling job {job_id}")
            executor.cancel(job_id)
            raise
