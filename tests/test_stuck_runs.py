"""Runs that will not end on their own, from any launcher, are found and ended by
`prx-assets doctor` (real runs through Dagster's multiprocess executor, see tests/stuck_jobs.py)."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from prx_assets.core.config.storage import DataRoot
from prx_assets.infra.doctor import doctor

REPO = Path(__file__).resolve().parents[1]


def _launch(home: Path, job: str) -> subprocess.Popen:
    """``python -m tests.stuck_jobs JOB`` against the instance at ``home`` (its own process group)."""
    return subprocess.Popen([sys.executable, "-m", "tests.stuck_jobs", job], cwd=REPO, start_new_session=True,
                            env={**os.environ, "DAGSTER_HOME": str(home)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_for(instance: dg.DagsterInstance, job: str, done: bool) -> dg.DagsterRun:
    """The run of ``job`` once its step started (``done``: once it succeeded)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for run in instance.get_runs(filters=dg.RunsFilter(job_name=job)):
            kinds = {e.dagster_event.event_type_value for e in instance.all_logs(run.run_id) if e.dagster_event}
            if ("STEP_SUCCESS" if done else "STEP_START") in kinds:
                return run
        time.sleep(0.5)
    raise AssertionError(f"{job} never got that far")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_doctor_finds_runs_of_any_launcher_that_will_not_end(tmp_path: Path, models_env: dict) -> None:
    """Real runs through Dagster's multiprocess executor: a step process that never exits after its
    step succeeded, a termination nothing carried out, a run whose processes were killed and a run
    never started are found, each with why; repair stops the live processes (children included)
    and ends each run. A run that is working is left alone."""
    import psutil

    from prx_assets.infra.stuck_runs import stuck_runs

    root = DataRoot(str(tmp_path / "root"))
    home = tmp_path / "home"
    home.mkdir()
    launched: dict[str, subprocess.Popen] = {}
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            instance.get_runs(limit=1)  # the storages' schemas exist before four processes open them
            launched.update({name: _launch(home, job) for name, job in
                             (("hung", "hangs_after_its_step"), ("canceling", "works_long"),
                              ("gone", "works_long"), ("working", "works_long"))})
            runs = {"hung": _wait_for(instance, "hangs_after_its_step", done=True)}
            long_runs = []
            while len(long_runs) < 3:
                long_runs = [r for r in instance.get_runs(filters=dg.RunsFilter(job_name="works_long"))]
                time.sleep(0.5)
            _wait_for(instance, "works_long", done=False)
            time.sleep(3)  # every works_long step has started
            name_of = {p.pid: name for name, p in launched.items()}
            for r in long_runs:  # the process that started a run wrote its start
                start = next(e for e in instance.all_logs(r.run_id)
                             if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_START")
                runs[name_of[start.dagster_event.pid]] = r
            instance.report_run_canceling(runs["canceling"], "terminate requested")
            os.killpg(launched["gone"].pid, 9)  # the run's process and its step process with it
            launched["gone"].wait()
            runs["never"] = instance.create_run_for_job(dg.GraphDefinition(name="g").to_job(), run_id=None)
            ids = {k: r.run_id for k, r in runs.items()}
            hung_tree = [p.pid for p in psutil.Process(launched["hung"].pid).children(recursive=True)]
            assert hung_tree and all(_alive(p) for p in hung_tree)

            assert {s.run_id for s in stuck_runs(instance, quiet_minutes=60)} == {ids["gone"]}
            found = {f.where.split()[0]: f for f in doctor(instance, root, quiet_minutes=0)}
            assert set(found) == {ids[k] for k in ("hung", "canceling", "gone", "never")}, found
            assert "every step finished" in found[ids["hung"]].detail
            assert "still alive" in found[ids["hung"]].detail
            assert "CANCELING" in found[ids["canceling"]].detail
            assert "every process that ran it is gone" in found[ids["gone"]].detail
            assert "NOT_STARTED" in found[ids["never"]].detail

            fixed = doctor(instance, root, repair=True, quiet_minutes=0)
            assert all(f.repaired for f in fixed) and len(fixed) == 4
            assert launched["hung"].wait(30) is not None and launched["canceling"].wait(30) is not None
            assert not any(_alive(p) for p in hung_tree)
            status = {k: instance.get_run_by_id(v).status for k, v in ids.items()}
            assert status["canceling"] == dg.DagsterRunStatus.CANCELED
            assert status["gone"] == status["never"] == dg.DagsterRunStatus.FAILURE
            # its step had succeeded: stopped, its run worker may still record that on the way out
            assert status["hung"] in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)
            assert status["working"] == dg.DagsterRunStatus.STARTED and launched["working"].poll() is None
    finally:
        for p in launched.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait()
