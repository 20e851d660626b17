"""Fixed-width lowercase hex texts (image ids, sha256s, content digests) as numbers, vectorized
over an Arrow array's buffers: no Python string per row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: The 16 lowercase hex digits, as bytes.
DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
#: Per byte value: its digit's value (0-15), or 255 for a byte that is no lowercase hex digit.
VALUES = np.full(256, 255, dtype=np.uint8)
VALUES[DIGITS] = np.arange(16, dtype=np.uint8)


def hex_digits(texts: pa.Array | pa.ChunkedArray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The digit values of every text of ``width`` lowercase hex digits, as an ``n x width`` uint8
    array, and whether each text is one (not null, ``width`` bytes, every byte a digit); the digits
    of the others are meaningless.

    >>> digits, ok = hex_digits(pa.array(["0f", "0F", None, "abc", "ff"]), 2)
    >>> ok.tolist(), digits[0].tolist(), digits[4].tolist()
    ([True, False, False, False, True], [0, 15], [15, 15])
    """
    arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    n = len(arr)
    if not n:
        return np.zeros((0, width), dtype=np.uint8), np.zeros(0, dtype=bool)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if pa.types.is_large_string(arr.type) else np.int32)
    offsets = offsets[arr.offset:arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    ok = np.diff(offsets) == width
    if arr.null_count:
        ok &= ~np.asarray(arr.is_null(), dtype=bool)
    rows = np.flatnonzero(ok)
    if len(rows) == n:  # every text the right length: one contiguous block of digits
        digits = VALUES[data[offsets[0]:offsets[-1]]].reshape(n, width)
    else:
        digits = np.full((n, width), 255, dtype=np.uint8)
        digits[rows] = VALUES[data[offsets[rows][:, None] + np.arange(width)[None, :]]]
    ok &= (digits != 255).all(axis=1)
    return digits, ok


def hex64(texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Every text of 16 lowercase hex digits as the unsigned 64-bit number it spells (so the numbers'
    order is the texts' order), 0 for the others, and which texts are such.

    >>> keys, ok = hex64(pa.array(["00000000000000ff", "0123456789abcdef", "x", None]))
    >>> keys.tolist(), ok.tolist()
    ([255, 81985529216486895, 0, 0], [True, True, False, False])
    """
    if isinstance(texts, pa.ChunkedArray):  # a chunk at a time: no copy of every text at once
        parts = [hex64(c) for c in texts.chunks]
        if not parts:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=bool)
        return np.concatenate([k for k, _ in parts]), np.concatenate([o for _, o in parts])
    digits, ok = hex_digits(texts, 16)
    out = np.zeros(len(ok), dtype=np.uint64)
    rows = np.flatnonzero(ok)
    if len(rows):  # the digits' 8 bytes, most significant first, read as one big-endian word
        raw = digit_bytes(digits if len(rows) == len(ok) else digits[rows])
        out[rows] = np.ascontiguousarray(raw).view(">u8").ravel()
    return out, ok


def digit_bytes(digits: np.ndarray) -> np.ndarray:
    """Pairs of digit values (from :func:`hex_digits`) as bytes: ``n x width`` to ``n x width/2`` uint8.

    >>> digit_bytes(np.array([[0, 15, 10, 0]], dtype=np.uint8)).tolist()
    [[15, 160]]
    """
    return (digits[:, 0::2] << 4) | digits[:, 1::2]


def bytes_hex(raw: np.ndarray) -> pa.StringArray:
    """An ``n x k`` uint8 array as ``2k``-digit lowercase hex texts (:func:`digit_bytes` undone).

    >>> bytes_hex(np.array([[15, 160]], dtype=np.uint8)).to_pylist()
    ['0fa0']
    """
    n, k = raw.shape
    out = np.empty((n, 2 * k), dtype=np.uint8)
    out[:, 0::2] = DIGITS[raw >> 4]
    out[:, 1::2] = DIGITS[raw & 15]
    offsets = np.arange(0, 2 * k * n + 1, 2 * k, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(out.tobytes()))
