"""Exact squared errors of 8-bit images over tiles and cells, summed in float32 where that is exact.

The first-generation PSNR at ingest and the q92 check's map of the first cycle's error need, for
many small regions of an absolute-difference image, the sum of its squared values. A region's
squared differences are summed in runs of ``EXACT_RUN`` values: a run's sum is an integer of at most
``EXACT_RUN * 255**2`` (12.5M, under 2**24), so float32 holds every partial sum exactly in whatever
order NumPy adds them; the runs then add up in float64 (exact up to 2**53). That is one vectorized
pass over a view of the pixels, where an int32 subtraction of two tile views took 1.6x the time
(0.63 against 0.38 ms for ingest's 16-tile mosaic) and a Pillow histogram per cell cost a call per
cell (the check's map of a 1-Mpx image: 8.2 against 6.8 ms).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

#: Squared 8-bit differences summed at a time in float32: at most ``EXACT_RUN * 255**2 < 2**24``.
EXACT_RUN = 192


def run_squared_sums(v: np.ndarray) -> np.ndarray:
    """Sums of squares of the uint8 array ``v`` over its last axis (a multiple of ``EXACT_RUN`` long),
    exactly, as float64 of the shape of ``v`` without its last axis.

    >>> run_squared_sums(np.full((2, 384), 255, np.uint8)).tolist() == [384 * 255**2] * 2
    True
    """
    if v.shape[-1] % EXACT_RUN:
        raise ValueError(f"runs of {v.shape[-1]} values: a multiple of {EXACT_RUN} is summed exactly in float32")
    f = v.reshape(*v.shape[:-1], v.shape[-1] // EXACT_RUN, EXACT_RUN).astype(np.float32)
    return np.einsum("...j,...j->...", f, f).sum(axis=-1, dtype=np.float64)


def mosaic_squared_errors(diff: Image.Image, rows: int, cols: int, tile: int, margin: int) -> np.ndarray:
    """Each cell's squared error, summed over channels, over its tile (the cell less its ``margin``)
    in ``diff``, an RGB absolute-difference image of ``rows`` x ``cols`` cells of ``tile + 2 * margin``
    pixels (cells row by row), as int64, exactly; ``tile`` a multiple of 64 (a tile's pixel row is
    then whole runs of ``EXACT_RUN`` values).

    >>> d = Image.new("RGB", (2 * 68, 68), (255, 255, 255))
    >>> mosaic_squared_errors(d, 1, 2, 64, 2).tolist() == [64 * 64 * 3 * 255**2] * 2
    True
    """
    if (3 * tile) % EXACT_RUN:
        raise ValueError(f"tiles of {tile} pixels: a multiple of {EXACT_RUN // 3} is summed exactly")
    cell = tile + 2 * margin
    v = np.asarray(diff).reshape(rows, cell, cols, cell * 3)[:, margin:margin + tile, :, 3 * margin:3 * (margin + tile)]
    return run_squared_sums(v).sum(axis=1).astype(np.int64).ravel()


def band_cell_squared_errors(diff: Image.Image, cell: int) -> np.ndarray | None:
    """The squared error, summed over channels, of each ``cell``-wide column of ``diff``, an RGB
    absolute-difference image of one band of cells (its last cell cut at the edge), as float64,
    exactly; ``None`` when ``cell`` is not a multiple of 64 (the caller sums each cell itself).

    >>> band_cell_squared_errors(Image.new("RGB", (300, 10), (1, 2, 3)), 128).tolist()
    [17920.0, 17920.0, 6160.0]
    """
    if (3 * cell) % EXACT_RUN:
        return None
    a = np.asarray(diff)
    h, w = a.shape[:2]
    full = w // cell
    out = np.empty(-(-w // cell), dtype=np.float64)
    if full:
        out[:full] = run_squared_sums(a[:, :full * cell].reshape(h, full, cell * 3)).sum(axis=0)
    if w > full * cell:
        rest = a[:, full * cell:].astype(np.int64)
        out[full] = float((rest * rest).sum())
    return out
