"""Stored images decoded for a model at the size it needs, in chunks bounded by pixels.

A model never needs an image larger than its own input: a SigLIP embedder sees 384x384, a
Qwen3-VL captioner at most its ``max_pixels``. Decoding the stored bytes whole first is what made
enrichment's memory follow the largest image rather than the model (a 9999x9999 PNG: 300 MB of
RGB per image, 5 GB for a chunk of them). So each image is decoded at most at ``max_pixels``:
a JPEG reduced on decode (libjpeg's DCT scaling, ``Image.draft``: the full bitmap never
exists), any other format reduced right after decoding in its own mode (a 1-bit scan stays 1
bit a pixel until it is small), then converted to RGB. Chunks hold as many images as fit
``chunk_pixels`` as well as the count asked for. Images no larger than ``max_pixels`` decode
exactly as before.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import TypeVar

from PIL import Image

#: What a captioner without its own ``max_pixels`` is given at most (2048 x 2048).
CAPTION_DECODE_PIXELS = 2048 * 2048
#: What an image embedder is given at most (4x a 512 x 512 input).
EMBED_DECODE_PIXELS = 1024 * 1024
#: Decoded pixels one chunk holds at most (about 200 MB of RGB; two chunks are in flight).
CHUNK_PIXELS = 64 * 1024 * 1024

T = TypeVar("T")


def decode_rgb(data: bytes, max_pixels: int) -> Image.Image:
    """``data`` (stored image bytes, already validated at ingest) as an RGB image of at most
    ``max_pixels``, aspect kept; never the full bitmap of a JPEG larger than that."""
    with warnings.catch_warnings():
        # Ingest admitted these bytes under its own max_pixels: Pillow's bomb warning says nothing here.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im = Image.open(io.BytesIO(data))
        w, h = im.size
        if w * h <= max_pixels:
            return im.convert("RGB")
        scale = math.sqrt(max_pixels / (w * h))
        size = (max(1, int(w * scale)), max(1, int(h * scale)))
        im.draft("RGB", size)  # JPEG: decoded at 1/2, 1/4 or 1/8 scale, not below ``size``
        if im.mode in ("1", "P", "LA", "PA"):
            im = im.convert("L" if im.mode in ("1", "L", "LA") else "RGBA")
        im.thumbnail(size, Image.Resampling.LANCZOS)
        return im.convert("RGB")


def pixel_chunks(items: Sequence[T], pixels: Sequence[int], count: int, budget: int) -> Iterator[list[T]]:
    """``items`` in order, in chunks of at most ``count`` items and ``budget`` pixels (``pixels``: each
    item's decoded pixels); an item over the budget alone is a chunk of its own."""
    chunk: list[T] = []
    used = 0
    for item, px in zip(items, pixels, strict=True):
        if chunk and (len(chunk) >= count or used + px > budget):
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += px
    if chunk:
        yield chunk
