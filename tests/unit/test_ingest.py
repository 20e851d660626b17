"""Ingest into Lance: rows, rejects, idempotent replacement, settings changes, S3 data root."""

import io
from pathlib import Path

import lance
from PIL import Image

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.ingest.batches import discover, load_manifest
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.schema import IMAGES_SCHEMA
from prx_assets.core.lab.table import open_table
from tests.helpers import write_folder_corpus


def setup(tmp_path: Path, settings: IngestSettings | None = None,
          root: DataRoot | None = None) -> tuple[SourceConfig, DataRoot]:
    folder = tmp_path / "photos"
    if not folder.exists():
        write_folder_corpus(folder, n=6)
    cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=100,
                       ingest=settings or IngestSettings(workers=2))
    root = root or DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    return cfg, root


def test_ingest_writes_rows_and_rejects(tmp_path: Path) -> None:
    cfg, root = setup(tmp_path)
    res = ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    assert res.rows == 6 and res.rejects == {"empty": 1, "not_image": 1, "too_small": 1}
    images = lance.dataset(res.images_uri)
    assert images.schema.equals(IMAGES_SCHEMA, check_metadata=False) or \
        images.schema.names == IMAGES_SCHEMA.names
    rows = images.to_table().to_pylist()
    assert len(rows) == 6 and len({r["image_id"] for r in rows}) == 6
    for r in rows:
        im = Image.open(io.BytesIO(r["jpeg"]))
        assert im.format == "JPEG" and im.size == (r["width"], r["height"])
        assert r["batch"] == "photos-00001" and r["source"] == "photos"
    rejects = lance.dataset(res.rejects_uri).to_table().to_pylist()
    assert {(Path(r["uri"]).name, r["reason"]) for r in rejects} == {
        ("zero.jpg", "empty"), ("text.jpg", "not_image"), ("tiny.png", "too_small")}
    assert all(r["message"] for r in rejects)


def test_rematerializing_is_idempotent_and_rewrites_nothing(tmp_path: Path) -> None:
    cfg, root = setup(tmp_path)
    m = load_manifest(root, "photos-00001")
    first = ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    files_before = {f.path for f in lance.dataset(first.images_uri).get_fragments() for f in f.data_files()}
    again = ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    ds = lance.dataset(again.images_uri)
    assert ds.count_rows() == 6 and lance.dataset(again.rejects_uri).count_rows() == 3
    assert (again.inserted, again.updated, again.deleted) == (0, 0, 0)
    files_after = {f.path for f in ds.get_fragments() for f in f.data_files()}
    assert files_after == files_before
    # Identity follows content: a run that changes nothing commits nothing, in either table.
    assert again.images_version == first.images_version == ds.version
    assert again.rejects_version == first.rejects_version == lance.dataset(again.rejects_uri).version


def test_changed_settings_update_rows_in_place(tmp_path: Path) -> None:
    cfg, root = setup(tmp_path)
    m = load_manifest(root, "photos-00001")
    first = ingest_batch(m, reader_for(cfg), root, cfg.ingest)
    sizes = {r["image_id"]: r["jpeg_bytes"] for r in lance.dataset(first.images_uri).to_table().to_pylist()}
    stricter = IngestSettings(jpeg_quality=60, min_side=180, workers=1, lossless_fallback="off")
    res = ingest_batch(m, reader_for(cfg), root, stricter)
    rows = lance.dataset(res.images_uri).to_table().to_pylist()
    # min_side=180 now rejects the two smallest images; the rest are re-encoded smaller.
    assert res.rows == 4 and res.deleted == 2 and res.updated == 4
    assert len(rows) == 4 and all(r["jpeg_bytes"] < sizes[r["image_id"]] for r in rows)
    assert res.rejects["too_small"] == 3


def test_partitions_are_independent(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=6, broken=False)
    cfg = SourceConfig(name="photos", kind="folder", location=str(folder), batch_size=3)
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    a = ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    ingest_batch(load_manifest(root, "photos-00002"), reader_for(cfg), root, cfg.ingest)
    ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    t = lance.dataset(a.images_uri).to_table(columns=["batch"]).column("batch").to_pylist()
    assert sorted(t) == ["photos-00001"] * 3 + ["photos-00002"] * 3


def test_vanished_file_is_a_read_error_reject(tmp_path: Path) -> None:
    cfg, root = setup(tmp_path)
    (tmp_path / "photos" / "img_0_000.jpg").unlink()
    res = ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    assert res.rows == 5 and res.rejects["read_error"] == 1


def test_ingest_onto_an_s3_data_root(tmp_path: Path, s3_env: dict[str, str]) -> None:
    root = DataRoot(f"s3://{s3_env['BUCKET']}/lab")
    cfg, root = setup(tmp_path, root=root)
    res = ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    assert res.images_uri.startswith("s3://")
    ds = open_table(res.images_uri, root.storage_options())
    assert ds is not None and ds.count_rows() == 6
    listed = root.list("ingest/batches/photos")
    assert "ingest/batches/photos/00001.json" in listed and "ingest/batches/photos/_listing.json" in listed


def test_decoder_warnings_are_recorded_per_file_not_printed(tmp_path: Path, capsys, recwarn) -> None:
    """Pillow warns on a corrupt EXIF block; the warning lands in the result with the file, not on stderr."""
    import struct
    import warnings

    from prx_assets.core.ingest import decoder_warnings

    folder = tmp_path / "photos"
    write_folder_corpus(folder, n=3, broken=False)
    tiff = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHII", 0x010F, 2, 100, 200)
            + struct.pack("<I", 0))
    buf = io.BytesIO()
    Image.new("RGB", (96, 96), "red").save(buf, "JPEG", exif=b"Exif\x00\x00" + tiff)
    (folder / "bad_exif.jpg").write_bytes(buf.getvalue())
    cfg, root = setup(tmp_path)
    shown_before = warnings.showwarning
    res = ingest_batch(load_manifest(root, "photos-00001"), reader_for(cfg), root, cfg.ingest)
    assert res.rows == 4 and res.decoder_warnings >= 1
    (example,) = res.warning_examples
    assert example["uri"].endswith("bad_exif.jpg") and "Skipping tag 271" in example["warnings"]
    assert "Skipping tag" not in capsys.readouterr().err and not [w for w in recwarn if "tag" in str(w.message)]
    assert doctest_ok(decoder_warnings)
    assert warnings.showwarning is shown_before  # routing ends with the batch


def doctest_ok(mod: object) -> bool:
    import doctest

    res = doctest.testmod(mod)  # type: ignore[arg-type]
    return res.failed == 0 and res.attempted > 0
