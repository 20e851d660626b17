"""Models are given images at the size they need: a JPEG larger than that is reduced on decode
(its full bitmap never exists), any other format right after; chunks are bounded by pixels."""

import io
import resource
import warnings

import numpy as np
from PIL import Image

from prx_assets.core.enrich.decode import decode_rgb, pixel_chunks


def _jpeg(w: int, h: int) -> bytes:
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
    arr = np.stack([np.broadcast_to(x, (h, w)), np.broadcast_to(y, (h, w)), np.full((h, w), 90, np.float32)], -1)
    buf = io.BytesIO()
    Image.fromarray(arr.astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_small_images_decode_as_before_and_large_ones_at_most_the_limit() -> None:
    small = _jpeg(320, 240)
    assert np.array_equal(np.asarray(decode_rgb(small, 10**6)), np.asarray(Image.open(io.BytesIO(small)).convert("RGB")))
    big = _jpeg(4000, 3000)
    im = decode_rgb(big, 1024 * 1024)
    assert im.mode == "RGB" and im.width * im.height <= 1024 * 1024 and abs(im.width / im.height - 4 / 3) < 0.01
    scan = Image.new("1", (6000, 6000), 1)  # a 1-bit scan: reduced in its own mode, then RGB
    buf = io.BytesIO()
    scan.save(buf, "PNG")
    out = decode_rgb(buf.getvalue(), 512 * 512)
    assert out.mode == "RGB" and out.size == (512, 512)


def test_a_jpeg_over_the_bomb_threshold_is_never_decoded_whole_nor_warned_about() -> None:
    data = _jpeg(10000, 9200)  # 92 Mpx: over Pillow's warning threshold (89.5 Mpx), under ingest's max_pixels
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        im = decode_rgb(data, 1024 * 1024)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert im.width * im.height <= 1024 * 1024
    assert grown_mb < 150, f"peak grew by {grown_mb:.0f} MB: the 276 MB bitmap was decoded"


def test_chunks_are_bounded_by_count_and_pixels() -> None:
    items = list("abcdefg")
    pixels = [10, 10, 50, 10, 200, 10, 10]
    assert list(pixel_chunks(items, pixels, count=3, budget=60)) == [["a", "b"], ["c", "d"], ["e"], ["f", "g"]]
    assert list(pixel_chunks(items, pixels, count=2, budget=10**9)) == [["a", "b"], ["c", "d"], ["e", "f"], ["g"]]


def test_the_trainer_skips_and_counts_a_sample_it_cannot_decode() -> None:
    from prx_assets.training.data import SKIPPED, bucketed_batches, decode_to_bucket

    good = decode_to_bucket(_jpeg(640, 480), (256, 192))
    assert good.shape == (3, 192, 256)
    samples = [{"image_id": "a", "bucket": "4:3", "pixels": good}, {"image_id": "b", SKIPPED: "OSError: broken data"},
               {"image_id": "c", "bucket": "4:3", "pixels": good}]
    skipped: list[tuple[str, str]] = []
    batches = list(bucketed_batches(iter(samples), 2, skipped))
    assert [[s["image_id"] for s in b] for b in batches] == [["a", "c"]] and skipped == [("b", "OSError: broken data")]
