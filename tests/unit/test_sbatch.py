"""The job-script renderer: golden file, quoting, validation."""

import os
import subprocess
from pathlib import Path

import pytest

from prx_assets.core.jobs.render import DEFAULT_TEMPLATE, JobSpec, job_name_for, render_sbatch
from prx_assets.errors import SlurmError

GOLDEN = Path(__file__).parents[1] / "golden" / "train.sbatch"


def multi_node_spec() -> JobSpec:
    return JobSpec(
        job_name=job_name_for("train", "base mix"), log_path="/shared/jobs/train/job.log", workdir="/shared/prx",
        module="prx_assets.training.train", args=("--spec", "/shared/mix it's.json", "--steps", "100"),
        python="/opt/venv/bin/python", nodes=2, gpus_per_node=8, cpus_per_task=32, time="04:00:00",
        partition="gpu", account="vision", mem="900G", extra_directives=("--exclusive=user",),
        env_setup=("module load cuda/12.4", "source /opt/venv/bin/activate"),
        exports=(("DAGSTER_PIPES_CONTEXT", "eyJwYXRoIjogIi9zaGFyZWQvY3R4Lmpzb24ifQ=="),
                 ("PRX_DATA_ROOT", "s3://bucket/prx root"), ("WEIRD", "a'b\"c $(rm -rf /) `x`")),
    )


def test_render_matches_golden_file() -> None:
    text = render_sbatch(DEFAULT_TEMPLATE.read_text(), multi_node_spec())
    if os.environ.get("PRX_UPDATE_SNAPSHOT") == "1":  # an intended template change: rewrite, review, commit
        GOLDEN.write_text(text)
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: run PRX_UPDATE_SNAPSHOT=1 pytest {__file__} and commit it"
    assert text == GOLDEN.read_text(), "the job script changed; if intended, rerun with PRX_UPDATE_SNAPSHOT=1"


def test_rendered_script_is_valid_bash_and_values_survive_quoting(tmp_path: Path) -> None:
    text = render_sbatch(DEFAULT_TEMPLATE.read_text(), multi_node_spec())
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0
    # Run only the export lines: hostile values come back byte for byte, nothing executes.
    exports = "\n".join(line for line in text.splitlines() if line.startswith("export "))
    out = subprocess.run(["bash", "-c", exports + '\nprintf "%s\\n" "$WEIRD" "$PRX_DATA_ROOT"'],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout.splitlines()
    assert out == ["a'b\"c $(rm -rf /) `x`", "s3://bucket/prx root"]


def test_single_process_job_runs_the_module_directly() -> None:
    spec = JobSpec(job_name="prx-recaptions-x", log_path="/tmp/j.log", workdir="/tmp", module="prx_assets.stage_job",
                   args=("recaptions", "photos-00000|detailed-abc"), python="/usr/bin/python3")
    text = render_sbatch(DEFAULT_TEMPLATE.read_text(), spec)
    assert "/usr/bin/python3 -m prx_assets.stage_job recaptions 'photos-00000|detailed-abc'" in text
    assert "torch.distributed.run" not in text and "srun" not in text.split("MASTER_PORT")[-1]
    assert "#SBATCH --gpus-per-node" not in text


@pytest.mark.parametrize("field,value", [("partition", "gpu; rm -rf /"), ("time", "4 hours"),
                                         ("log_path", "/shared/my logs/j.out"), ("account", "a\nb")])
def test_unsafe_directive_values_are_rejected_with_the_value(field: str, value: str) -> None:
    spec = JobSpec(**{"job_name": "j", "log_path": "/tmp/j.log", "workdir": "/tmp", "module": "m", field: value})
    with pytest.raises(SlurmError, match="cannot be passed safely") as e:
        render_sbatch(DEFAULT_TEMPLATE.read_text(), spec)
    assert repr(value) in str(e.value)


def test_unknown_placeholder_and_bad_env_names_fail() -> None:
    spec = JobSpec(job_name="j", log_path="/tmp/j.log", workdir="/tmp", module="m")
    with pytest.raises(SlurmError, match="unknown"):
        render_sbatch("{{ sbatch_directives }}\n{{ gpu_count }}", spec)
    bad = JobSpec(job_name="j", log_path="/tmp/j.log", workdir="/tmp", module="m", exports=(("A-B", "x"),))
    with pytest.raises(SlurmError, match="'A-B'"):
        render_sbatch(DEFAULT_TEMPLATE.read_text(), bad)


def test_job_names_from_data_are_sanitised() -> None:
    assert job_name_for("train", "mix $(x); y") == "prx-train-mix___x___y"
