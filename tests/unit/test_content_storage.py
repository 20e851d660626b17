"""Content-aware storage: images whose q92 JPEG would lose more than the bound (or synthetic
few-color images) are stored losslessly and flagged; everything else stays JPEG q92."""

import hashlib
import io
import json
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.synthetic import mixed_corpus
from prx_assets.core.ingest.batches import discover, load_manifest
from prx_assets.core.ingest.images import prepare_rgb, store
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for
from prx_assets.core.lab.schema import IMAGES_SCHEMA
from prx_assets.core.lab.table import table_uri
from prx_assets.training.data import decode_to_bucket


@pytest.fixture(scope="module")
def corpus() -> dict[str, bytes]:
    return mixed_corpus(np.random.default_rng(1))


def _rgb(data: bytes) -> Image.Image:
    return prepare_rgb(data, IngestSettings()).rgb


def test_each_kind_is_stored_as_its_content_needs(corpus: dict[str, bytes]) -> None:
    s = IngestSettings()
    got = {name: store(_rgb(data), s) for name, data in corpus.items()}
    assert {n for n, st in got.items() if st.fmt == "jpeg"} == {n for n in corpus if n.startswith("photo")}
    assert {got[n].lossless_reason for n in corpus if n.startswith(("text", "palette"))} == {"psnr"}
    assert {got[n].lossless_reason for n in corpus if n.startswith(("line_art", "dithered"))} == {"few_colors"}
    for name, st in got.items():
        assert st.psnr_db is not None
        if st.fmt == "jpeg":
            assert st.psnr_db >= s.q92_min_psnr_db and st.data.startswith(b"\xff\xd8")
        else:  # lossless: the stored bytes decode to exactly the normalized pixels
            assert st.fmt == "webp" and st.data[8:12] == b"WEBP"
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(st.data)).convert("RGB")),
                                  np.asarray(_rgb(corpus[name])))
    png = store(_rgb(corpus["text_000.png"]), IngestSettings(lossless_fallback="png"))
    assert png.fmt == "png" and png.data.startswith(b"\x89PNG")
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png.data)).convert("RGB")),
                          np.asarray(_rgb(corpus["text_000.png"])))


def test_a_synthetic_image_stays_jpeg_when_lossless_would_cost_too_much() -> None:
    rng = np.random.default_rng(3)  # 200 colors scattered pixel by pixel: PNG is far bigger than JPEG
    palette = rng.integers(0, 256, (200, 3), dtype=np.uint8)
    noisy = Image.fromarray(palette[rng.integers(0, 200, (256, 256))], "RGB")
    st = store(noisy, IngestSettings(q92_min_psnr_db=1.0))
    assert st.fmt == "jpeg" and st.lossless_reason is None


def test_stored_bytes_stay_within_their_bound_of_the_source() -> None:
    """Noise is below the PSNR bound at q92 yet its lossless bytes would be several times the
    already-compressed source's: it is stored as a q98 JPEG (or the configured one), never more than
    SOURCE_MAX_GROWTH x the source, with the reason recorded; the share stored losslessly excludes it."""
    from prx_assets.core.ingest.images import SOURCE_MAX_GROWTH, normalize

    rng = np.random.default_rng(1)
    noise = Image.fromarray(rng.integers(0, 256, (600, 800, 3), dtype=np.uint8))
    buf = io.BytesIO()
    noise.save(buf, "JPEG", quality=85)  # the source: noise already JPEG-compressed
    source = buf.getvalue()
    n = normalize(source, IngestSettings())
    assert len(n.jpeg) <= SOURCE_MAX_GROWTH * len(source)
    assert n.stored_format == "jpeg" and n.lossless_reason.startswith("lossless_oversize")
    assert n.stored_sha256 == hashlib.sha256(n.jpeg).hexdigest()
    assert store(prepare_rgb(source, IngestSettings()).rgb, IngestSettings()).fmt != "jpeg"  # without the bound


