"""The JPEG quality experiment: repeated decode/encode cycles at a fixed quality.

For each image: encode at ``quality``, decode, measure PSNR against the original
pixels, re-encode the decoded pixels, and so on for ``cycles`` rounds. A quality that
is high enough keeps PSNR high after the first cycle and nearly flat afterwards
(generational loss); the storage cost is reported as the JPEG/PNG size ratio.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from prx_assets.core.ingest.images import encode_jpeg


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
    png_bytes: int
    measured_pixels: int = 0  # pixels the cycles ran on (all of them, or the tiles')

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


def measured_regions(width: int, height: int, max_pixels: int = MAX_MEASURED_PIXELS) -> list[tuple[int, int, int, int]]:
    """Boxes ``(left, top, right, bottom)`` the cycles run on: the whole image when it has at
    most ``max_pixels`` (or ``max_pixels`` is 0), else a grid of tiles aligned to 16 pixels.

    >>> measured_regions(640, 480)
    [(0, 0, 640, 480)]
    >>> len(measured_regions(4000, 3000)), measured_regions(4000, 3000)[0]
    (15, (0, 0, 256, 256))
    """
    if max_pixels <= 0 or width * height <= max_pixels:
        return [(0, 0, width, height)]
    tw, th = min(TILE, width), min(TILE, height)
    n = max(1, max_pixels // (tw * th))
    cols = max(1, min(n, round(math.sqrt(n * width / height)), width // tw))
    rows = max(1, min(n // cols, height // th))
    xs = [min(width - tw, (round(i * (width - tw) / max(1, cols - 1)) // 16) * 16) for i in range(cols)]
    ys = [min(height - th, (round(j * (height - th) / max(1, rows - 1)) // 16) * 16) for j in range(rows)]
    return [(x, y, x + tw, y + th) for y in ys for x in xs]


def cycle_curve(rgb: Image.Image, quality: int, cycles: int, subsampling: str = "4:2:0",
                label: str = "", max_pixels: int = MAX_MEASURED_PIXELS) -> CycleCurve:
    """Run ``cycles`` decode/encode rounds on one RGB image (on tiles of it when it is larger than
    ``max_pixels``: PSNR from the squared error summed over the tiles, sizes summed too)."""
    rgb = rgb.convert("RGB")
    regions = measured_regions(rgb.size[0], rgb.size[1], max_pixels)
    sq_err = np.zeros(cycles)
    pixels = 0
    first_size = png_size = 0
    for box in regions:
        tile = rgb if len(regions) == 1 else rgb.crop(box)
        original = np.asarray(tile, dtype=np.int16)
        current = tile
        for i in range(cycles):
            data = encode_jpeg(current, quality, subsampling)
            if i == 0:
                first_size += len(data)
            current = Image.open(io.BytesIO(data))
            current.load()
            diff = original - np.asarray(current, dtype=np.int16)
            sq_err[i] += float(np.einsum("ijk,ijk->", diff, diff, dtype=np.float64))
        pixels += original.size
        png = io.BytesIO()
        tile.save(png, "PNG", compress_level=6)
        png_size += len(png.getvalue())
    curve = [float("inf") if e == 0 else float(10.0 * np.log10(255.0**2 * pixels / e)) for e in sq_err]
    return CycleCurve(label=label, width=rgb.size[0], height=rgb.size[1], psnr_db=tuple(curve),
                      jpeg_bytes=first_size, png_bytes=png_size, measured_pixels=pixels // 3)


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
        """Plain values for reports (the curve, per-image rows, ratio, verdict)."""
        return {
            "quality": self.quality,
            "cycles": self.cycles,
            "mean_psnr_curve_db": [round(v, 3) for v in self.mean_curve],
            "first_cycle_psnr_db": round(self.first_cycle_psnr, 3),
            "max_drop_db": round(self.drop_db, 3),
            "jpeg_to_png_size_ratio": round(self.size_ratio, 4),
            "images": [{"label": c.label, "size": f"{c.width}x{c.height}", "measured_pixels": c.measured_pixels,
                        "psnr_first_db": round(c.psnr_db[0], 2),
                        "psnr_last_db": round(c.psnr_db[-1], 2),
                        "jpeg_to_png": round(c.size_ratio, 4)} for c in self.curves],
            "failures": self.failures,
        }


def run_experiment(images: list[tuple[str, Image.Image]], quality: int, cycles: int,
                   min_psnr_db: float, subsampling: str = "4:2:0") -> QualityReport:
    """Run the cycle experiment on labelled RGB images and judge it against the bounds.

    Examples
    --------
    >>> from PIL import Image
    >>> img = Image.linear_gradient("L").convert("RGB")
    >>> rep = run_experiment([("gradient", img)], 92, 3, min_psnr_db=30)
    >>> rep.passed
    True
    """
    report = QualityReport(quality=quality, cycles=cycles, min_psnr_db=min_psnr_db)
    for label, rgb in images:
        report.curves.append(cycle_curve(rgb, quality, cycles, subsampling, label))
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
