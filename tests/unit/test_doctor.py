"""`prx-assets doctor` finds and repairs what crashes and concurrent writers leave behind."""

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import dagster as dg
import lance
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lab.table import table_uri
from prx_assets.infra.doctor import HOST_TAG, PID_TAG, doctor
from tests.unit.test_lab import build


def test_doctor_without_the_model_folders_judges_no_kept_state(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept curation state is named by model ids, which follow the models' files: with a model
    folder gone, doctor says so and deletes nothing instead of failing or guessing."""
    monkeypatch.setenv("PRX_CAPTIONER_MODEL", str(tmp_path / "moved-away"))
    root = DataRoot(str(tmp_path / "root"))
    kept = Path(root.join("curated/_digests/old/x.json"))
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        for repair in (False, True):
            found = doctor(instance, root, repair=repair)
            assert [(f.kind, f.repaired) for f in found] == [("models_unreadable", False)], found
            assert "moved-away" in found[0].detail and "does not exist" in found[0].detail
    assert kept.exists()


def test_doctor_finds_and_repairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models_env: dict) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temp folder's caches: this test's only
    leaked_cache = tmp_path / "prx-mds-cache-x"
    leaked_cache.mkdir()
    os.utime(leaked_cache, (time.time() - 7 * 3600,) * 2)
    root = DataRoot(str(tmp_path / "root"))
    rows = build(root, tmp_path / "photos", n=6, batch_size=3)
    images = lance.dataset(table_uri(root, "images"))
    # a concurrent writer's leftovers: two rows appended again for keys already present
    again = images.to_table(filter=f"image_id IN ('{rows[0]['image_id']}', '{rows[1]['image_id']}')")
    lance.write_dataset(again, table_uri(root, "images"), mode="append")
    staging = Path(root.join("mds/demo_all/.staging-abc-1234"))
    staging.mkdir(parents=True)
    old = time.time() - 8 * 3600
    os.utime(staging, (old, old))
    fresh = Path(root.join("mds/demo_all/.staging-def-5678"))
    fresh.mkdir(parents=True)  # a publish in progress: left alone
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        proc = subprocess.Popen(["true"])
        proc.wait()
        dead = proc.pid  # a process that is gone
        run = instance.create_run_for_job(dg.GraphDefinition(name="g").to_job(), run_id=None,
                                          tags={HOST_TAG: socket.gethostname(), PID_TAG: str(dead)})
        instance.handle_run_event(run.run_id, dg.DagsterEvent(event_type_value="PIPELINE_START", job_name="g"))
        instance.add_dynamic_partitions("raw_batches", ["photos-09999"])  # no manifest behind it

        found = doctor(instance, root)
        kinds = sorted(f.kind for f in found)
        assert kinds == ["duplicate_keys", "leaked_folder", "leaked_folder", "orphan_partition", "stuck_run"], found
        assert not any(f.repaired for f in found)
        assert lance.dataset(table_uri(root, "images")).count_rows() == 8

        fixed = doctor(instance, root, repair=True)
        assert all(f.repaired for f in fixed) and len(fixed) == 5
        ds = lance.dataset(table_uri(root, "images"))
        assert ds.count_rows() == 6 and len(set(ds.to_table(columns=["image_id"]).column(0).to_pylist())) == 6
        assert not staging.exists() and not leaked_cache.exists() and fresh.exists()
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        assert "photos-09999" not in instance.get_dynamic_partitions("raw_batches")
        assert doctor(instance, root) == []
