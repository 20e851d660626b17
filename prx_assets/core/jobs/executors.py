"""Executors: where a rendered job script runs. Both have the same three verbs.

- :class:`SlurmExecutor` submits with ``sbatch`` and follows the job with ``scontrol`` (while
  SLURM remembers it) and ``sacct`` (after), cancels with ``scancel``.
- :class:`LocalExecutor` runs the same script with ``bash`` as a subprocess in its own process
  group (no cluster needed); it knows the jobs this process started.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from prx_assets.core.jobs.parse import (
    JobStatus,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
    sinfo_has_usable_node,
)
from prx_assets.errors import SlurmError


class Executor(Protocol):
    """Runs job scripts."""

    mode: str

    def submit(self, script: Path, log_path: Path) -> str:
        """Start the script; return its job id."""
        ...

    def status(self, job_id: str) -> JobStatus:
        """The job's current state."""
        ...

    def cancel(self, job_id: str) -> None:
        """Stop the job (no error if it already ended)."""
        ...


def run_command(cmd: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command; a missing command is a SlurmError that says what to install."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise SlurmError(f"{cmd[0]} not found: install the SLURM client tools (or run `make slurm-up` "
                         "for a local cluster), or set SlurmResource.mode to 'local'") from e


def cluster_up() -> bool:
    """Whether ``sinfo`` answers with at least one usable node."""
    if shutil.which("sinfo") is None:
        return False
    try:
        out = run_command(["sinfo", "-h", "-o", "%t"], timeout=10)
    except (SlurmError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and sinfo_has_usable_node(out.stdout)


class SlurmExecutor:
    """Jobs on a SLURM cluster."""

    mode = "slurm"

    def submit(self, script: Path, log_path: Path) -> str:
        """``sbatch --parsable``; the script's ``#SBATCH --output`` names the log."""
        out = run_command(["sbatch", "--parsable", str(script)])
        if out.returncode != 0:
            raise SlurmError(f"sbatch {script} failed: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout.strip().split(";")[0]

    def status(self, job_id: str) -> JobStatus:
        """``scontrol show job`` while SLURM remembers the job, then ``sacct``; else UNKNOWN."""
        out = run_command(["scontrol", "show", "job", "-o", job_id])
        found = parse_scontrol(out.stdout, job_id) if out.returncode == 0 else None
        if found is not None:
            return found
        acct = run_command(["sacct", "-X", "-n", "-P", "-j", job_id, "--format=JobID,State,ExitCode"])
        found = parse_sacct(acct.stdout, job_id)
        return found or JobStatus(job_id, "UNKNOWN", reason=(out.stderr or acct.stderr).strip())

    def queue(self) -> list[dict[str, str]]:
        """Jobs queued or running (``squeue``): id, state, command (the batch script's path), name."""
        out = run_command(["squeue", "-h", "-o", "%i|%T|%o|%j"])
        if out.returncode != 0:
            raise SlurmError(f"squeue failed: {out.stderr.strip()}")
        return parse_squeue(out.stdout)

    def cancel(self, job_id: str) -> None:
        """``scancel``."""
        out = run_command(["scancel", job_id])
        if out.returncode != 0:
            raise SlurmError(f"scancel {job_id} failed: {out.stderr.strip()}")


class LocalExecutor:
    """The same scripts as ``bash`` subprocesses on this machine."""

    mode = "local"
    _jobs: ClassVar[dict[str, subprocess.Popen[bytes]]] = {}  # jobs started by this process

    def submit(self, script: Path, log_path: Path) -> str:
        """Start ``bash SCRIPT`` in its own process group, output to ``log_path``."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=script.parent)
        job_id = f"local-{proc.pid}"
        self._jobs[job_id] = proc
        return job_id

    def _proc(self, job_id: str) -> subprocess.Popen[bytes]:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise SlurmError(f"local job {job_id} was not started by this process; local jobs can only be "
                             "followed by the process that started them (use mode 'slurm' to follow jobs "
                             "across processes)") from None

    def status(self, job_id: str) -> JobStatus:
        """RUNNING until the process exits; then COMPLETED, FAILED or CANCELLED (killed by a signal)."""
        rc = self._proc(job_id).poll()
        if rc is None:
            return JobStatus(job_id, "RUNNING")
        state = "COMPLETED" if rc == 0 else ("CANCELLED" if rc < 0 else "FAILED")
        return JobStatus(job_id, state, f"{rc}:0")

    def cancel(self, job_id: str) -> None:
        """SIGTERM to the job's process group, SIGKILL after 30 s."""
        proc = self._proc(job_id)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def executor_for(mode: str) -> Executor:
    """The executor of a resolved mode (``slurm`` or ``local``)."""
    if mode == "slurm":
        return SlurmExecutor()
    if mode == "local":
        return LocalExecutor()
    raise SlurmError(f"job mode {mode!r} is not one of slurm, local")
