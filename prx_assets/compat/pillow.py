"""Pillow: its JPEG encoder called directly.

``Image.save`` spends a third of the time of encoding a 160-pixel tile in Python (plugin lookup,
``info`` handling, marker writing), and the q92 check encodes dozens of tiles per sampled image;
:func:`prx_assets.core.ingest.images.encode_jpeg` therefore hands libjpeg the arguments Pillow's
own writer built (read back once per setting) through ``Image._getencoder``. No public Pillow API
encodes without that work and no upstream issue asks for one; outside the checked versions this
shim answers ``None`` and the caller uses ``save`` (same bytes, slower).
"""

from __future__ import annotations

import functools
from typing import Any

from PIL import Image

from prx_assets.compat import CompatError, guard

CHECKED = ">=10.3,<14"


@functools.cache
def _getencoder() -> Any | None:
    """Pillow's encoder factory when this Pillow is one the shim was checked against (decided once:
    the q92 cycles call :func:`jpeg_encoder` dozens of times per sampled image)."""
    try:
        guard("pillow", CHECKED, "the direct JPEG encoder", "Pillow's Image.save (no issue filed)")
    except CompatError:
        return None
    return getattr(Image, "_getencoder", None)


def jpeg_encoder(arguments: tuple[object, ...]) -> Any | None:
    """A libjpeg encoder for RGB pixels with Pillow's JPEG writer ``arguments``, or ``None`` where
    this Pillow is outside the checked versions or lays its encoders out otherwise."""
    getencoder = _getencoder()
    return getencoder("RGB", "jpeg", "RGB", arguments) if getencoder is not None else None
