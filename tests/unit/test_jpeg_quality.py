"""The JPEG generational-loss experiment and its verdict."""

import numpy as np
import pytest
from PIL import Image

from prx_assets.core.config.project import IngestSettings
from prx_assets.core.ingest.jpeg_quality import cycle_curve, pick_sample, psnr, run_experiment
from tests.helpers import photo

S = IngestSettings()


def sample() -> list[tuple[str, Image.Image]]:
    sizes = [(96, 96), (160, 120), (1280, 960), (1440, 810)]  # low and high resolution
    return [(f"{w}x{h}", photo(w, h, seed=i)) for i, (w, h) in enumerate(sizes)]


def test_psnr_basics() -> None:
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    assert psnr(a, b) == float("inf")
    b[0, 0, 0] = 255
    assert psnr(a, b) == pytest.approx(10 * np.log10(255**2 / (255**2 / 48)))


def test_q92_passes_and_reports_the_curve() -> None:
    rep = run_experiment(sample(), S.jpeg_quality, S.q92_cycles, S.q92_min_psnr_db)
    assert rep.passed, rep.failures
    curve = rep.mean_curve
    assert len(curve) == S.q92_cycles and curve[0] > S.q92_min_psnr_db
    assert curve[-1] <= curve[0] + 1e-9  # generational loss never improves fidelity
    assert 0 < rep.size_ratio < 0.5  # JPEG q92 is several times smaller than PNG
    md = rep.to_metadata()
    assert md["failures"] == [] and len(md["images"]) == 4


@pytest.mark.parametrize("quality", [2, 10])
def test_absurdly_low_quality_fails_with_a_named_reason(quality: int) -> None:
    rep = run_experiment(sample(), quality, 3, S.q92_min_psnr_db)
    assert not rep.passed
    assert f"quality {quality}" in rep.failures[0] and "after cycle 1" in rep.failures[0]


def test_higher_quality_costs_more_bytes_and_keeps_more_signal() -> None:
    img = photo(640, 480, seed=3)
    lo, hi = cycle_curve(img, 50, 1), cycle_curve(img, 92, 1)
    assert hi.jpeg_bytes > lo.jpeg_bytes and hi.psnr_db[0] > lo.psnr_db[0]


def test_pick_sample_includes_extremes_and_is_deterministic() -> None:
    rows = [{"image_id": f"{i:02d}", "width": 10 + i, "height": 10 + i} for i in range(30)]
    a, b = pick_sample(rows, 6, seed=1), pick_sample(rows, 6, seed=1)
    assert a == b and len(a) == 6
    ids = {r["image_id"] for r in a}
    assert {"00", "01", "28", "29"} <= ids
    assert pick_sample(rows[:3], 6) == rows[:3]


def test_large_images_are_measured_on_tiles_within_a_few_tenths_of_a_db() -> None:
    """Above MAX_MEASURED_PIXELS the cycles run on 16-aligned tiles: bounded work, and the PSNR
    curve stays within 0.3 dB of the whole image's."""
    import doctest

    from prx_assets.core.demo.corpus import make_scene
    from prx_assets.core.ingest import jpeg_quality
    from prx_assets.core.ingest.jpeg_quality import MAX_MEASURED_PIXELS, cycle_curve, measured_regions

    assert doctest.testmod(jpeg_quality).failed == 0
    for w, h in [(2400, 1800), (5000, 700), (300, 4000)]:
        boxes = measured_regions(w, h)
        assert all(0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h for x0, y0, x1, y1 in boxes)
        assert all((x0 % 16 == 0 or x1 == w) and (y0 % 16 == 0 or y1 == h) for x0, y0, x1, y1 in boxes)
        assert sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in boxes) <= MAX_MEASURED_PIXELS
    image = make_scene(np.random.default_rng(5), 2400, 1800).image
    whole = cycle_curve(image, 92, 4, max_pixels=0)
    tiled = cycle_curve(image, 92, 4)
    assert tiled.measured_pixels <= MAX_MEASURED_PIXELS < whole.measured_pixels == 2400 * 1800
    assert max(abs(a - b) for a, b in zip(whole.psnr_db, tiled.psnr_db, strict=True)) < 0.3
