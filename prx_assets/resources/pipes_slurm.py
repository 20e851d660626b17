"""Dagster Pipes over SLURM: run a Python module as a job and stream its logs and results back.

The context and message files live in the shared job folder (``PipesFileContextInjector``,
:class:`LineFileMessageReader`), so the job's logs, metadata and materialization reach the Dagster
run wherever the job ran. A failed, cancelled or timed-out job fails the step with the tail of
the job log; interrupting the step (run termination) cancels the job. A run that was killed
(not terminated) leaves its job running; the next run for the same work adopts it.
"""

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from threading import Event, Thread
from typing import Any

import dagster as dg
from dagster_pipes import DagsterPipesError, PipesDefaultMessageWriter

from prx_assets.core.jobs.executors import Executor
from prx_assets.core.jobs.parse import JobStatus
from prx_assets.core.jobs.render import render_sbatch
from prx_assets.resources.slurm import SlurmResource

#: Per job folder: what the job is for (job id, name, work key, caller's record), and the marker
#: written once a run has recorded the job's results.
WORK_FILE, RECORDED_FILE, MESSAGES_FILE = "work.json", "recorded", "pipes_messages.jsonl"
#: Job states in which a job may still produce results.
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED", "SUSPENDED")


def submitted_from(job: Mapping[str, str], jobs_dir: Path) -> bool:
    """Whether a queued job was submitted from ``jobs_dir`` (its batch script lies there). A job
    whose command SLURM does not show is counted as ours: a doubled job is worse than a refusal."""
    command = (job.get("command") or "").strip()
    if not command or not command.startswith("/"):
        return True
    return Path(command).resolve().is_relative_to(jobs_dir.resolve())


def tail_lines(path: str, should_stop: Callable[[], bool], poll_s: float = 0.01) -> Iterator[str]:
    """Complete lines appended to ``path`` until ``should_stop()`` and the file is read to its end.

    Dagster's ``tail_file`` yields whatever ``readline`` returns, so a message line read while the
    job is still writing it comes out cut in two and its JSON fails to parse, which ends Dagster's
    reader thread and loses every later message, the job's results included. Here a line is held
    until its newline arrives; text left without one when the session closes is yielded last.
    """
    pending, stopping = "", False
    with open(path, encoding="utf-8") as stream:
        while True:
            chunk = stream.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
                continue
            if should_stop():
                if stopping:
                    break
                stopping = True  # one more pass: what was written between the last read and the stop
                continue
            time.sleep(poll_s)
    if pending.strip():
        yield pending


class LineFileMessageReader(dg.PipesMessageReader):
    """Pipes message reader that tails a file in the shared job folder and parses only complete
    lines (see :func:`tail_lines`), written on Dagster's public ``PipesMessageReader``.

    Dagster's ``PipesFileMessageReader`` hands a half-written line to ``json.loads`` when the job
    is mid-write, and truncates the file when a session opens; ``keep_existing`` reads an adopted
    job's file from its first line instead (what the job already wrote stays).
    """

    def __init__(self, path: str, include_stdio_in_messages: bool = False, cleanup_file: bool = True,
                 keep_existing: bool = False) -> None:
        self.path = path
        self.include_stdio_in_messages = include_stdio_in_messages
        self.cleanup_file = cleanup_file
        self.keep_existing = keep_existing

    @contextmanager
    def read_messages(self, handler: dg.PipesMessageHandler) -> Iterator[dict[str, Any]]:
        """Tail the file on a thread until the session closes; yields where the job writes."""
        if not self.keep_existing:
            open(self.path, "w", encoding="utf-8").close()
        closed = Event()
        thread = Thread(target=self.read_until, args=(handler, closed), daemon=True)
        thread.start()
        try:
            yield {PipesDefaultMessageWriter.FILE_PATH_KEY: self.path,
                   PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: self.include_stdio_in_messages}
        finally:
            closed.set()
            thread.join()
            if self.cleanup_file and os.path.exists(self.path):
                os.remove(self.path)

    def read_until(self, handler: Any, closed: Event) -> None:
        """Hand each complete line to ``handler`` until ``closed`` is set and the file is read."""
        try:
            for line in tail_lines(self.path, closed.is_set):
                if line.strip():
                    handler.handle_message(json.loads(line))
        except BaseException:
            handler.report_pipes_framework_exception(f"{self.__class__.__name__} reader thread", sys.exc_info())
            raise

    def no_messages_debug_text(self) -> str:
        """What Dagster prints when the job sent no message."""
        return f"Attempted to read messages from file {self.path}."


