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


def test_cpu_threads_follow_the_allocation_shared_by_the_ranks(tmp_path: Path) -> None:
    """A job's processes use the CPUs SLURM gave its task, split over the ranks on the node (jobs
    sharing a node do not oversubscribe it); an operator's OMP_NUM_THREADS is kept."""
    def threads(spec: JobSpec, preset: str = "") -> str:
        text = render_sbatch(DEFAULT_TEMPLATE.read_text(), spec)
        line = next(ln for ln in text.splitlines() if ln.startswith("export OMP_NUM_THREADS="))
        return subprocess.run(["bash", "-c", f"{preset}{line}; echo $OMP_NUM_THREADS"], capture_output=True,
                              text=True, check=True, env={"PATH": os.environ["PATH"]}).stdout.strip()

    one = JobSpec(job_name="j", log_path="/tmp/j.log", workdir="/tmp", module="m", cpus_per_task=6)
    assert threads(one) == "6"
    assert threads(multi_node_spec()) == "4"  # 32 CPUs for 8 ranks a node
    assert threads(JobSpec(job_name="j", log_path="/tmp/j.log", workdir="/tmp", module="m", cpus_per_task=2,
                           gpus_per_node=8)) == "1"
    assert threads(one, preset="export OMP_NUM_THREADS=3; ") == "3"


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


HEALTH_SERVER = '''
import http.server, os, sys, time
open("server.pid", "w").write(str(os.getpid()))
time.sleep(float(os.environ.get("DELAY", "0")))
if os.environ.get("CRASH"):
    print("cannot load the model", flush=True); sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def _server_job(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    import sys

    (tmp_path / "fake_serve.py").write_text(HEALTH_SERVER)
    (tmp_path / "probe.py").write_text("import os, urllib.request\nurl = os.environ['PRX_JOB_CAPTION_SERVER_URL']\n"
                                       "print(url, urllib.request.urlopen(url[:-3] + '/health').read().decode())\n")
    spec = JobSpec(job_name="prx-recaptions-x", log_path=str(tmp_path / "job.log"), workdir=str(tmp_path),
                   module="probe", python=sys.executable, server_ready_s=4,
                   server_command=f"cd {tmp_path} && {sys.executable} fake_serve.py {{port}}")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(DEFAULT_TEMPLATE.read_text(), spec))
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, **env})


def test_job_starts_its_caption_server_waits_for_it_and_stops_it(tmp_path: Path) -> None:
    done = _server_job(tmp_path, DELAY="1.5")
    assert done.returncode == 0, done.stderr
    assert "caption server ready on port" in done.stdout
    url = done.stdout.strip().splitlines()[-1].split()[0]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1") and done.stdout.strip().endswith(" ok")
    pid = int((tmp_path / "server.pid").read_text())
    for _ in range(50):  # stopped by the job's exit trap
        if not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text():
            break
        import time

        time.sleep(0.1)
    else:
        raise AssertionError(f"caption server {pid} still running after the job")


def test_job_fails_with_the_server_log_when_the_server_dies_or_never_answers(tmp_path: Path) -> None:
    crashed = _server_job(tmp_path, CRASH="1")
    assert crashed.returncode == 1 and "exited before it was ready" in crashed.stderr
    assert "cannot load the model" in crashed.stderr
    slow = _server_job(tmp_path, DELAY="30")
    assert slow.returncode == 1 and "not ready after 4 s" in slow.stderr


def test_caption_server_needs_a_port_and_the_placeholder() -> None:
    spec = JobSpec(job_name="j", log_path="/tmp/j.log", workdir="/tmp", module="m", server_command="vllm serve m")
    with pytest.raises(SlurmError, match=r"has no \{port\}"):
        render_sbatch(DEFAULT_TEMPLATE.read_text(), spec)
    spec = JobSpec(job_name="j", log_path="/tmp/j.log", workdir="/tmp", module="m",
                   server_command="vllm serve m --port {port}")
    with pytest.raises(SlurmError, match=r"no \{\{ server \}\} placeholder"):
        render_sbatch(DEFAULT_TEMPLATE.read_text().replace("{{ server }}", ""), spec)
