"""SLURM output parsers on captured text, and the local executor on real subprocesses."""

import doctest
import time
from pathlib import Path

import pytest

from prx_assets.core.jobs import parse
from prx_assets.core.jobs.executors import LocalExecutor, executor_for
from prx_assets.errors import SlurmError

# Captured from Debian's SLURM 22.05 on the single-node test cluster (lines shortened).
SCONTROL_DONE = ("JobId=1 JobName=prx-train-demo_mix UserId=root(0) GroupId=root(0) MCS_label=N/A "
                 "Priority=4294901759 Nice=0 Account=root QOS=normal JobState=COMPLETED Reason=None "
                 "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:15 "
                 "TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-30T04:15:05 Partition=debug\n")
SCONTROL_FAILED = ("JobId=9 JobName=prx-train-bad JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
                   "ExitCode=3:0 RunTime=00:00:02 Partition=debug\n")
SCONTROL_GONE = "slurm_load_jobs error: Invalid job id specified\n"
SACCT = "55|COMPLETED|0:0\n56|FAILED|3:0\n57|CANCELLED by 0|0:0\n"
SQUEUE = ("2|RUNNING|/shared/slurm/prx-train-demo_mix-1a2b3c4d/job.sbatch|prx-train-demo_mix\n"
          "3|PENDING|/shared/slurm/prx-recaptions-photos-00001-9f8e7d6c/job.sbatch|prx-recaptions-photos-00001\n"
          "4|RUNNING|/home/u/run.sh|a|name|with|bars\n")


def test_doctests() -> None:
    assert doctest.testmod(parse).failed == 0


def test_scontrol() -> None:
    done = parse.parse_scontrol(SCONTROL_DONE, "1")
    assert done is not None and done.state == "COMPLETED" and done.exit_code == "0:0" and done.reason == ""
    assert done.done and not done.failed
    failed = parse.parse_scontrol(SCONTROL_FAILED, "9")
    assert failed is not None and failed.failed and failed.reason == "NonZeroExitCode"
    assert parse.parse_scontrol(SCONTROL_GONE, "1") is None


def test_sacct_matches_the_job_and_normalizes_cancelled_by() -> None:
    assert parse.parse_sacct(SACCT, "56") == parse.JobStatus("56", "FAILED", "3:0")
    cancelled = parse.parse_sacct(SACCT, "57")
    assert cancelled is not None and cancelled.state == "CANCELLED" and cancelled.failed
    assert parse.parse_sacct(SACCT, "5") is None  # no prefix matches


def test_squeue_and_sinfo() -> None:
    jobs = parse.parse_squeue(SQUEUE)
    assert jobs[1] == {"job_id": "3", "name": "prx-recaptions-photos-00001", "state": "PENDING",
                       "command": "/shared/slurm/prx-recaptions-photos-00001-9f8e7d6c/job.sbatch"}
    assert jobs[2]["name"] == "a|name|with|bars" and jobs[2]["state"] == "RUNNING"
    assert parse.sinfo_has_usable_node("mix\n") and parse.sinfo_has_usable_node("idle*\n")
    assert not parse.sinfo_has_usable_node("down\ndrain\n") and not parse.sinfo_has_usable_node("")


def _wait(ex: LocalExecutor, job_id: str) -> parse.JobStatus:
    deadline = time.time() + 30
    while not (st := ex.status(job_id)).done:
        assert time.time() < deadline, f"local job {job_id} did not finish"
        time.sleep(0.05)
    return st


def test_local_executor_reports_exit_codes_and_cancels(tmp_path: Path) -> None:
    ex = LocalExecutor()
    ok = tmp_path / "ok.sh"
    ok.write_text("echo hello\n")
    job = ex.submit(ok, tmp_path / "ok.log")
    assert _wait(ex, job).state == "COMPLETED" and (tmp_path / "ok.log").read_text() == "hello\n"
    bad = tmp_path / "bad.sh"
    bad.write_text("exit 3\n")
    st = _wait(ex, ex.submit(bad, tmp_path / "bad.log"))
    assert st.state == "FAILED" and st.exit_code == "3:0" and st.failed
    slow = tmp_path / "slow.sh"
    slow.write_text("sleep 60\n")
    job = ex.submit(slow, tmp_path / "slow.log")
    assert ex.status(job).state == "RUNNING"
    ex.cancel(job)
    assert ex.status(job).state == "CANCELLED"
    with pytest.raises(SlurmError, match="not started by this process"):
        ex.status("local-1")
    with pytest.raises(SlurmError, match="not one of slurm, local"):
        executor_for("kubernetes")



def test_every_stage_names_its_home_module() -> None:
    """A stage job imports only the module that registers its stage; the map must cover every stage."""
    import prx_assets.definitions  # noqa: F401 - registers every stage
    from prx_assets.defs.remote import STAGE_HOMES, STAGES

    assert set(STAGES) == set(STAGE_HOMES)
    for name, (fn, _) in STAGES.items():
        assert fn.__module__ == STAGE_HOMES[name], name
