"""Parsers for what SLURM's commands print: pure functions, unit-tested on captured output.

>>> parse_sacct("56|COMPLETED|0:0\\n", "56").state
'COMPLETED'
>>> parse_scontrol("JobId=7 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0", "7").exit_code
'3:0'
"""

from __future__ import annotations

from dataclasses import dataclass

TERMINAL_OK = frozenset({"COMPLETED"})
TERMINAL_BAD = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                          "DEADLINE", "REVOKED", "SPECIAL_EXIT"})


@dataclass(frozen=True)
class JobStatus:
    """A job's state as SLURM (or the local runner) reports it."""

    job_id: str
    state: str
    exit_code: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        """Finished, successfully or not."""
        return self.state in TERMINAL_OK or self.failed

    @property
    def failed(self) -> bool:
        """Finished unsuccessfully (failed, cancelled, timed out, out of memory, ...)."""
        return self.state.split()[0] in TERMINAL_BAD if self.state else False


def parse_scontrol(text: str, job_id: str) -> JobStatus | None:
    """``scontrol show job -o ID``: ``None`` when SLURM no longer knows the job."""
    if "JobState=" not in text:
        return None
    fields = dict(kv.split("=", 1) for kv in text.split() if "=" in kv)
    reason = fields.get("Reason", "")
    return JobStatus(job_id, fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", ""),
                     "" if reason == "None" else reason)


def parse_sacct(text: str, job_id: str) -> JobStatus | None:
    """``sacct -X -n -P -j ID --format=JobID,State,ExitCode``: ``CANCELLED by 0`` becomes ``CANCELLED``."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] == job_id and parts[1]:
            return JobStatus(job_id, parts[1].split()[0], parts[2])
    return None


def parse_squeue(text: str) -> list[dict[str, str]]:
    """``squeue -h -o %i|%T|%o|%j``: one dict (job_id, state, command, name) per job. The name comes
    last so that a ``|`` in another user's job name cannot shift the other fields.

    >>> parse_squeue("7|RUNNING|/shared/slurm/prx-train-mix-1a2b/job.sbatch|prx-train-mix\\n")
    [{'job_id': '7', 'state': 'RUNNING', 'command': '/shared/slurm/prx-train-mix-1a2b/job.sbatch', 'name': 'prx-train-mix'}]
    """
    return [dict(zip(("job_id", "state", "command", "name"), line.split("|", 3), strict=False))
            for line in text.splitlines() if line.strip()]


def sinfo_has_usable_node(text: str) -> bool:
    """``sinfo -h -o %t``: whether any node is idle, mixed or allocated (a trailing ``*`` is ignored)."""
    return any(s.strip().rstrip("*").startswith(("idle", "mix", "alloc")) for s in text.split())
