"""Cut a curated subset from the lab: a list of image ids pinned to one Lance version.

Rules run in a fixed order and every drop is counted: the recipe's predicate, minimum
resolution, aspect buckets (all pushed down to Lance), opt-out lists, missing captions,
exact dedup (sha256), perceptual dedup (pHash Hamming distance), embedding dedup (cosine
similarity), then the optional seeded cap. Duplicates keep the preferred image: most
pixels first, then the smallest image id, so the same recipe on the same version always
gives the same ids.

A subset's identity is its content (:func:`content_hash`): the selected ids with the sha256
of their originals and the caption texts of the caption columns it publishes. Re-cutting
from another Lance version that holds the same content gives the same id.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.core.curate.dedup import (
    EMBEDDING_EXACT_BELOW,
    EMBEDDING_PROJECTED_DIM,
    first_occurrences,
    greedy_keep,
    near_duplicates_embedding,
    near_duplicates_phash,
    project_rows,
    projected_pairs,
    projection_matrix,
)
from prx_assets.core.curate.optout import OptOutRequest
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.lab.changes import vector_matrix
from prx_assets.core.lab.sql import where_in
from prx_assets.core.lab.sync import CAPTION_PREFIX, caption_column
from prx_assets.errors import PrxError


class CurationError(PrxError):
    """A recipe that cannot run against the lab (unknown column or captioner, bad predicate)."""


SELECTED_SCHEMA = pa.schema([("image_id", pa.string()), ("digest", pa.string())])


@dataclass
class Subset:
    """The result of a recipe at one Lance version."""

    recipe: str
    version: int
    #: The selected images in id order: ``image_id`` and content ``digest`` (an Arrow table, not lists).
    selected: pa.Table = field(default_factory=SELECTED_SCHEMA.empty_table)
    caption_columns: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)
    total: int = 0
    content_hash: str = ""
    optout_dropped: dict[str, int] = field(default_factory=dict)  # request id -> images it removed

    @property
    def count(self) -> int:
        """How many images were selected."""
        return self.selected.num_rows

    @property
    def image_ids(self) -> list[str]:
        """The selected ids as a Python list (for small subsets and tests; use ``selected`` at scale)."""
        return self.selected.column("image_id").to_pylist()

    @property
    def digests(self) -> list[str]:
        """The content digests, in ``image_ids`` order (see :attr:`image_ids`)."""
        return self.selected.column("digest").to_pylist()


def resolve_caption_columns(ds: lance.LanceDataset, names: Sequence[str], known_ids: Sequence[str],
                            recipe: str) -> list[str]:
    """Map captioner names or ids to caption columns that exist in the table."""
    available = [c for c in ds.schema.names if c.startswith(CAPTION_PREFIX)]
    out = []
    for name in names:
        ids = [i for i in known_ids if i == name or i.rsplit("-", 1)[0] == name]
        cols = [caption_column(i) for i in ids] or [caption_column(name)]
        col = next((c for c in cols if c in available), None)
        if col is None:
            raise CurationError(
                f"recipe {recipe!r}: unknown captioner {name!r} (no column {cols[0]!r} in the lab); "
                f"caption columns: {available or 'none'}; configured captioners: {list(known_ids)}")
        out.append(col)
    return out


def _filters(recipe: Recipe) -> list[tuple[str, str]]:
    out = []
    if recipe.where:
        out.append(("predicate", f"({recipe.where})"))
    res = []
    if recipe.min_side:
        res.append(f"width >= {int(recipe.min_side)} AND height >= {int(recipe.min_side)}")
    if recipe.min_pixels:
        res.append(f"CAST(width AS BIGINT) * CAST(height AS BIGINT) >= {int(recipe.min_pixels)}")
    if res:
        out.append(("min_resolution", " AND ".join(res)))
    if recipe.aspect_buckets:
        out.append(("aspect_bucket", where_in("aspect_bucket", list(recipe.aspect_buckets))))
    return out


def _count(ds: lance.LanceDataset, clauses: list[str], recipe: str) -> int:
    flt = " AND ".join(clauses) or None
    try:
        return ds.count_rows(filter=flt)
    except (ValueError, OSError, RuntimeError) as e:
        msg = str(e).split(", /")[0]
        raise CurationError(f"recipe {recipe!r}: predicate {flt!r} failed: {msg}. "
                            f"Columns: {', '.join(ds.schema.names)}") from None


def content_digest(sha256: str, ingest_config: str, captions: Mapping[str, str | None]) -> str:
    """What a consumer reads of one image: the original (``sha256``), how it was normalized
    (``ingest_config``: a re-encode at another quality is new content) and its caption texts.

    >>> content_digest("ab", "q92", {"caption__a": "a cat"}) != content_digest("ab", "q92", {"caption__a": "a dog"})
    True
    """
    return hashlib.sha256(json.dumps([sha256, ingest_config, sorted(captions.items())]).encode()).hexdigest()[:16]


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


def select(ds: lance.LanceDataset, recipe: Recipe, known_captioner_ids: Sequence[str] = (),
           embedding_column: str | None = None, optouts: Sequence[OptOutRequest] = ()) -> Subset:
    """Run ``recipe`` on the lab version ``ds`` (see module docs); ``optouts`` (recorded requests)
    apply to every recipe, each with its own drop count in ``Subset.optout_dropped``.

    The candidates are one Arrow table (the filters pushed down to Lance); every rule is a
    vectorized mask over it (see :mod:`prx_assets.core.curate.dedup`), never a list of rows.
    """
    out = Subset(recipe=recipe.name, version=ds.version, total=ds.count_rows())
    captions = list(recipe.captions) + [n for n, _ in recipe.caption_mix if n not in recipe.captions]
    out.caption_columns = resolve_caption_columns(ds, captions, known_captioner_ids, recipe.name)
    clauses: list[str] = []
    remaining = out.total
    for rule, clause in _filters(recipe):
        clauses.append(clause)
        n = _count(ds, clauses, recipe.name)
        out.dropped[rule] = remaining - n
        remaining = n
    cols = ["image_id", "uri", "sha256", "ingest_config", "phash", "width", "height", "aspect_bucket",
            *out.caption_columns]
    threshold = recipe.dedup.embedding_threshold
    if threshold is not None and (embedding_column is None or embedding_column not in ds.schema.names):
        raise CurationError(f"recipe {recipe.name!r} asks for embedding dedup but the lab has no "
                            f"embedding column {embedding_column!r}; materialize image_embeddings "
                            "and lance_table first")
    where = " AND ".join(clauses) or None
    t = ds.to_table(columns=cols, filter=where)
    area = pc.multiply(pc.cast(t.column("width"), pa.int64()), pc.cast(t.column("height"), pa.int64()))
    t = t.append_column("_area", area)
    t = t.take(pc.sort_indices(t, sort_keys=[("_area", "descending"), ("image_id", "ascending")]))

    def apply(rule: str, keep: pa.Array | np.ndarray) -> int:
        nonlocal t
        mask = keep if isinstance(keep, pa.Array | pa.ChunkedArray) else pa.array(np.asarray(keep, dtype=bool))
        before = t.num_rows
        t = t.filter(mask)
        out.dropped[rule] = before - t.num_rows
        return before - t.num_rows

    def not_in(ids: Iterable[str], uris: Iterable[str]) -> pa.Array:
        gone = pc.or_(pc.is_in(t.column("image_id"), value_set=pa.array(list(ids), pa.string())),
                      pc.is_in(t.column("uri"), value_set=pa.array(list(uris), pa.string())))
        return pc.invert(gone)

    ids_out, uris_out = recipe.optout_ids(), recipe.optout_uris()
    if ids_out or uris_out:
        apply("optout", not_in(ids_out, uris_out))
    for req in optouts:
        out.optout_dropped[req.request_id] = apply("_request", not_in(req.image_ids, req.uris))
    out.dropped.pop("_request", None)
    if optouts:
        out.dropped["optout_requests"] = sum(out.optout_dropped.values())
    if out.caption_columns:
        has = [pc.fill_null(pc.not_equal(t.column(c), ""), False) for c in out.caption_columns]
        apply("no_caption", functools.reduce(pc.or_, has))
    if recipe.dedup.exact:
        apply("dedup_exact", first_occurrences(t.column("sha256").combine_chunks().dictionary_encode()
                                               .indices.to_numpy()))
    if recipe.dedup.phash_distance is not None:
        apply("dedup_phash", near_duplicates_phash(t.column("phash").to_numpy().astype(np.uint64),
                                                   int(recipe.dedup.phash_distance)))
    if threshold is not None and embedding_column is not None:
        apply("dedup_embedding", embedding_keep(ds, embedding_column, where, t.column("image_id"), float(threshold)))
    t = t.take(pc.sort_indices(t, sort_keys=[("image_id", "ascending")]))
    if recipe.cap is not None and t.num_rows > recipe.cap:
        pick = np.sort(np.random.default_rng(recipe.seed).permutation(t.num_rows)[: recipe.cap])
        out.dropped["cap"] = t.num_rows - len(pick)
        t = t.take(pa.array(pick))
    out.selected = pa.table({"image_id": t.column("image_id"), "digest": _digests(t, out.caption_columns)},
                            schema=SELECTED_SCHEMA)
    out.content_hash = content_hash(out.caption_columns, _pairs(out.selected))
    counts = pc.value_counts(t.column("aspect_bucket")).to_pylist() if t.num_rows else []
    out.buckets = dict(sorted((c["values"], int(c["counts"])) for c in counts))
    return out


def embedding_keep(ds: lance.LanceDataset, column: str, where: str | None, ids: pa.ChunkedArray | pa.Array,
                   threshold: float) -> np.ndarray:
    """Greedy embedding dedup of ``ids`` in their order (see :mod:`prx_assets.core.curate.dedup`).

    Up to ``EMBEDDING_EXACT_BELOW`` survivors, or for vectors of at most twice
    ``EMBEDDING_PROJECTED_DIM`` dimensions, their vectors are read into one matrix. Above it only their
    random projection is held (512 bytes a row instead of 4 per dimension: 5 GB at 10M rows of
    1,152-d instead of 46 GB); the candidate pairs' full vectors are taken by row id afterwards."""
    dim = ds.schema.field(column).type.list_size
    if len(ids) <= EMBEDDING_EXACT_BELOW or dim <= 2 * EMBEDDING_PROJECTED_DIM:
        vecs = survivor_vectors(ds, column, where, ids)
        return np.asarray(near_duplicates_embedding(vecs, threshold, overwrite=True), dtype=bool)
    rng = np.random.default_rng(0)  # the same draws as ``embedding_pairs(seed=0)``: the same pairs
    proj = projection_matrix(dim, rng)
    space, ok, row_ids = survivor_projection(ds, column, where, ids, proj)

    def fetch(rows: np.ndarray) -> np.ndarray:
        return vector_matrix(ds._take_rows(pa.array(row_ids[rows]), columns=[column]).column(0))

    later, earlier = projected_pairs(space, ok, threshold, fetch, rng)
    return greedy_keep(len(ids), later, earlier)