def _closed(messages: Path) -> bool:
    """Whether a Pipes message file ends with the job's ``closed`` message."""
    try:
        with open(messages, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return False
    for line in reversed(lines):
        try:
            return json.loads(line).get("method") == "closed"
        except ValueError:
            continue
    return False


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
            env: Mapping[str, str] | None = None, training: bool = False, work_key: str | None = None,
            record: Mapping[str, Any] | None = None) -> dg.PipesClientCompletedInvocation:
        """Submit, follow and collect one job; raises ``dg.Failure`` with the log tail if it fails.

        ``work_key`` names the work (e.g. a mixture version and the trainer settings). A job for the
        same work that a killed run left behind is adopted instead of submitting a second one:
        still queued or running, it is followed; finished, its results are read; either way its
        Pipes messages (logs, metadata, materialization) reach this run. ``record`` is kept with
        the job and returned as ``metadata["work"]`` (e.g. where an adopted job writes checkpoints).
        A queued or running job of the same name for other work is refused, never doubled. Only
        this project's jobs count (their scripts lie in its jobs folder): another data root on the
        same cluster may train a mixture of the same name at the same time.
        """
        mode = self.slurm.effective_mode()
        executor = self.slurm.executor(mode)
        queue = getattr(executor, "queue", None)
        adopted = self._adoptable(executor, job_name, work_key) if queue is not None and work_key else None
        if adopted is None and queue is not None:  # a job of this name still queued or running
            jobs_dir = self.slurm.jobs_dir()
            for job in queue():
                if job["name"] == job_name and job["state"] in LIVE_STATES and submitted_from(job, jobs_dir):
                    raise dg.Failure(
                        description=f"SLURM job {job['job_id']} ({job_name}) is already {job['state']}"
                                    f"{' for other work' if work_key else ''}: a second job is not submitted. "
                                    "Wait for it to finish, or cancel it with "
                                    f"`scancel {job['job_id']}` and materialize again.",
                        metadata={"job_id": job["job_id"], "state": job["state"]})
        if adopted is not None:
            job_dir, work = adopted
            context_file = job_dir / f"pipes_context.adopted-{uuid.uuid4().hex[:8]}.json"
        else:
            job_dir = self.slurm.jobs_dir() / f"{job_name}-{uuid.uuid4().hex[:8]}"
            job_dir.mkdir(parents=True)
            work = {"job_name": job_name, "work_key": work_key, "record": dict(record or {}), "mode": mode}
            context_file = job_dir / "pipes_context.json"
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesFileContextInjector(str(context_file)),
            message_reader=LineFileMessageReader(str(job_dir / MESSAGES_FILE), cleanup_file=False,
                                                 keep_existing=adopted is not None),
            extras=dict(extras or {}),
        ) as session:
            if adopted is None:
                exports = {**(env or {}), **session.get_bootstrap_env_vars()}
                spec = self.slurm.job_spec(job_name=job_name, module=module, args=args, script_dir=job_dir,
                                           exports=exports, training=training,
                                           stage=(extras or {}).get("stage"))
                script = job_dir / "job.sbatch"
                script.write_text(render_sbatch(self.slurm.template_text(), spec))
                log_path = Path(spec.log_path)
                job_id = executor.submit(script, log_path)
                work.update(job_id=job_id, log=str(log_path))
                (job_dir / WORK_FILE).write_text(json.dumps(work, sort_keys=True))
                context.log.info(f"submitted {job_name} as {mode} job {job_id}; script {script}, log {log_path}")
            else:
                job_id, log_path = str(work["job_id"]), Path(work.get("log", job_dir / "job.log"))
                context.log.info(f"adopting {job_name} job {job_id} for the same work ({work_key}), left by an "
                                 f"earlier run; its log {log_path}")
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
        (job_dir / RECORDED_FILE).write_text(context.run.run_id)  # its results are in a run now
        return dg.PipesClientCompletedInvocation(session, metadata={
            "job_id": job_id, "job_mode": work.get("mode", mode), "adopted": adopted is not None,
            "work": dict(work.get("record") or {}), "log": str(log_path),
            "messages": str(job_dir / MESSAGES_FILE)})

    def _adoptable(self, executor: Executor, job_name: str, work_key: str) -> tuple[Path, dict[str, Any]] | None:
        """The newest job folder of ``job_name`` for ``work_key`` whose job is queued or running, or
        finished COMPLETED with a closed message stream that no run has recorded yet."""
        root = self.slurm.jobs_dir()
        if not root.is_dir():
            return None
        found = []
        for d in root.glob(f"{job_name}-*"):
            try:
                work = json.loads((d / WORK_FILE).read_text())
            except (OSError, ValueError):
                continue
            if work.get("work_key") == work_key and work.get("job_name") == job_name and work.get("job_id") \
                    and not (d / RECORDED_FILE).exists():
                found.append((d.stat().st_mtime, d, work))
        for _, d, work in sorted(found, key=lambda t: t[0], reverse=True):
            st = executor.status(str(work["job_id"]))
            if st.state in LIVE_STATES or (st.state == "COMPLETED" and _closed(d / MESSAGES_FILE)):
                return d, work
        return None

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


def reported_result(invocation: dg.PipesClientCompletedInvocation, what: str) -> dg.MaterializeResult:
    """The one materialization the job reported through Pipes. A job that completed without
    reporting one (it exited before its report, or its messages never reached this process) fails
    the step, naming the job and where its messages and log are, instead of recording an empty
    materialization that has no data version.

    Raises
    ------
    dagster.Failure
        When the job reported no materialization (or more than one).
    """
    try:
        return invocation.get_materialize_result(implicit_materialization=False)
    except DagsterPipesError as e:
        md = {k: plain(v) for k, v in invocation.metadata.items()}
        raise dg.Failure(
            description=f"{what}: job {md.get('job_id', '?')} completed but its result never arrived ({e}). "
                        f"Its Pipes messages are in {md.get('messages', 'its job folder')} and its log in "
                        f"{md.get('log', 'its job folder')}; fix what they show, then materialize again "
                        "(a new job runs).",
            metadata={"job_id": str(md.get("job_id", "")), "log": dg.MetadataValue.path(str(md.get("log", "")))},
        ) from e


def plain(value: Any) -> Any:
    """A Pipes invocation's metadata entry as a plain value (entries come back as ``MetadataValue``)."""
    return getattr(value, "value", value)
