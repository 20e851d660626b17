"""gs:// through the one storage interface, against a real GCS JSON API on loopback (fake-gcs-server)."""

import threading
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot, ObjectStoreSettings
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from tests.helpers import encode, photo


def test_data_root_on_gcs_reads_writes_claims_lists_and_deletes(gcs_env: dict[str, str]) -> None:
    root = DataRoot(f"gs://{gcs_env['BUCKET']}/prx")
    assert root.remote and root.scheme == "gs"
    root.write_bytes("a/b.json", b"{}")
    assert root.read_bytes("a/b.json") == b"{}" and root.exists("a/b.json") and not root.exists("a/c.json")
    wins = []
    threads = [threading.Thread(target=lambda i=i: wins.append(root.write_new("claims/7", str(i).encode())))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 5 + [True]  # ifGenerationMatch=0: one creator wins
    assert root.list("") == ["a/b.json", "claims/7"]
    root.delete("a/b.json")
    root.delete("a/b.json")  # absent: nothing happens
    assert root.list("a") == []


def test_lance_and_pyarrow_get_the_same_settings(gcs_env: dict[str, str]) -> None:
    root = DataRoot(f"gs://{gcs_env['BUCKET']}/prx")
    uri = root.join("lance/t.lance")
    lance.write_dataset(pa.table({"a": list(range(5))}), uri, storage_options=root.storage_options())
    assert lance.dataset(uri, storage_options=root.storage_options()).count_rows() == 5
    fs = ObjectStoreSettings.from_env().pyarrow_fs("gs")
    with fs.open_output_stream(f"{gcs_env['BUCKET']}/x.parquet") as f:
        pq.write_table(pa.table({"b": [1]}), f)
    assert root.settings.lance_storage_options("gs")["endpoint"] == gcs_env["STORAGE_EMULATOR_HOST"]
    assert ObjectStoreSettings(gcs_endpoint=None).lance_storage_options("gs") == {}  # real GCS: ADC


def test_gcs_prefix_source_lists_in_order_and_from_a_cursor(gcs_env: dict[str, str], tmp_path: Path) -> None:
    store = DataRoot(f"gs://{gcs_env['BUCKET']}")
    for i in range(5):
        store.write_bytes(f"in/{i:02d}.jpg", encode(photo(96, 80, seed=i), "JPEG"))
    store.write_bytes("in/notes.txt", b"x")
    cfg = SourceConfig(name="g", kind="gcs", location=f"gs://{gcs_env['BUCKET']}/in/", batch_size=10,
                       ingest=IngestSettings(workers=1))
    reader = reader_for(cfg)
    units = reader.list_units()
    assert [u.key.rsplit("/", 1)[-1] for u in units] == [f"{i:02d}.jpg" for i in range(5)]
    assert all(u.stamp for u in units)  # the generation: changes when the object does
    store.write_bytes("in/05.jpg", encode(photo(96, 80, seed=5), "JPEG"))
    new, state = reader.list_new({}, {"start_after": "in/04.jpg", "full_at": 1e12})
    assert [u.key.rsplit("/", 1)[-1] for u in new] == ["05.jpg"] and state["start_after"] == "in/notes.txt"

    root = DataRoot(str(tmp_path / "root"))  # a local data root, images from gs://
    discover(cfg, reader_for(cfg), root)
    (m,) = load_manifests(root, "g")
    res = ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    assert res.rows == 6 and res.rejected == 0


@pytest.mark.parametrize("scheme", ["file", "s3", "gs"])
def test_tables_are_found_from_one_listing_level(scheme: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Maintenance, the doctor and `status` find the Lance tables from the folders right below
    ``lance/`` (a ``/``-delimited listing on object stores), not by listing every version,
    fragment and index file of every table."""
    from prx_assets.core.lab.maintenance import lance_tables

    if scheme == "file":
        root = DataRoot(str(tmp_path / "root"))
    else:
        env = request.getfixturevalue("s3_env" if scheme == "s3" else "gcs_env")
        root = DataRoot(f"{scheme}://{env['BUCKET']}/prx")
    for rel in ("lance/a.lance/_versions/1.manifest", "lance/a.lance/data/x.lance", "lance/b.lance/a.lance/doubled",
                "lance/_lab_sync.json", "lance/notes/readme.txt", "curated/r/s.json"):
        root.write_bytes(rel, b"x")
    assert root.folders("lance") == ["a.lance", "b.lance", "notes"]
    assert root.folders("lance/a.lance") == ["_versions", "data"] and root.folders("absent") == []
    assert lance_tables(root) == ["a", "b"]
