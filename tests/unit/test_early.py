"""Discovery and the first read-ahead before the CLI's imports (:mod:`prx_assets.core.ingest.early`):
the read-ahead is kept only for runs whose resources hold the settings it was read with, dropped
for any other and when the process ingests nothing; a failing discovery reads nothing ahead."""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from prx_assets.core.config.project import load_sources
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest import early
from prx_assets.core.ingest.batches import load_manifest, load_manifests
from prx_assets.core.ingest.readahead import READAHEAD, BatchInputs
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.ingest.worker import shutdown_pool, worker_pools
from tests.helpers import write_folder_corpus

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config folder with one folder source of 12 images in batches of 6 (2 worker processes),
    and a fresh data root; the read-ahead is cleared afterwards."""
    write_folder_corpus(tmp_path / "pics", n=12, broken=False)
    config = tmp_path / "config"
    shutil.copytree(REPO / "config", config)
    (config / "sources.yaml").write_text(
        "ingest:\n  workers: 2\n  processes: 2\n  readahead: 4\nsources:\n"
        f"  - name: pics\n    kind: folder\n    path: {tmp_path / 'pics'}\n    batch_size: 6\n")
    monkeypatch.setenv("PRX_CONFIG_DIR", str(config))
    monkeypatch.setenv("PRX_DATA_ROOT", str(tmp_path / "data"))
    try:
        with worker_pools():  # as prx-assets run holds it
            try:
                yield tmp_path
            finally:
                READAHEAD.clear()
    finally:
        early.take_found()
        shutdown_pool()


def _inputs(resources: str, key: str) -> BatchInputs:
    cfg = load_sources().get("pics")
    root = DataRoot(str(Path(json.loads(resources)["storage"]["data_root"])))
    return BatchInputs(resources=resources, source=cfg, manifest=load_manifest(root, key), reader=reader_for(cfg))


def _run_resources(data_root: str, config_dir: str) -> str:
    """What :meth:`~prx_assets.core.stages.settings.StageResources.to_json` gives for these settings."""
    return json.dumps({"storage": {"data_root": data_root}, "project": {"config_dir": config_dir},
                       "s3": {"endpoint_url": None}, "captioner": None, "embedder": None})


def test_begin_discovers_and_reads_the_first_new_batch_ahead(project: Path) -> None:
    found = early.begin()
    assert found is not None
    assert [r["new_batches"] for r in found.reports] == [["pics-00001", "pics-00002"]]
    assert sorted(m.key for m in load_manifests(DataRoot(str(project / "data")), "pics")) == \
        ["pics-00001", "pics-00002"]
    assert READAHEAD.live_key == "pics-00001"
    assert early.take_found() is found and early.take_found() is None  # handed over once

    # The runs' resources hold the same data root and config folder: kept, and taken by its run.
    settings = json.loads(found.resources)
    resources = _run_resources(settings["storage"]["data_root"], settings["project"]["config_dir"])
    early.settle(found, resources)
    assert READAHEAD.live_key == "pics-00001"
    ahead = READAHEAD.take(_inputs(resources, "pics-00001"))
    assert ahead is not None
    ahead.close()


def test_a_read_ahead_for_other_resources_or_no_ingest_is_dropped(project: Path) -> None:
    found = early.begin()
    assert found is not None and READAHEAD.live_key == "pics-00001"
    other = _run_resources(str(project / "elsewhere"), json.loads(found.resources)["project"]["config_dir"])
    early.settle(found, other)  # the definitions point the runs at another data root
    assert READAHEAD.live_key is None

    READAHEAD.start()  # nothing expected any more
    assert READAHEAD.live_key is None
    shutil.rmtree(project / "data")
    found = early.begin()
    assert found is not None and READAHEAD.live_key == "pics-00001"
    early.settle(found, None)  # raw_images is not selected, or runs as SLURM jobs
    assert READAHEAD.live_key is None


def test_nothing_new_no_ingest_or_a_failing_discovery_reads_nothing_ahead(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert early.begin() is not None
    READAHEAD.clear()
    found = early.begin()  # everything already discovered
    assert found is not None and found.reports[0]["new_batches"] == [] and READAHEAD.live_key is None

    shutil.rmtree(project / "data")
    found = early.begin(read_ahead=False)  # a selection without raw_images: discovery only
    assert found is not None and found.reports[0]["new_batches"] == ["pics-00001", "pics-00002"]
    assert READAHEAD.live_key is None

    (project / "config" / "sources.yaml").write_text("sources:\n  - name: pics\n    kind: nonsense\n")
    assert early.begin() is None  # the command discovers again and reports the error itself
    assert READAHEAD.live_key is None and early.take_found() is None
