"""Metadata pictures: contact sheets and charts decode, and carry what they claim."""

import base64
import io
import re

from PIL import Image

from prx_assets.core.visuals import bar_chart, contact_sheet, line_chart, md_image
from prx_assets.infra.pictures import resolution_bins
from tests.helpers import encode, photo


def _decode(markdown: str) -> Image.Image:
    m = re.search(r"data:image/(png|jpeg);base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert m, markdown[:80]
    return Image.open(io.BytesIO(base64.b64decode(m.group(2))))


def test_contact_sheet_is_a_grid_of_thumbnails_and_survives_a_broken_image() -> None:
    items = [(encode(photo(320, 200, seed=i), "JPEG"), f"caption {i}") for i in range(5)] + [(b"junk", "broken")]
    sheet = Image.open(io.BytesIO(contact_sheet(items, thumb=64, cols=4)))
    assert sheet.format == "JPEG"
    assert sheet.size == (4 * 72, 2 * (72 + 4 * 12))  # 6 items -> 4 columns x 2 rows
    # The first cell holds a thumbnail (not background), the unused last cells are white.
    assert sheet.getpixel((36, 36)) != (255, 255, 255)
    assert sheet.getpixel((3 * 72 + 36, 72 + 48 + 36)) == (255, 255, 255)


def test_charts_are_png_and_embed_as_markdown_images() -> None:
    bar = md_image(bar_chart({"1:1": 5, "16:9": 2}, "buckets"), "buckets")
    line = md_image(line_chart([44.0, 42.5, 41.0], "psnr", threshold=37.0), "psnr")
    assert bar.startswith("![buckets](data:image/png;base64,")
    assert _decode(bar).format == "PNG" and _decode(line).format == "PNG"
    jpeg = md_image(contact_sheet([(encode(photo(), "JPEG"), "c")]), "sheet")
    assert jpeg.startswith("![sheet](data:image/jpeg;base64,")


def test_resolution_bins_are_ordered_and_complete() -> None:
    sizes = [(100, 100), (1000, 1000), (1000, 1000), (3000, 2000)]
    assert resolution_bins(sizes) == {"<0.25 MP": 1, "1-2 MP": 2, ">4 MP": 1}


def test_aspect_buckets_are_ordered_by_ratio_not_text() -> None:
    from prx_assets.infra.pictures import by_aspect

    got = by_aspect({"16:9": 1, "1:1": 2, "3:4": 3, "9:16": 4, "4:3": 5, "other": 6})
    assert list(got) == ["9:16", "3:4", "1:1", "4:3", "16:9", "other"]
