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



def test_every_stage_in_the_table_loads_with_its_result_type() -> None:
    import dataclasses

    from prx_assets.core.stages import STAGES, UnknownStage, load_stage

    for name in STAGES:
        fn, result_type = load_stage(name)
        assert fn.__module__.startswith("prx_assets.core.stages."), name
        assert dataclasses.is_dataclass(result_type), name
    with pytest.raises(UnknownStage, match="stages: image_embeddings, raw_images, recaptions"):
        load_stage("raw_imagez")


@pytest.mark.parametrize("stage", ["raw_images", "recaptions", "image_embeddings"])
def test_a_stage_job_imports_no_dagster(stage: str) -> None:
    """The job entry and the stage it runs import ``dagster_pipes`` and ``core/`` only: run in a fresh
    interpreter, ``dagster`` is not in ``sys.modules`` after loading the stage."""
    import subprocess
    import sys

    code = ("import sys, prx_assets.stage_job as job; from prx_assets.core.stages import load_stage; "
            f"load_stage({stage!r}); import dagster_pipes; "
            "bad = sorted(m for m in sys.modules if m == 'dagster' or m.startswith(('dagster.', 'prx_assets.defs', "
            "'prx_assets.resources'))); print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_stage_reads_recaption_keys_as_dagster_writes_them() -> None:
    import dagster as dg

    from prx_assets.core.stages.enrich import split_recaption_key
    from prx_assets.defs.enrichment import split_recaption_key as dagster_split

    key = dg.MultiPartitionKey({"batch": "photos-00012", "captioner": "detailed-1a2b3c4d"})
    assert split_recaption_key(str(key)) == dagster_split(key) == ("photos-00012", "detailed-1a2b3c4d")
    with pytest.raises(ValueError, match=r"<batch>\|<captioner id>"):
        split_recaption_key("photos-00012")


def test_each_resource_carries_exactly_the_fields_and_defaults_of_its_stage_settings() -> None:
    import dataclasses

    from prx_assets.core.stages import settings as core
    from prx_assets.resources.models import CaptionerResource, EmbedderResource
    from prx_assets.resources.s3 import PrxS3Resource
    from prx_assets.resources.storage import ProjectConfigResource, StorageResource

    pairs = [(StorageResource, core.StorageSettings), (ProjectConfigResource, core.ProjectSettings),
             (PrxS3Resource, core.S3Settings), (CaptionerResource, core.CaptionerSettings),
             (EmbedderResource, core.EmbedderSettings)]
    for resource, settings in pairs:
        ours = {f.name: f.default for f in dataclasses.fields(settings)}
        theirs = {name: field.default for name, field in resource.model_fields.items()}
        assert ours == theirs, resource.__name__
        assert resource().settings() == settings()


def test_stage_settings_travel_as_json_without_credentials() -> None:
    from prx_assets.core.stages.settings import (
        CaptionerSettings,
        ProjectSettings,
        S3Settings,
        StageResources,
        StorageSettings,
    )

    res = StageResources(storage=StorageSettings("/data"), project=ProjectSettings("/cfg"),
                         s3=S3Settings(endpoint_url="http://127.0.0.1:9", aws_secret_access_key="hidden",
                                       aws_access_key_id="AKIA"),
                         captioner=CaptionerSettings(device="cpu", batch_size=2))
    text = res.to_json()
    assert "hidden" not in text and "AKIA" not in text
    back = StageResources.from_json(text)
    assert back.s3 == S3Settings(endpoint_url="http://127.0.0.1:9") and back.captioner == res.captioner
    assert back.storage == res.storage and back.embedder is None


def test_a_slow_build_holds_up_no_other_kept_object() -> None:
    import threading

    from prx_assets.core.stages.settings import kept

    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        return "model"

    loader = threading.Thread(target=lambda: kept(("test-slow", id(started)), slow))
    loader.start()
    assert started.wait(10)
    got: list[str] = []
    fast = threading.Thread(target=lambda: got.append(kept(("test-fast", id(started)), lambda: "client")))
    fast.start()
    fast.join(5)
    finished_during_the_slow_build = not fast.is_alive()
    release.set()
    fast.join(10)
    assert finished_during_the_slow_build and got == ["client"]
    loader.join(10)
    assert kept(("test-slow", id(started)), lambda: "again") == "model"  # built once