def test_off_keeps_stored_bytes_and_fingerprint_as_before() -> None:
    off = IngestSettings(lossless_fallback="off")
    keys = ("jpeg_quality", "jpeg_subsampling", "max_side", "min_side", "max_aspect", "max_pixels", "aspect_buckets")
    legacy = hashlib.sha256(json.dumps({k: getattr(off, k) for k in keys}, sort_keys=True).encode()).hexdigest()[:16]
    assert off.normalization_fingerprint() == legacy  # upgrading with `off` re-ingests nothing
    assert IngestSettings().normalization_fingerprint() != legacy  # the default changes what is stored
    assert IngestSettings(q92_min_psnr_db=30).normalization_fingerprint() != IngestSettings().normalization_fingerprint()
    st = store(Image.new("RGB", (64, 64), (1, 2, 3)), off)
    assert (st.fmt, st.psnr_db) == ("jpeg", None)


def _source(tmp_path: Path, corpus: dict[str, bytes]) -> tuple[SourceConfig, DataRoot]:
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name, data in corpus.items():
        (folder / name).write_bytes(data)
    cfg = SourceConfig(name="mixed", kind="folder", location=str(folder), batch_size=100,
                       ingest=IngestSettings(workers=1))
    root = DataRoot(str(tmp_path / "root"))
    discover(cfg, reader_for(cfg), root)
    return cfg, root


def test_mixed_corpus_ingests_with_fallback_share_and_psnr_distribution(tmp_path: Path,
                                                                         corpus: dict[str, bytes]) -> None:
    cfg, root = _source(tmp_path, corpus)
    res = ingest_batch(load_manifest(root, "mixed-00001"), reader_for(cfg), root, cfg.ingest)
    assert res.rows == len(corpus) and res.rejected == 0
    assert res.stored_formats == {"jpeg": 4, "webp": 8}
    assert res.lossless_reasons == {"psnr": 4, "few_colors": 4} and res.lossless_share == pytest.approx(8 / 12)
    q = res.psnr_quantiles()
    assert q["min"] < 37 < q["p95"] and len(res.psnr_db) == len(corpus)
    summary = res.summary()
    assert summary["lossless_share"] == round(8 / 12, 4) and summary["q92_psnr_db"] == q
    rows = lance.dataset(table_uri(root, "images")).to_table(
        columns=["uri", "jpeg", "jpeg_bytes", "stored_format", "q92_psnr_db"]).to_pylist()
    for r in rows:
        name = r["uri"].rsplit("/", 1)[-1]
        assert r["jpeg_bytes"] == len(r["jpeg"]) and r["q92_psnr_db"] is not None
        assert (r["stored_format"] == "jpeg") == name.startswith("photo")
        assert decode_to_bucket(r["jpeg"], (64, 64)).shape == (3, 64, 64)  # the trainer reads either format
    again = ingest_batch(load_manifest(root, "mixed-00001"), reader_for(cfg), root, cfg.ingest)
    assert (again.inserted, again.updated, again.deleted) == (0, 0, 0)  # same content: nothing rewritten


def test_a_table_from_before_gets_the_new_columns_without_rewriting(tmp_path: Path,
                                                                    corpus: dict[str, bytes]) -> None:
    cfg, root = _source(tmp_path, dict(list(corpus.items())[:3]))
    legacy = pa.schema([f for f in IMAGES_SCHEMA if f.name not in ("stored_format", "q92_psnr_db")])
    old_row = {f.name: None for f in legacy} | {
        "image_id": "old", "source": "older", "batch": "older-00001", "uri": "/x.jpg", "jpeg": b"\xff\xd8",
        "jpeg_bytes": 2, "width": 1, "height": 1, "orig_width": 1, "orig_height": 1, "orig_format": "JPEG",
        "orig_mode": "RGB", "orig_bytes": 2, "sha256": "0", "phash": 0, "aspect_ratio": 1.0,
        "aspect_bucket": "1:1", "ingest_config": "legacy"}
    lance.write_dataset(pa.Table.from_pylist([old_row], schema=legacy), table_uri(root, "images"),
                        enable_stable_row_ids=True)
    res = ingest_batch(load_manifest(root, "mixed-00001"), reader_for(cfg), root, cfg.ingest)
    ds = lance.dataset(table_uri(root, "images"))
    assert res.rows == 3 and ds.count_rows() == 4
    assert {"stored_format", "q92_psnr_db"} <= set(ds.schema.names)
    old = ds.to_table(filter="image_id = 'old'", columns=["stored_format", "jpeg"]).to_pylist()
    assert old == [{"stored_format": None, "jpeg": b"\xff\xd8"}]  # kept as it was: null means JPEG


