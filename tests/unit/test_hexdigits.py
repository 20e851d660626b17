"""Hex texts as numbers (core/hexdigits.py) against Python's own parsing, and the three users of it
(lab keys, sha256 keys, kept content digests) on the awkward arrays: sliced, large, chunked, with
nulls, wrong lengths, uppercase and empty texts."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from prx_assets.core.curate.kept_digests import hex_to_bytes
from prx_assets.core.curate.selection import sha_keys
from prx_assets.core.hexdigits import bytes_hex, digit_bytes, hex_digits
from prx_assets.core.lab.changes import key64


def _texts(n: int, width: int, seed: int) -> list[str | None]:
    rng = np.random.default_rng(seed)
    out: list[str | None] = []
    for i in range(n):
        h = rng.bytes(width // 2).hex()
        k = i % 7
        out.append(None if k == 0 else h.upper() if k == 1 else h[:-1] if k == 2 else "" if k == 3
                   else h[:-1] + "g" if k == 4 else h)
    return out


def _is_hex(t: str | None, width: int) -> bool:
    return t is not None and len(t) == width and all(c in "0123456789abcdef" for c in t)


@pytest.mark.parametrize("kind", ["plain", "sliced", "large", "chunked", "all_hex", "all_empty"])
def test_hex_digits_match_python(kind: str) -> None:
    texts = _texts(300, 16, 1)
    if kind == "all_hex":
        texts = [t for t in texts if _is_hex(t, 16)]
    if kind == "all_empty":
        texts = ["", None, ""]
    arr: pa.Array | pa.ChunkedArray = pa.array(texts, pa.large_string() if kind == "large" else pa.string())
    if kind == "sliced":
        arr, texts = arr.slice(5, 200), texts[5:205]
    if kind == "chunked":
        arr = pa.chunked_array([arr.slice(0, 100), arr.slice(100)])
    digits, ok = hex_digits(arr, 16)
    assert ok.tolist() == [_is_hex(t, 16) for t in texts]
    rows = np.flatnonzero(ok)
    assert [bytes(b).hex() for b in digit_bytes(digits[rows])] == [texts[i] for i in rows]
    assert bytes_hex(digit_bytes(digits[rows])).to_pylist() == [texts[i] for i in rows]
    keys = key64(arr)
    for i, t in enumerate(texts):
        want = int(t, 16) if _is_hex(t, 16) else \
            int.from_bytes(hashlib.blake2b((t or "").encode(), digest_size=8).digest(), "big")
        assert int(keys[i]) == want, (i, t)


def test_sha_keys_and_kept_digests_on_mixed_arrays() -> None:
    texts = _texts(200, 64, 2)
    arr = pa.array(texts).slice(3)
    keys = sha_keys(arr).to_pylist()
    for key, t in zip(keys, texts[3:], strict=True):
        if _is_hex(t, 64):
            assert key == bytes.fromhex(t)
        else:
            marker = b"\x00null" if t is None else b"\x00text:" + t.encode()
            assert key == hashlib.blake2b(marker, digest_size=32).digest()
    good = pa.array([t for t in _texts(100, 16, 3) if _is_hex(t, 16)]).slice(2)
    assert bytes_hex(hex_to_bytes(good)).equals(good)



def test_ids_sort_as_the_numbers_they_spell_or_as_texts() -> None:
    """A subset's ids are put in order by their 64-bit numbers when every id is 16 lowercase hex
    digits (the order of the texts), and by Arrow's sort of the texts otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from prx_assets.core.curate.selection import by_id, id_order
    from prx_assets.core.hexdigits import hex64

    rng = np.random.default_rng(8)
    vals = rng.integers(0, 2**64, 5000, dtype=np.uint64)
    vals[:3] = [0, 2**64 - 1, 2**63]
    vals[10] = vals[11]  # an id twice: in position order
    hexed = pa.chunked_array([[f"{v:016x}" for v in vals[:2000].tolist()], [f"{v:016x}" for v in vals[2000:].tolist()]])
    keys, ok = hex64(hexed)
    assert ok.all() and np.array_equal(keys, vals)
    some = rng.permutation(np.union1d(rng.permutation(5000)[:3000], [10, 11]))  # distinct, both twins in
    want = np.sort(some)[pc.sort_indices(hexed.take(pa.array(np.sort(some)))).to_numpy()]
    assert np.array_equal(by_id(hexed, some, id_order(hexed)), want)
    mixed = pa.chunked_array([["00000000000000ff", "photo-2", "FFFFFFFFFFFFFFFF", "0000000000000001", "photo-10"]])
    assert id_order(mixed) is None
    assert by_id(mixed, np.array([4, 3, 2, 1, 0]), None).tolist() == pc.sort_indices(mixed).to_numpy().tolist() == [3, 0, 2, 4, 1]


def test_key_first_occurrences_equal_a_dictionary_over_every_key() -> None:
    """Exact dedup compares keys whole only where their first 8 bytes meet: the same first
    occurrences as a dictionary over every key, in any order, over several chunks (one a slice),
    with duplicates and with distinct keys that agree on their first 8 bytes."""
    from prx_assets.core.curate.dedup import first_occurrences
    from prx_assets.core.curate.selection import key_first_occurrences

    rng = np.random.default_rng(12)
    raw = rng.integers(0, 256, (3000, 32), dtype=np.uint8)
    raw[1000:1400] = raw[rng.integers(0, 1000, 400)]  # duplicates
    raw[1400:1500, :8] = raw[1500:1600, :8]  # same first 8 bytes, different keys
    raw[1600:1650] = raw[1400:1450]  # and duplicates of those
    keys = pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), len(raw), [None, pa.py_buffer(raw.tobytes())])
    chunked = pa.chunked_array([keys.slice(0, 700), keys.slice(700, 1600), keys.slice(2300)])
    for order in (np.arange(len(raw)), rng.permutation(len(raw)), rng.permutation(len(raw))[:1700]):
        want = first_occurrences(keys.take(pa.array(order)).dictionary_encode().indices.to_numpy())
        got = key_first_occurrences(chunked, order)
        assert np.array_equal(got, want)
    assert key_first_occurrences(pa.chunked_array([], pa.binary(32)), np.zeros(0, np.int64)).tolist() == []


def test_dedup_order_equals_arrows_sort_by_pixels_then_id() -> None:
    """Dedup's order (most pixels first, then the smallest id, equal ones in position order) from
    NumPy sorts of the ids' numbers equals Arrow's stable sort of the two columns, with hex ids and
    with other ids."""
    import pyarrow.compute as pc

    from prx_assets.core.curate.selection import dedup_order, id_order

    rng = np.random.default_rng(9)
    n = 4000
    ids = [f"{v:016x}" for v in rng.integers(0, 2**63, n).tolist()]
    ids[5] = ids[6]  # an id twice
    area = rng.choice([640 * 480, 1024 * 768, 512 * 512, 300 * 300], n).astype(np.int64)
    for id_texts in (ids, [*ids[:-1], "photo-1"]):
        t = pa.table({"image_id": pa.chunked_array([id_texts[:1500], id_texts[1500:]]),
                      "_area": pa.chunked_array([area[:1000], area[1000:]])})
        want = pc.sort_indices(t, sort_keys=[("_area", "descending"), ("image_id", "ascending")]).to_numpy()
        assert np.array_equal(dedup_order(t, id_order(t.column("image_id"))), want)