def survivor_projection(ds: lance.LanceDataset, column: str, where: str | None, ids: pa.ChunkedArray | pa.Array,
                        proj: np.ndarray, batch_rows: int = 32_768) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``ids`` in their order: the unit projection of each one's vector (:func:`project_rows`),
    whether it has a finite non-zero vector, and its row id, read batch by batch (the full vectors
    are never held beyond one batch)."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    space = np.zeros((len(ids), proj.shape[1]), dtype=np.float32)
    ok = np.zeros(len(ids), dtype=bool)
    row_ids = np.zeros(len(ids), dtype=np.uint64)
    scan = ds.scanner(columns=["image_id", column], filter=where, batch_size=batch_rows, with_row_id=True)
    for batch in scan.to_batches():
        pos = pc.index_in(batch.column(0), value_set=ids)
        keep = pc.is_valid(pos)
        if not pc.any(keep).as_py():
            continue
        rows = pc.filter(pos, keep).to_numpy()
        good, projected = project_rows(vector_matrix(pc.filter(batch.column(1), keep)), proj)
        space[rows[good]] = projected
        ok[rows[good]] = True
        row_ids[rows] = pc.filter(batch.column("_rowid"), keep).to_numpy()
    return space, ok, row_ids


def survivor_vectors(ds: lance.LanceDataset, column: str, where: str | None, ids: pa.ChunkedArray | pa.Array,
                     batch_rows: int = 32_768) -> np.ndarray:
    """The ``column`` vectors of ``ids``, in their order, as one float32 matrix (rows of ids without
    a vector are NaN). Read batch by batch after the cheaper rules have run, so memory holds the
    survivors' vectors once, never the candidates' Arrow column and copies of it."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    dim = ds.schema.field(column).type.list_size
    out = np.full((len(ids), dim), np.nan, dtype=np.float32)
    for batch in ds.scanner(columns=["image_id", column], filter=where, batch_size=batch_rows).to_batches():
        pos = pc.index_in(batch.column(0), value_set=ids)
        keep = pc.is_valid(pos)
        if not pc.any(keep).as_py():
            continue
        rows = pc.filter(pos, keep).to_numpy()
        out[rows] = vector_matrix(pc.filter(batch.column(1), keep))
    return out


def _digests(t: pa.Table, caption_columns: Sequence[str], chunk: int = 65_536) -> pa.Array:
    """The content digest of every row of ``t``, computed a chunk of rows at a time."""
    parts = []
    for start in range(0, t.num_rows, chunk):
        part = t.slice(start, chunk).select(["sha256", "ingest_config", *caption_columns]).to_pydict()
        caps = [part[c] for c in caption_columns]
        parts.append(pa.array([content_digest(sha, cfg, {c: v[k] for c, v in zip(caption_columns, caps, strict=True)})
                               for k, (sha, cfg) in enumerate(zip(part["sha256"], part["ingest_config"],
                                                                  strict=True))], pa.string()))
    return pa.concat_arrays(parts) if parts else pa.array([], pa.string())


def _pairs(selected: pa.Table, chunk: int = 65_536) -> Iterator[tuple[str, str]]:
    for start in range(0, selected.num_rows, chunk):
        part = selected.slice(start, chunk)
        yield from zip(part.column("image_id").to_pylist(), part.column("digest").to_pylist(), strict=True)