def test_an_image_too_large_for_webp_is_stored_as_png(monkeypatch: pytest.MonkeyPatch,
                                                      corpus: dict[str, bytes]) -> None:
    import prx_assets.core.ingest.images as images

    monkeypatch.setattr(images, "WEBP_MAX_PIXELS", 1000)  # libwebp's memory grows with the pixels
    st = store(_rgb(corpus["text_000.png"]), IngestSettings())
    assert (st.fmt, st.lossless_reason) == ("png", "psnr") and st.data.startswith(b"\x89PNG")


def test_tile_estimate_is_the_whole_jpegs_error_on_its_tiles(corpus: dict[str, bytes]) -> None:
    """Each tile, encoded with its margin, decodes to exactly its pixels in the whole image's JPEG,
    so the estimate equals the whole JPEG's PSNR over the same tiles (no seam error); and with the
    2 dB margin no image below the bound is accepted as JPEG."""
    import math

    from prx_assets.core.ingest.images import (
        PSNR_FULL_MARGIN_DB,
        PSNR_TILE,
        encode_jpeg,
        jpeg_psnr,
        psnr_tiles,
        tiles_psnr,
    )

    s = IngestSettings()
    rng = np.random.default_rng(4)
    checked = 0
    for name, data in corpus.items():
        rgb = _rgb(data)
        if rgb.width < 2 * PSNR_TILE or rgb.height < 2 * PSNR_TILE:
            continue
        for im in (rgb, rgb.crop((3, 5, rgb.width - int(rng.integers(1, 15)), rgb.height - 7))):  # odd sizes
            jpeg = encode_jpeg(im, s.jpeg_quality, s.jpeg_subsampling)
            whole = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.int64)
            src = np.asarray(im, dtype=np.int64)
            _, corners = psnr_tiles(*im.size)
            errs = [float(((src[y:y + PSNR_TILE, x:x + PSNR_TILE] - whole[y:y + PSNR_TILE, x:x + PSNR_TILE]) ** 2)
                          .sum()) for x, y in corners]

            def db(mse: float) -> float:
                return 99.0 if mse == 0 else min(99.0, 10 * math.log10(255 ** 2 / mse))

            mean_db, worst_db = tiles_psnr(im, s.jpeg_quality, s.jpeg_subsampling)
            assert mean_db == pytest.approx(db(sum(errs) / (len(corners) * PSNR_TILE * PSNR_TILE * 3)), abs=1e-9), name
            assert worst_db == pytest.approx(db(max(errs) / (PSNR_TILE * PSNR_TILE * 3)), abs=1e-9), name
            full = jpeg_psnr(im, jpeg)
            est = jpeg_psnr(im, jpeg, bound=s.q92_min_psnr_db)
            assert est == full or est >= s.q92_min_psnr_db + PSNR_FULL_MARGIN_DB
            assert full >= s.q92_min_psnr_db or est < s.q92_min_psnr_db, name  # never accepted below the bound
            checked += 1
    assert checked >= 8


