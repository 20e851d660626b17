"""Synthetic, non-photographic images: the content JPEG q92 serves worst.

Line art, text renders, palette graphics and 1-bit dithering are where real mixed corpora
(scans, diagrams, UI screenshots, game sprites) put the q92 bound under pressure; the
content-aware storage tests and the ingest bench mix them with photos.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

from prx_assets.core.demo.corpus import make_scene

WORDS = ("diffusion", "lance", "shard", "caption", "mixture", "latent", "bucket", "quality")


def line_art(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Black 1-2 px strokes and dense hatching on white (a technical drawing)."""
    im = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(im)
    for _ in range(width // 8):
        x0, y0 = (int(v) for v in rng.integers(0, [width, height]))
        x1, y1 = (int(v) for v in rng.integers(0, [width, height]))
        draw.line([(x0, y0), (x1, y1)], fill=0, width=int(rng.integers(1, 3)))
    left, top = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
    for x in range(left, left + width // 3, 3):  # a hatched region: an edge every 3 pixels
        draw.line([(x, top), (x + height // 4, top + height // 3)], fill=0, width=1)
    return im.convert("RGB")


def text_render(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Lines of small dark text on a light background (a scanned page or a screenshot)."""
    im = Image.new("RGB", (width, height), (250, 250, 245))
    draw = ImageDraw.Draw(im)
    for y in range(4, height - 12, 12):
        words = " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), 12))
        draw.text((4, y), words, fill=(20, 20, 30))
    return im


def palette_graphic(rng: np.random.Generator, width: int, height: int, colors: int = 12) -> Image.Image:
    """Flat regions of a few saturated colors with hard edges (a chart, a sprite, a logo)."""
    palette = rng.integers(0, 256, (colors, 3), dtype=np.uint8)
    cells = rng.integers(0, colors, (height // 8 + 1, width // 8 + 1))
    grid = np.kron(cells, np.ones((8, 8), dtype=np.int64))[:height, :width]
    return Image.fromarray(palette[grid], "RGB")


def dithered(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo reduced to 1 bit by Floyd-Steinberg dithering (a fax, a newspaper scan)."""
    return make_scene(rng, width, height).image.convert("L").convert("1").convert("RGB")


KINDS = {"line_art": line_art, "text": text_render, "palette": palette_graphic, "dithered": dithered}


def mixed_corpus(rng: np.random.Generator, photos: int = 4, per_kind: int = 2,
                 size: tuple[int, int] = (320, 240)) -> dict[str, bytes]:
    """``{file name: PNG bytes}``: ``photos`` photo-like scenes and ``per_kind`` of each synthetic
    kind, all lossless so that ingest sees the content itself."""
    out: dict[str, bytes] = {}
    for i in range(photos):
        out[f"photo_{i:03d}.png"] = _png(make_scene(rng, *size).image.convert("RGB"))
    for kind, fn in KINDS.items():
        for i in range(per_kind):
            out[f"{kind}_{i:03d}.png"] = _png(fn(rng, *size))
    return out


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()
