"""Content digests of images and the identity of a subset, computed a batch at a time.

An image's digest is what a consumer reads of it: the original (``sha256``), how it was
normalized (``ingest_config``) and its caption texts, hashed as the JSON text
``[sha256, ingest_config, [[caption column, text], ...]]`` (columns sorted). A subset's id
hashes its caption columns, then ``[image id, digest]`` per selected image in id order.

Both definitions are fixed (published subset and shard-set ids depend on them), so the
vectorized forms here build exactly the bytes ``json.dumps`` would: strings that need no JSON
escaping (printable ASCII without quotes or backslashes, as ids, hashes and most captions are)
are joined in Arrow; only rows holding another character go through ``json.dumps``. What is
left per row is one sha256 call.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Strings that ``json.dumps`` writes as they are between quotes (ASCII 0x20-0x7e but ``"`` and ``\``, as json.dumps).
_PLAIN = r"^[\x20\x21\x23-\x5b\x5d-\x7e]*$"


def content_digest(sha256: str, ingest_config: str, captions: Mapping[str, str | None]) -> str:
    """What a consumer reads of one image: the original (``sha256``), how it was normalized
    (``ingest_config``: a re-encode at another quality is new content) and its caption texts.

    >>> content_digest("ab", "q92", {"caption__a": "a cat"}) != content_digest("ab", "q92", {"caption__a": "a dog"})
    True
    """
    return hashlib.sha256(json.dumps([sha256, ingest_config, sorted(captions.items())]).encode()).hexdigest()[:16]


def _plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """True where a string (or null) needs no JSON escaping."""
    return pc.fill_null(pc.match_substring_regex(arr, _PLAIN), True)


def _quoted(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``"text"``, or ``null`` for a null (valid JSON only where :func:`_plain`)."""
    return pc.if_else(pc.is_null(arr), pa.scalar("null"), pc.binary_join_element_wise('"', arr, '"', ""))


def digests_of(table: pa.Table | pa.RecordBatch, caption_columns: Sequence[str]) -> pa.Array:
    """:func:`content_digest` of every row of ``table`` (columns ``sha256``, ``ingest_config`` and
    ``caption_columns``), as a string array, byte for byte what the row-by-row definition gives.

    >>> t = pa.table({"sha256": ["ab", "cd"], "ingest_config": ["q92", "q92"], "caption__a": ['a "cat"', None]})
    >>> digests_of(t, ["caption__a"]).to_pylist() == [content_digest("ab", "q92", {"caption__a": 'a "cat"'}),
    ...                                               content_digest("cd", "q92", {"caption__a": None})]
    True
    """
    if table.num_rows == 0:
        return pa.array([], pa.string())
    cols = sorted(caption_columns)
    sha, cfg = table.column("sha256"), table.column("ingest_config")
    pieces: list[pa.Array | pa.ChunkedArray | str] = ['["', sha, '", "', cfg, '", [']
    plain = pc.fill_null(pc.and_(pc.match_substring_regex(sha, _PLAIN), pc.match_substring_regex(cfg, _PLAIN)), False)
    for k, c in enumerate(cols):
        text = table.column(c)
        plain = pc.and_(plain, _plain(text))
        pieces += [(", " if k else "") + f'["{c}", ', _quoted(text), "]"]
    pieces.append("]]")
    if any(not _plain(pa.array([c])).to_pylist()[0] for c in cols):  # odd column names: the definition
        plain = pa.array([False] * table.num_rows)
    joined = pc.binary_join_element_wise(*pieces, "").cast(pa.binary()).to_pylist()
    plain_rows = plain.to_pylist()
    out: list[str] = []
    slow = [k for k, ok in enumerate(plain_rows) if not ok]
    for row in joined:
        out.append(hashlib.sha256(row).hexdigest()[:16] if row is not None else "")
    if slow:
        part = table.take(pa.array(slow)).select(["sha256", "ingest_config", *cols]).to_pydict()
        for at, k in enumerate(slow):
            out[k] = content_digest(part["sha256"][at], part["ingest_config"][at], {c: part[c][at] for c in cols})
    return pa.array(out, pa.string())


def has_caption(table: pa.Table | pa.RecordBatch, caption_columns: Sequence[str]) -> pa.Array:
    """Whether each row has a non-empty text in any of ``caption_columns`` (at least one column).

    >>> has_caption(pa.table({"a": ["x", "", None], "b": [None, "y", ""]}), ["a", "b"]).to_pylist()
    [True, True, False]
    """
    has = [pc.fill_null(pc.not_equal(table.column(c), ""), False) for c in caption_columns]
    return functools.reduce(pc.or_, has)


def content_hash(caption_columns: Sequence[str], items: Iterable[tuple[str, str]]) -> str:
    """Identity of a subset's content: its caption columns, then ``(image id, content digest)`` per
    selected image in id order. Streamed: memory does not grow with the subset.

    >>> content_hash(["caption__a"], [("i1", "d1")]) == content_hash(["caption__a"], [("i1", "d1")])
    True
    >>> content_hash(["caption__a"], [("i1", "d1")]) == content_hash(["caption__a"], [("i1", "d2")])
    False
    """
    h = hashlib.sha256(json.dumps(list(caption_columns)).encode())
    for image_id, digest in items:
        h.update(b"\n" + json.dumps([image_id, digest]).encode())
    return h.hexdigest()[:20]


def content_hash_of(caption_columns: Sequence[str], selected: pa.Table, chunk: int = 262_144) -> str:
    """:func:`content_hash` of a table of ``image_id`` and ``digest`` (in id order): each chunk of
    plain rows is hashed as one buffer of the same bytes.

    >>> t = pa.table({"image_id": ["i1", 'i"2'], "digest": ["d1", "d2"]})
    >>> content_hash_of(["caption__a"], t) == content_hash(["caption__a"], [("i1", "d1"), ('i"2', "d2")])
    True
    """
    h = hashlib.sha256(json.dumps(list(caption_columns)).encode())
    for start in range(0, selected.num_rows, chunk):
        part = selected.slice(start, chunk)
        ids, digests = part.column("image_id").combine_chunks(), part.column("digest").combine_chunks()
        if ids.null_count == 0 and digests.null_count == 0 and pc.all(pc.and_(_plain(ids), _plain(digests))).as_py():
            lines = pc.binary_join_element_wise('\n["', ids, '", "', digests, '"]', "").cast(pa.large_binary())
            _, offsets, data = lines.buffers()
            bounds = np.frombuffer(offsets, dtype=np.int64)[[lines.offset, lines.offset + len(lines)]]
            h.update(memoryview(data)[int(bounds[0]):int(bounds[1])])
        else:
            for image_id, digest in zip(ids.to_pylist(), digests.to_pylist(), strict=True):
                h.update(b"\n" + json.dumps([image_id, digest]).encode())
    return h.hexdigest()[:20]