def test_images_up_to_the_whole_limit_are_measured_exactly_and_larger_ones_estimated() -> None:
    """At or below ``PSNR_WHOLE_MAX_PIXELS`` the stored figure is the whole JPEG's PSNR (there it is
    also cheaper than the tile mosaic); above it, an image well clear of the bound keeps the
    tiles' estimate and its whole JPEG is never decoded."""
    from prx_assets.core.demo.corpus import make_scene
    from prx_assets.core.ingest.images import (
        PSNR_PIXELS,
        PSNR_WHOLE_MAX_PIXELS,
        encode_jpeg,
        jpeg_psnr,
        tiles_psnr,
    )

    s = IngestSettings()
    rng = np.random.default_rng(11)
    side = int(PSNR_WHOLE_MAX_PIXELS ** 0.5)  # 512: above the tiles' own budget, at the limit
    assert side * side > 2 * PSNR_PIXELS
    for w, h in ((side, side), (side - 64, side - 16), (3 * side // 2, side)):
        rgb = make_scene(rng, w, h).image.convert("RGB")
        jpeg = encode_jpeg(rgb, s.jpeg_quality, s.jpeg_subsampling)
        full = jpeg_psnr(rgb, jpeg)
        bounded = jpeg_psnr(rgb, jpeg, bound=s.q92_min_psnr_db)
        if w * h <= PSNR_WHOLE_MAX_PIXELS:
            assert bounded == full, (w, h)
        else:
            estimate, worst = tiles_psnr(rgb, s.jpeg_quality, s.jpeg_subsampling)
            assert estimate >= s.q92_min_psnr_db + 2 and worst >= s.q92_min_psnr_db, "a photo well above"
            assert bounded == estimate != full, (w, h)


def test_mosaic_squared_errors_are_exact_up_to_the_worst_difference() -> None:
    """The tiles' squared errors summed in float32 a pixel row at a time equal an int64 sum, for
    differences of 255 everywhere (the largest sums) and random ones; margins never count."""
    from prx_assets.core.ingest.images import PSNR_MARGIN, PSNR_TILE
    from prx_assets.core.ingest.pixel_error import mosaic_squared_errors

    t, m = PSNR_TILE, PSNR_MARGIN
    cell = t + 2 * m
    rng = np.random.default_rng(3)
    for rows, cols, make in ((2, 3, lambda shape: np.full(shape, 255, np.uint8)),
                             (3, 5, lambda shape: rng.integers(0, 256, shape, dtype=np.uint8)),
                             (1, 1, lambda shape: (rng.random(shape) < 0.01).astype(np.uint8) * 255)):
        diff = make((rows * cell, cols * cell, 3))
        got = mosaic_squared_errors(Image.fromarray(diff), rows, cols, t, m)
        want = [int((diff[r * cell + m:r * cell + m + t, c * cell + m:c * cell + m + t].astype(np.int64) ** 2).sum())
                for r in range(rows) for c in range(cols)]
        assert got.tolist() == want
    diff = np.zeros((cell, cell, 3), np.uint8)
    diff[:m] = 255  # in the margin only
    assert mosaic_squared_errors(Image.fromarray(diff), 1, 1, t, m).tolist() == [0]
    with pytest.raises(ValueError, match="tiles of 96 pixels"):
        mosaic_squared_errors(Image.new("RGB", (96, 96)), 1, 1, 96, 0)


def test_band_cell_squared_errors_are_exact_and_match_a_cell_at_a_time() -> None:
    """The q92 check's map sums a band's cells in one pass: the same values as summing each cell's
    squared differences in int64, for the largest differences, random ones and a cut last cell;
    cells that are not a multiple of 64 are left to the caller."""
    from prx_assets.core.ingest.pixel_error import band_cell_squared_errors

    rng = np.random.default_rng(5)
    for w, h, cell, make in ((512, 128, 128, lambda shape: np.full(shape, 255, np.uint8)),
                             (300, 128, 128, lambda shape: rng.integers(0, 256, shape, dtype=np.uint8)),
                             (200, 37, 64, lambda shape: rng.integers(0, 9, shape, dtype=np.uint8)),
                             (100, 5, 128, lambda shape: rng.integers(0, 256, shape, dtype=np.uint8))):
        diff = make((h, w, 3))
        want = [float((diff[:, x:x + cell].astype(np.int64) ** 2).sum()) for x in range(0, w, cell)]
        assert band_cell_squared_errors(Image.fromarray(diff), cell).tolist() == want, (w, h, cell)
    assert band_cell_squared_errors(Image.new("RGB", (100, 10)), 96) is None
