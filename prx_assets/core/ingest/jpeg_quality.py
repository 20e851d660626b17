"""The JPEG quality experiment: repeated decode/encode cycles at a fixed quality.

For each image: encode at ``quality``, decode, measure PSNR against the original
pixels, re-encode the decoded pixels, and so on for ``cycles`` rounds. A quality that
is high enough keeps PSNR high after the first cycle and nearly flat afterwards
(generational loss); the storage cost is reported as the JPEG/PNG size ratio when asked.

At ingest the experiment runs on a sample that scales with the partition (``q92_sample_share`` of
its images, at least ``q92_sample``), chosen by a hash of the image id, on MCU-aligned tiles of
the pixels ingest has already decoded (``q92_tile_pixels`` per image, through every cycle), drawn
where the stored JPEG loses most and then where a second cycle shows it keeps losing
(:func:`two_phase_curve`): its cost is a fixed small share of the ingest work and its memory the
decoded JPEG and a few tiles. A tile whose
decoded pixels equal the pixels it was encoded from has reached JPEG's fixed point: every later
cycle repeats it exactly, so it is not encoded again.
"""

from __future__ import annotations

import array
import hashlib
import io
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageChops

from prx_assets.core.config.project import IngestSettings
from prx_assets.core.ingest.images import decode_own_jpeg, decode_rgb, encode_jpeg, psnr_db
from prx_assets.core.ingest.pixel_error import band_cell_squared_errors


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 arrays (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    if mse == 0.0:
        return float("inf")
    return float(10.0 * np.log10(255.0**2 / mse))


@dataclass(frozen=True)
class CycleCurve:
    """The experiment on one image."""

    label: str
    width: int
    height: int
    psnr_db: tuple[float, ...]
    jpeg_bytes: int
    png_bytes: int  # 0 when the PNG reference was not measured
    measured_pixels: int = 0  # pixels the cycles ran on (all of them, or the tiles')
    cycles_run: int = 0  # cycles encoded before every tile reached JPEG's fixed point

    def to_json(self) -> dict[str, Any]:
        """Plain values (carried from ingest to the check in the materialization metadata)."""
        return {"label": self.label, "width": self.width, "height": self.height,
                "psnr_db": [round(v, 4) if math.isfinite(v) else None for v in self.psnr_db],
                "jpeg_bytes": self.jpeg_bytes, "png_bytes": self.png_bytes,
                "measured_pixels": self.measured_pixels, "cycles_run": self.cycles_run}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CycleCurve:
        """Inverse of :meth:`to_json` (``None`` PSNR: an exact reproduction, infinite)."""
        return cls(label=str(d["label"]), width=int(d["width"]), height=int(d["height"]),
                   psnr_db=tuple(float("inf") if v is None else float(v) for v in d["psnr_db"]),
                   jpeg_bytes=int(d["jpeg_bytes"]), png_bytes=int(d["png_bytes"]),
                   measured_pixels=int(d.get("measured_pixels", 0)), cycles_run=int(d.get("cycles_run", 0)))

    @property
    def size_ratio(self) -> float:
        """JPEG size over lossless PNG size."""
        return self.jpeg_bytes / self.png_bytes if self.png_bytes else float("nan")


#: Side of the square tiles large images are measured on (a multiple of the 16-pixel JPEG MCU).
TILE = 256
#: Pixels of one image the cycles run on. A larger image is measured on MCU-aligned tiles spread
#: over it in a grid: JPEG codes each 8x8 block (16x16 with 4:2:0 chroma) on its own, so a tile's
#: cycles reproduce the image's there, while time and memory stay bounded by the tiles.
MAX_MEASURED_PIXELS = 16 * TILE * TILE


def measured_regions(width: int, height: int, max_pixels: int = MAX_MEASURED_PIXELS,
                     tile: int = TILE) -> list[tuple[int, int, int, int]]:
    """Boxes ``(left, top, right, bottom)`` the cycles run on: the whole image when it has at
    most ``max_pixels`` (or ``max_pixels`` is 0), else a grid of ``tile``-sided tiles aligned to 16 pixels.

    >>> measured_regions(640, 480)
    [(0, 0, 640, 480)]
    >>> len(measured_regions(4000, 3000)), measured_regions(4000, 3000)[0]
    (15, (272, 368, 528, 624))
    >>> measured_regions(1024, 768, 4 * 128 * 128, tile=128)
    [(192, 128, 320, 256), (704, 128, 832, 256), (192, 512, 320, 640), (704, 512, 832, 640)]
    """
    if max_pixels <= 0 or width * height <= max_pixels:
        return [(0, 0, width, height)]
    tw, th = min(tile, width), min(tile, height)
    n = max(1, max_pixels // (tw * th))
    cols = max(1, min(n, round(math.sqrt(n * width / height)), width // tw))
    rows = max(1, min(n // cols, height // th))
    # Each tile at the centre of its grid cell (not at the image's edges and corners, where
    # photographs are flatter than on average), snapped to the 16-pixel MCU grid.
    xs = [max(0, min(width - tw, round(((i + 0.5) * width / cols - tw / 2) / 16) * 16)) for i in range(cols)]
    ys = [max(0, min(height - th, round(((j + 0.5) * height / rows - th / 2) / 16) * 16)) for j in range(rows)]
    return [(x, y, x + tw, y + th) for y in ys for x in xs]


_SQUARES = np.tile(np.arange(256, dtype=np.float64) ** 2, 3)


def _squared_sum(diff: Image.Image) -> float:
    """Sum of squares over every channel of an RGB absolute-difference image, exactly, from its
    histogram (in C: no array copies of the pixels; the histogram passes to NumPy as one buffer)."""
    return float(np.frombuffer(array.array("q", diff.histogram()), dtype=np.int64) @ _SQUARES)


def _squared_error(a: Image.Image, b: Image.Image) -> float:
    """Sum of squared differences over every channel of two RGB images of one size (:func:`_squared_sum`)."""
    return _squared_sum(ImageChops.difference(a, b))


def cycle_curve(rgb: Image.Image, quality: int, cycles: int, subsampling: str = "4:2:0",
                label: str = "", max_pixels: int = MAX_MEASURED_PIXELS, tile: int = TILE,
                png_reference: bool = True, first_db: float | None = None) -> CycleCurve:
    """Run ``cycles`` decode/encode rounds on one RGB image (on ``tile``-sided tiles of it when it
    is larger than ``max_pixels``: PSNR from the squared error summed over the tiles, sizes summed
    too). A tile stops being encoded once a cycle reproduces its input exactly (JPEG's fixed point:
    the later cycles are that one again). ``png_reference`` also measures the lossless PNG size.

    ``first_db``, the whole image's first-cycle PSNR, anchors a tiled curve: the tiles then give the
    loss from one cycle to the next (a ratio of squared errors, a shift in dB) and the whole image its
    level. This grid was the ingest check's estimate until :func:`error_weighted_curve` replaced it
    (the peer bench measures both): on the bench corpus its worst error over 10 draws of the sample
    was 2.25 dB, as a grid misses the places where the loss concentrates."""
    regions = measured_regions(rgb.size[0], rgb.size[1], max_pixels, tile)
    whole = regions == [(0, 0, rgb.size[0], rgb.size[1])]  # (one tile smaller than the image is a tile)
    if rgb.mode != "RGB":  # (a conversion copies the image: only when needed)
        rgb = rgb.convert("RGB")
    sq_err = np.zeros(cycles)
    pixels = 0
    first_size = png_size = cycles_run = 0
    for box in regions:
        region = rgb if whole else rgb.crop(box)
        current = region
        for i in range(cycles):
            data = encode_jpeg(current, quality, subsampling)
            if i == 0:
                first_size += len(data)
            decoded = decode_own_jpeg(data, current.size)
            err = _squared_error(region, decoded)
            sq_err[i] += err
            cycles_run = max(cycles_run, i + 1)
            if ImageChops.difference(decoded, current).getbbox() is None:  # fixed point: every later cycle
                sq_err[i + 1:] += err                                        # is this one again
                break
            current = decoded
        pixels += region.size[0] * region.size[1] * 3
        if png_reference:
            png = io.BytesIO()
            region.save(png, "PNG", compress_level=6)
            png_size += len(png.getvalue())
    curve = [float("inf") if e == 0 else float(10.0 * np.log10(255.0**2 * pixels / e)) for e in sq_err]
    anchored = first_db is not None and not whole and math.isfinite(curve[0]) and first_db < 99.0
    if anchored:
        shift = float(first_db) - curve[0]  # type: ignore[arg-type]
        curve = [v + shift for v in curve]
    return CycleCurve(label=label, width=rgb.size[0], height=rgb.size[1], psnr_db=tuple(curve),
                      jpeg_bytes=first_size, png_bytes=png_size, measured_pixels=pixels // 3,
                      cycles_run=cycles_run)


#: Side of the cells the per-partition check maps the first cycle's error on and draws its tiles
#: from (a multiple of the 16-pixel MCU). 64-pixel tiles ran 0.4-1.4 dB high against whole images
#: (their edges, where chroma upsampling differs, weigh more); tiles pasted into one mosaic ran
#: 10-14 dB low (the seams).
CHECK_TILE = 128
#: Pixels of the image kept around a drawn tile when it is cycled (a multiple of 16; ``PSNR_MARGIN``):
#: with them the tile's first cycle is exactly the whole image's there (a test checks it bit for bit).
CHECK_MARGIN = 16
#: Most images one partition's check samples (its curves travel in the materialization metadata).
MAX_CHECK_SAMPLE = 512


def first_cycle_db(rgb: Image.Image, jpeg: bytes) -> float:
    """The whole image's first-cycle PSNR: its stored JPEG (the first cycle's bytes) against its pixels."""
    return psnr_db(rgb, decode_rgb(jpeg))


#: Images above this many pixels have their first cycle's error mapped one band of cells at a time,
#: each band encoded again with ``CHECK_MARGIN`` rows of its surroundings (its decode is then the
#: stored JPEG's decode there, bit for bit, as for a tile), instead of decoding the stored JPEG whole:
#: the check's memory is then a band's whatever the image's size (the whole decode alone is 3 bytes a
#: pixel, 288 MB at 96 Mpx), for an encode and decode of about 1.25x the image's pixels (at 24 Mpx
#: 0.22 s against 0.17 s for the whole decode; the check's extra peak 22 MB there, 29 MB at 96 Mpx).
MAP_BANDED_PIXELS = 16 * 2**20


def first_cycle_map(rgb: Image.Image, jpeg: bytes, cell: int = CHECK_TILE, quality: int = 92,
                    subsampling: str = "4:2:0", banded_above: int = MAP_BANDED_PIXELS,
                    ) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
    """The boxes of a grid of ``cell``-sided cells over the image (row by row; the last row and column
    cut at its edges) and each cell's squared error, summed over channels, of ``jpeg``, the image's
    stored JPEG (its first cycle: ``rgb`` encoded at ``quality`` and ``subsampling``), against its
    pixels. Compared a band of cells at a time; an image of more than ``banded_above`` pixels is never
    decoded whole, its bands are encoded again instead (see :data:`MAP_BANDED_PIXELS`).

    >>> im = Image.new("RGB", (300, 130), (9, 9, 9))
    >>> boxes, err = first_cycle_map(im, encode_jpeg(im, 92))
    >>> boxes[-1], err.shape
    ((256, 128, 300, 130), (6,))
    """
    boxes, errors, _ = _first_cycle(rgb, jpeg, cell, quality, subsampling, banded_above)
    return boxes, errors


def _first_cycle(rgb: Image.Image, jpeg: bytes, cell: int, quality: int, subsampling: str, banded_above: int,
                 ) -> tuple[list[tuple[int, int, int, int]], np.ndarray, Image.Image | None]:
    """:func:`first_cycle_map` and the stored JPEG's decode (``None`` for an image mapped band by band)."""
    w, h = rgb.size
    decoded = decode_rgb(jpeg) if w * h <= banded_above else None
    boxes, errors = [], []
    for top in range(0, h, cell):
        rows = (top, min(h, top + cell))
        band = (0, rows[0], w, rows[1])
        stored = decoded.crop(band) if decoded is not None else _decoded_region(rgb, band, CHECK_MARGIN, quality,
                                                                                subsampling)
        diff = ImageChops.difference(rgb.crop(band), stored)
        del stored
        lefts = range(0, w, cell)
        boxes.extend((left, top, min(w, left + cell), rows[1]) for left in lefts)
        by_cell = band_cell_squared_errors(diff, cell)  # the band's cells in one pass
        errors.extend(by_cell.tolist() if by_cell is not None else
                      [_squared_sum(diff.crop((left, 0, min(w, left + cell), rows[1] - top))) for left in lefts])
    return boxes, np.asarray(errors, dtype=np.float64), decoded


def draw_tiles(errors: np.ndarray, n: int, key: str) -> dict[int, int]:
    """Which cells ``n`` draws pick, and how many draws each gets: systematic sampling with
    probability proportional to each cell's first-cycle error, over the cells sorted by it (largest
    first, so the draws spread over the error's range), from a start set by a hash of ``key`` (the same
    on every run). A cell with more than ``1/n`` of the error is drawn for sure, and more than once.

    >>> draw_tiles(np.array([0.0, 6.0, 2.0, 2.0]), 4, "x")
    {1: 3, 3: 1}
    """
    total = float(errors.sum())
    if total <= 0 or n <= 0:
        return {}
    order = np.argsort(-errors, kind="stable")
    start = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=b"prx-q92-tiles").digest(),
                           "big") / 2.0**64
    edges = np.cumsum(errors[order]) / total
    picks = np.minimum(np.searchsorted(edges, (start + np.arange(n)) / n, side="right"), len(order) - 1)
    counts: dict[int, int] = {}
    for i in picks.tolist():
        counts[int(order[i])] = counts.get(int(order[i]), 0) + 1
    return counts


def _tile_cycles(rgb: Image.Image, box: tuple[int, int, int, int], quality: int, cycles: int, subsampling: str,
                 margin: int) -> tuple[np.ndarray, int]:
    """Squared error over ``box`` after each of ``cycles`` cycles of the box with ``margin`` pixels of
    its surroundings, and the cycles encoded before a fixed point."""
    outer, inner = _with_margin(rgb.size, box, margin)
    region = rgb.crop(outer)
    errors, run, _ = _cycles(region, region.crop(inner), inner, quality, cycles, subsampling)
    return errors, run


def _with_margin(size: tuple[int, int], box: tuple[int, int, int, int], margin: int,
                 ) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """``box`` grown by ``margin`` on every side within an image of ``size``, and ``box`` within it."""
    w, h = size
    outer = (max(0, box[0] - margin), max(0, box[1] - margin), min(w, box[2] + margin), min(h, box[3] + margin))
    return outer, (box[0] - outer[0], box[1] - outer[1], box[2] - outer[0], box[3] - outer[1])


def _cycles(current: Image.Image, reference: Image.Image, inner: tuple[int, int, int, int], quality: int,
            cycles: int, subsampling: str) -> tuple[np.ndarray, int, Image.Image]:
    """Cycle ``current`` ``cycles`` times; the squared error of ``inner`` against ``reference`` after each
    cycle, the cycles encoded and the last decode. A cycle that reproduces its input exactly has reached
    JPEG's fixed point: every later cycle is that one again, so it is not encoded again (the last
    cycle's own input is not compared, see :func:`_is_fixed`)."""
    errors = np.zeros(cycles)
    run = 0
    for i in range(cycles):
        decoded = decode_own_jpeg(encode_jpeg(current, quality, subsampling), current.size)
        errors[i] = _squared_error(reference, decoded.crop(inner))
        run = i + 1
        if i + 1 < cycles and _is_fixed(decoded, current):
            errors[i + 1:] = errors[i]
            break
        current = decoded
    return errors, run, current


def _is_fixed(decoded: Image.Image, encoded: Image.Image) -> bool:
    """Whether a cycle reproduced its input exactly (JPEG's fixed point)."""
    return ImageChops.difference(decoded, encoded).getbbox() is None


def _first_cycle_region(rgb: Image.Image, decoded: Image.Image | None, outer: tuple[int, int, int, int],
                        quality: int, subsampling: str, margin: int) -> Image.Image:
    """The stored JPEG's decode over ``outer``: cropped from ``decoded``, or (an image mapped band by band)
    from :func:`_decoded_region`."""
    if decoded is not None:
        return decoded.crop(outer)
    return _decoded_region(rgb, outer, margin, quality, subsampling)


def _decoded_region(rgb: Image.Image, box: tuple[int, int, int, int], margin: int, quality: int,
                    subsampling: str) -> Image.Image:
    """The stored JPEG's decode over ``box`` without decoding it whole: ``box`` encoded with ``margin``
    pixels of its surroundings (a multiple of 16), decoded and cropped back, which is the same bit for bit."""
    outer, inner = _with_margin(rgb.size, box, margin)
    region = rgb.crop(outer)
    return decode_own_jpeg(encode_jpeg(region, quality, subsampling), region.size).crop(inner)


def error_weighted_curve(rgb: Image.Image, jpeg: bytes, quality: int, cycles: int, subsampling: str = "4:2:0",
                         label: str = "", tiles: int = 8, cell: int = CHECK_TILE, margin: int = CHECK_MARGIN,
                         png_reference: bool = False) -> CycleCurve:
    """The cycle curve of an image estimated on ``tiles`` draws of its cells, drawn with probability
    proportional to their error in the stored JPEG ``jpeg`` (the first cycle, :func:`first_cycle_map`).

    Each drawn cell is cycled with ``margin`` pixels of its surroundings, which makes its first cycle
    the whole image's there exactly; a cycle's squared error is estimated as the sum over the draws of
    the drawn cell's error over the probability of drawing it (Hansen-Hurwitz), so the estimate of the first
    cycle is the image's exactly and later cycles are estimated from where the first cycle's loss is.
    A cell's loss from the first cycle to the tenth is bimodal (about 1x where it is at JPEG's fixed
    point, 14-20x where it is not) and grows with its first-cycle error, so tiles drawn by that error
    find the places where the image's loss concentrates, which a fixed grid misses: on the peer bench
    corpus's 4 partitions x 10 draws of the sample the worst error of the sample's mean curve fell from
    2.25 to 0.52 dB, for 16% more time. This was the check's estimate until :func:`two_phase_curve`
    (over 40 draws its worst error was 1.29 dB; ``python -m bench peer`` measures both).
    ``png_reference`` also measures the drawn cells' JPEG/PNG sizes."""
    if rgb.mode != "RGB":
        rgb = rgb.convert("RGB")
    w, h = rgb.size
    boxes, first = first_cycle_map(rgb, jpeg, cell, quality, subsampling)
    total = float(first.sum())
    if total <= 0:  # the stored JPEG reproduces every pixel: so does every later cycle
        return CycleCurve(label, w, h, (float("inf"),) * cycles, len(jpeg), 0, w * h, 1)
    counts = draw_tiles(first, tiles, label)
    estimate = np.zeros(cycles)
    measured = run = jpeg_size = png_size = 0
    for i, count in counts.items():
        box = boxes[i]
        errors, ran = _tile_cycles(rgb, box, quality, cycles, subsampling, margin)
        estimate += errors * (count * total / (tiles * first[i]))
        run = max(run, ran)
        measured += (box[2] - box[0]) * (box[3] - box[1])
        if png_reference:
            region = rgb.crop(box)
            jpeg_size += len(encode_jpeg(region, quality, subsampling))
            png = io.BytesIO()
            region.save(png, "PNG", compress_level=6)
            png_size += len(png.getvalue())
    first_db = 10.0 * math.log10(255.0**2 * w * h * 3 / total)
    # Anchored on the exact first cycle (the estimate's own first cycle equals it but for rounding).
    level = estimate[0] if estimate[0] > 0 else total
    curve = tuple(first_db + 10.0 * math.log10(level / e) if e > 0 else float("inf") for e in estimate)
    return CycleCurve(label=label, width=w, height=h, psnr_db=curve,
                      jpeg_bytes=jpeg_size if png_reference else len(jpeg), png_bytes=png_size,
                      measured_pixels=measured, cycles_run=run)


#: Share of a first draw's second-cycle error that its weight for the second draws keeps when the
#: second cycle did not change the cell's error at all (see :func:`two_phase_curve`): every cell whose
#: later cycles may still differ can be drawn, so the estimate has no bias.
SECOND_DRAW_FLOOR = 0.02


def _later_cycles(picked: dict[int, int], second: dict[int, Any], first: np.ndarray, quality: int, cycles: int,
                  subsampling: str) -> tuple[np.ndarray, int]:
    """What cycles 3.. add to the second cycle's error over the second draws ``picked`` (cell: times
    drawn), each increment over its draw weight; and the most cycles run."""
    added = np.zeros(cycles - 2)
    run = 0
    for i, count in picked.items():
        err2, start, last, reference, inner = second[i]
        if not _is_fixed(last, start):  # else every later cycle is the second again: adds nothing
            later, ran, _ = _cycles(last, reference, inner, quality, cycles - 2, subsampling)
            run = max(run, 2 + ran)
            added += count * (later - err2) / (abs(err2 - first[i]) + SECOND_DRAW_FLOOR * err2)
    return added, run


def two_phase_curve(rgb: Image.Image, jpeg: bytes, quality: int, cycles: int, subsampling: str = "4:2:0",
                    label: str = "", tiles: int = 8, first_draws: int | None = None, cell: int = CHECK_TILE,
                    margin: int = CHECK_MARGIN, png_reference: bool = False) -> CycleCurve:
    """The cycle curve of an image estimated in two phases: ``first_draws`` draws of its cells (default
    three times ``tiles``) in proportion to their error in the stored JPEG ``jpeg``
    (:func:`first_cycle_map`), each cycled once more, then ``tiles`` draws among those in proportion to
    how much that second cycle changed their error, cycled through the rest of the ``cycles``.

    A cell drawn first starts from the stored JPEG's decode around it (with ``margin``), so its second
    cycle is the whole image's there exactly. The second cycle's squared error is estimated over the
    first draws (Hansen-Hurwitz, as :func:`error_weighted_curve`), and what each later cycle adds to it
    over the second draws (double sampling: each second draw's increment over its weight, times the
    weights' mean; :data:`SECOND_DRAW_FLOOR` keeps every weight above zero, so there is no bias). What
    varies from cell to cell after the first cycle is whether the cell keeps losing (about 14-20x its
    first-cycle error by the tenth cycle) or sits at JPEG's fixed point (about 1x, adding nothing); one
    more cycle shows which, so the second draws go to the cells that keep losing. With the check's
    draws (:func:`check_draws`: 24 cells cycled once and 6 through the other 8 cycles, against 8
    through 10; a cell drawn twice is cycled once), on the peer bench corpus's 4 partitions x 40
    draws of the sample the worst error of the mean curves fell from 1.29 to 0.61 dB against
    :func:`error_weighted_curve`, the mean of the draws' worst from 0.43 to 0.22 dB, and the draws
    within 0.3 dB rose from 14 to 36 (7 second draws: 0.49 dB, 0.23 dB and 32, for 6% more time).
    ``png_reference`` measures the first draws' JPEG/PNG sizes."""
    if rgb.mode != "RGB":
        rgb = rgb.convert("RGB")
    w, h = rgb.size
    boxes, first, decoded = _first_cycle(rgb, jpeg, cell, quality, subsampling, MAP_BANDED_PIXELS)
    total = float(first.sum())
    if total <= 0:  # the stored JPEG reproduces every pixel: so does every later cycle
        return CycleCurve(label, w, h, (float("inf"),) * cycles, len(jpeg), 0, w * h, 1)
    n1 = first_draws or 3 * tiles
    drawn = draw_tiles(first, n1, label)
    second: dict[int, tuple[float, Image.Image, Image.Image, Image.Image, tuple[int, int, int, int]]] = {}
    measured = jpeg_size = png_size = 0
    run = 1
    for i in drawn:
        box = boxes[i]
        outer, inner = _with_margin((w, h), box, margin)
        reference = rgb.crop(box)
        start = _first_cycle_region(rgb, decoded, outer, quality, subsampling, margin) if cycles > 1 else None
        if start is not None:
            err, ran, last = _cycles(start, reference, inner, quality, 1, subsampling)
            second[i] = (float(err[0]), start, last, reference, inner)
            run = max(run, 1 + ran)
        measured += (box[2] - box[0]) * (box[3] - box[1])
        if png_reference:
            jpeg_size += len(encode_jpeg(reference, quality, subsampling))
            png = io.BytesIO()
            reference.save(png, "PNG", compress_level=6)
            png_size += len(png.getvalue())
    del decoded
    estimate = np.zeros(cycles)
    estimate[0] = total
    if cycles > 1:
        # One entry per first draw (a cell drawn twice appears twice): its first- and second-cycle errors and
        # its probability, so each draw's second-cycle error over that probability estimates the total.
        cells = [i for i, count in drawn.items() for _ in range(count)]
        e1 = np.array([first[i] for i in cells])
        e2 = np.array([second[i][0] for i in cells])
        prob = e1 / total
        estimate[1] = float((e2 / prob).mean())
        # The second draws estimate what later cycles add to the second (the sum over cells of e_k - e2),
        # drawn by how much the second cycle changed the cell's error (plus a floor, see
        # SECOND_DRAW_FLOOR); each second draw's increment over its weight, times the weights' mean,
        # estimates that sum (double sampling). A cell at JPEG's fixed point adds nothing and is
        # rarely drawn, so the estimate's spread is that among the cells that keep losing.
        weight = (np.abs(e2 - e1) + SECOND_DRAW_FLOOR * e2) / prob
        if cycles > 2 and weight.sum() > 0:
            picked: dict[int, int] = {}
            for j, count in draw_tiles(weight, tiles, f"{label}/second").items():
                picked[cells[j]] = picked.get(cells[j], 0) + count
            added, ran = _later_cycles(picked, second, first, quality, cycles, subsampling)
            run = max(run, ran)
            estimate[2:] = np.maximum(0.0, estimate[1] + weight.mean() * added / tiles)
    first_db = 10.0 * math.log10(255.0**2 * w * h * 3 / total)
    curve = tuple(first_db + 10.0 * math.log10(total / e) if e > 0 else float("inf") for e in estimate)
    return CycleCurve(label=label, width=w, height=h, psnr_db=curve,
                      jpeg_bytes=jpeg_size if png_reference else len(jpeg), png_bytes=png_size,
                      measured_pixels=measured, cycles_run=run)


def check_tiles(settings: IngestSettings) -> int:
    """Tiles' worth of cycles the check spends per image: ``q92_tile_pixels`` over a tile's pixels with
    its margins (8 for the default 196,608: 128-pixel tiles cycled as 160-pixel squares), each through
    ``q92_cycles`` cycles."""
    return max(1, round(settings.q92_tile_pixels / (CHECK_TILE + 2 * CHECK_MARGIN) ** 2))


#: The share of :func:`check_tiles` tiles' cycles the two phases spend: cells drawn by their first-cycle
#: error alone often reach JPEG's fixed point and stop early (58 encodes of 80 per image on the peer
#: bench corpus), the cells the second draws pick keep losing and rarely do.
CHECK_CYCLES_SHARE = 0.9


def check_draws(settings: IngestSettings, cycles: int | None = None) -> tuple[int, int]:
    """The check's first and second draws per image (:func:`two_phase_curve`): three first draws per
    tile of :func:`check_tiles` (each cycled once), and as many second draws (each through the cycles
    after the second) as keep the total within ``CHECK_CYCLES_SHARE`` of those tiles' cycles. For the
    defaults, 24 and 6: 24 + 6 x 8 = 72 tile cycles against 8 tiles through 10 cycles; the check took
    the same time as the one-phase draws (see :func:`two_phase_curve`).

    >>> check_draws(IngestSettings())
    (24, 6)
    """
    cycles = cycles or settings.q92_cycles
    tiles = check_tiles(settings)
    first = 3 * tiles
    return first, max(1, round(CHECK_CYCLES_SHARE * tiles * cycles - first) // max(1, cycles - 2))


def check_curve(rgb: Image.Image, settings: IngestSettings, label: str = "", jpeg: bytes | None = None,
                cycles: int | None = None, png_reference: bool | None = None) -> CycleCurve:
    """One sampled image measured as the q92 check measures it: whole when it has at most
    ``q92_tile_pixels`` pixels (or that setting is 0), else on cells drawn in two phases by where its
    stored JPEG (``jpeg``, its JPEG at the configured settings when ingest has it already) loses most
    and by where it keeps losing (:func:`two_phase_curve`, :func:`check_draws`), through ``q92_cycles``
    (or ``cycles``) cycles."""
    cycles = cycles or settings.q92_cycles
    png = settings.q92_png_reference if png_reference is None else png_reference
    w, h = rgb.size
    if settings.q92_tile_pixels <= 0 or w * h <= settings.q92_tile_pixels:
        return cycle_curve(rgb, settings.jpeg_quality, cycles, settings.jpeg_subsampling, label, 0, CHECK_TILE, png)
    if jpeg is None:
        jpeg = encode_jpeg(rgb, settings.jpeg_quality, settings.jpeg_subsampling)
    first, second = check_draws(settings, cycles)
    return two_phase_curve(rgb, jpeg, settings.jpeg_quality, cycles, settings.jpeg_subsampling, label,
                           second, first, CHECK_TILE, CHECK_MARGIN, png)


def sample_rate(items: int, min_images: int, share: float, cap: int = MAX_CHECK_SAMPLE) -> float:
    """Probability that an image of a partition of ``items`` joins the q92 sample: ``share``, raised
    so that about ``min_images`` are drawn, and lowered so that at most about ``cap`` are.

    >>> sample_rate(500, 6, 0.02), sample_rate(100, 6, 0.02), sample_rate(10**6, 6, 0.02)
    (0.02, 0.06, 0.000512)
    """
    if items <= 0:
        return 1.0
    return min(1.0, max(share, min_images / items), max(cap / items, min_images / items))


def in_sample(image_id: str, rate: float) -> bool:
    """Whether ``image_id`` is in the q92 sample at ``rate``: a hash of the id, so the choice is the
    same on every run and in every process, and independent of the order images arrive in."""
    if rate >= 1.0:
        return True
    h = int.from_bytes(hashlib.blake2b(image_id.encode(), digest_size=8, person=b"prx-q92").digest(), "big")
    return h < rate * 2.0**64


@dataclass
class QualityReport:
    """The experiment over a sample, and the verdict against the bounds."""

    quality: int
    cycles: int
    curves: list[CycleCurve] = field(default_factory=list)
    min_psnr_db: float = 0.0

    @property
    def mean_curve(self) -> list[float]:
        """Mean PSNR per cycle over the sample (finite values only)."""
        out = []
        for i in range(self.cycles):
            vals = [c.psnr_db[i] for c in self.curves if np.isfinite(c.psnr_db[i])]
            out.append(float(np.mean(vals)) if vals else float("inf"))
        return out

    @property
    def first_cycle_psnr(self) -> float:
        """Mean PSNR after the first encode."""
        return self.mean_curve[0] if self.curves else float("nan")

    @property
    def drop_db(self) -> float:
        """Largest per-image PSNR drop between the first and the last cycle (reported)."""
        drops = [c.psnr_db[0] - c.psnr_db[-1] for c in self.curves
                 if np.isfinite(c.psnr_db[0]) and np.isfinite(c.psnr_db[-1])]
        return float(max(drops)) if drops else 0.0

    @property
    def size_ratio(self) -> float:
        """Total JPEG bytes over total PNG bytes for the sample."""
        png = sum(c.png_bytes for c in self.curves)
        return sum(c.jpeg_bytes for c in self.curves) / png if png else float("nan")

    @property
    def failures(self) -> list[str]:
        """Reasons the check fails; empty when it passes."""
        if not self.curves:
            return ["no images sampled"]
        for i, value in enumerate(self.mean_curve, 1):
            if value < self.min_psnr_db:
                return [f"mean PSNR {value:.2f} dB after cycle {i} of {self.cycles} is below the "
                        f"bound {self.min_psnr_db} dB at quality {self.quality}"]
        return []

    @property
    def passed(self) -> bool:
        """True when every bound holds."""
        return not self.failures

    def to_metadata(self) -> dict[str, Any]:
        """Plain values for reports (the curve, per-image rows, verdict; the JPEG/PNG size ratio
        when the PNG reference was measured)."""
        with_png = any(c.png_bytes for c in self.curves)
        images = []
        for c in self.curves:
            row = {"label": c.label, "size": f"{c.width}x{c.height}", "measured_pixels": c.measured_pixels,
                   "cycles_run": c.cycles_run, "psnr_first_db": round(c.psnr_db[0], 2),
                   "psnr_last_db": round(c.psnr_db[-1], 2)}
            if c.png_bytes:
                row["jpeg_to_png"] = round(c.size_ratio, 4)
            images.append(row)
        out = {
            "quality": self.quality,
            "cycles": self.cycles,
            "mean_psnr_curve_db": [round(v, 3) for v in self.mean_curve],
            "first_cycle_psnr_db": round(self.first_cycle_psnr, 3),
            "max_drop_db": round(self.drop_db, 3),
            "images": images,
            "failures": self.failures,
        }
        if with_png:
            out["jpeg_to_png_size_ratio"] = round(self.size_ratio, 4)
        return out


#: Largest image the check measures whole when it confirms a tile estimate near the bound (its
#: cycles hold a few copies of the pixels: 209 MB above the image itself for a 4096 x 4096 one,
#: measured); a larger one keeps its tile estimate.
CONFIRM_MAX_PIXELS = 16 * 2**20


def is_tiled(curve: CycleCurve) -> bool:
    """Whether ``curve`` was measured on tiles of its image rather than on all of it."""
    return 0 < curve.measured_pixels < curve.width * curve.height


def needs_confirmation(report: QualityReport, margin_db: float) -> bool:
    """Whether the check should measure its sampled images whole before judging: some curve is a
    tile estimate and the sample's mean PSNR comes within ``margin_db`` of the bound, or below it,
    after some cycle (``margin_db`` 0: never).

    >>> c = CycleCurve("a", 1000, 1000, (40.0, 38.5), 0, 0, measured_pixels=196_608)
    >>> r = QualityReport(quality=92, cycles=2, curves=[c], min_psnr_db=37.0)
    >>> needs_confirmation(r, 2.0), needs_confirmation(r, 1.0), needs_confirmation(r, 0.0)
    (True, False, False)
    """
    if margin_db <= 0 or not any(is_tiled(c) for c in report.curves):
        return False
    return min(report.mean_curve) < report.min_psnr_db + margin_db


def run_experiment(images: list[tuple[str, Image.Image]], quality: int, cycles: int,
                   min_psnr_db: float, subsampling: str = "4:2:0", max_pixels: int = MAX_MEASURED_PIXELS,
                   tile: int = TILE, png_reference: bool = True) -> QualityReport:
    """Run the cycle experiment on labelled RGB images and judge it against the bounds.

    Examples
    --------
    >>> from PIL import Image, ImageChops
    >>> img = Image.linear_gradient("L").convert("RGB")
    >>> rep = run_experiment([("gradient", img)], 92, 3, min_psnr_db=30)
    >>> rep.passed
    True
    """
    report = QualityReport(quality=quality, cycles=cycles, min_psnr_db=min_psnr_db)
    for label, rgb in images:
        report.curves.append(cycle_curve(rgb, quality, cycles, subsampling, label, max_pixels, tile, png_reference))
    return report


def pick_sample(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Deterministic sample mixing the highest- and lowest-resolution rows with random ones.

    ``rows`` need ``width``, ``height`` and ``image_id``.
    """
    if len(rows) <= n:
        return list(rows)
    by_px = sorted(rows, key=lambda r: (r["width"] * r["height"], r["image_id"]))
    k = max(1, n // 3)
    chosen = {r["image_id"]: r for r in by_px[-k:] + by_px[:k]}
    rest = [r for r in rows if r["image_id"] not in chosen]
    rng = np.random.default_rng(seed)
    for i in rng.permutation(len(rest))[: n - len(chosen)]:
        chosen[rest[int(i)]["image_id"]] = rest[int(i)]
    return sorted(chosen.values(), key=lambda r: r["image_id"])
