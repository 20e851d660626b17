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

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prx_assets.compat.lance import take_rows
from prx_assets.core.curate.dedup import (
    EMBEDDING_EXACT_BELOW,
    encode_for_search,
    first_occurrences,
    greedy_keep,
    near_duplicates_embedding,
    phash_keep,
    projected_pairs,
    repeating,
    search_map,
)
from prx_assets.core.curate.digests import content_hash_of, digests_of
from prx_assets.core.curate.digests import has_caption as caption_flags
from prx_assets.core.curate.kept_digests import DigestLookup, KeptDigests
from prx_assets.core.curate.multi_index import SearchModel, SearchModels, probe_width
from prx_assets.core.curate.optout import OptOutRequest
from prx_assets.core.curate.phash_pairs import KeptPhashPairs
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.curate.search_codes import SearchCodes, cells_by_address, codes_by_address, codes_key
from prx_assets.core.curate.search_pairs import KeptPairs
from prx_assets.core.hexdigits import digit_bytes, hex64, hex_digits
from prx_assets.core.lab.changes import vector_matrix
from prx_assets.core.lab.sql import where_in
from prx_assets.core.lab.sync import CAPTION_PREFIX, caption_column
from prx_assets.core.sorted_lookup import lookup
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
    #: Lineage that is not identity (e.g. ``search_model``: the kept model embedding dedup filed rows with).
    lineage: dict[str, Any] = field(default_factory=dict)
    #: How the cut ran, neither identity nor lineage (e.g. ``search_codes``: data files whose codes were
    #: read, computed and deleted); reported in the run's metadata, not written with the subset.
    work: dict[str, Any] = field(default_factory=dict)

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


#: Candidate rows read from the lab at a time.
SCAN_ROWS = 65_536
#: Above this share of the table's rows, survivors' vectors are read by one scan of the column;
#: below it, taken by row id.
SCAN_ABOVE_SHARE = 0.25


def select(ds: lance.LanceDataset, recipe: Recipe, known_captioner_ids: Sequence[str] = (),
           embedding_column: str | None = None, optouts: Sequence[OptOutRequest] = (),
           search_models: SearchModels | None = None, search_codes: SearchCodes | None = None,
           search_pairs: KeptPairs | None = None, digests: KeptDigests | None = None,
           phash_pairs: KeptPhashPairs | None = None) -> Subset:
    """Run ``recipe`` on the lab version ``ds`` (see module docs); ``optouts`` (recorded requests)
    apply to every recipe, each with its own drop count in ``Subset.optout_dropped``.
    ``search_models`` keeps embedding dedup's trained multi-index between cuts (see
    :mod:`prx_assets.core.curate.search_models`): without it, rows added later may move which
    near-threshold pairs among earlier rows are found. ``search_codes`` keeps the survivors' int8
    codes per Lance data file (:mod:`prx_assets.core.curate.search_codes`), so a cut reads the
    vectors of new data files only; the subset is the same with or without it. ``search_pairs``
    (with both of those) keeps the candidate pairs a cut found, so the next one searches only pairs
    with a row no earlier cut searched (:mod:`prx_assets.core.curate.search_pairs`); the subset is
    the same with or without it too. ``digests`` keeps the candidates' content digests and caption
    flags per fragment's data files (:mod:`prx_assets.core.curate.kept_digests`), so a cut reads
    neither caption texts nor ``ingest_config``; ``phash_pairs`` keeps pHash dedup's pairs between
    the recipe's cuts (:mod:`prx_assets.core.curate.phash_pairs`). The subset is the same with or
    without either.

    The candidates stream from one Lance scan (the filters pushed down) in Arrow batches; the rules
    that look at one row at a time (opt-outs, requests, captions) filter each batch as it comes, and
    what is left is reduced to the few columns dedup needs (id, sha256 key, pHash, area, bucket, row
    id) and its images' content digests, so neither caption texts nor URIs are held for the whole
    set. Dedup runs as vectorized masks over the survivors' positions in its order (see
    :mod:`prx_assets.core.curate.dedup`), never a list of rows or a sorted copy of the table, and
    embedding dedup reads the survivors' vectors by row id into int8 codes.
    """
    out = Subset(recipe=recipe.name, version=ds.version, total=ds.count_rows())
    lap = _Laps(out)
    out.caption_columns = resolve_caption_columns(ds, recipe.caption_names(), known_captioner_ids, recipe.name)
    where = _pushed_down_filters(ds, recipe, out)
    threshold = recipe.dedup.embedding_threshold
    if threshold is not None and (embedding_column is None or embedding_column not in ds.schema.names):
        raise CurationError(f"recipe {recipe.name!r} asks for embedding dedup but the lab has no "
                            f"embedding column {embedding_column!r}; materialize image_embeddings "
                            "and lance_table first")
    t = _row_filtered_candidates(ds, recipe, optouts, where, digests, out)
    lap("candidates")

    # Dedup is greedy in one order (most pixels, then id). The rules run on the survivors' positions
    # in that order, each reading only its own column's values, never a sorted copy of the table.
    ids_in_order = id_order(t.column("image_id"))
    alive = dedup_order(t, ids_in_order)
    lap("order")

    def apply(rule: str, keep: np.ndarray) -> None:
        nonlocal alive
        keep = np.asarray(keep, dtype=bool)
        out.dropped[rule] = int(len(alive) - keep.sum())
        alive = alive[keep]

    if recipe.dedup.exact:
        apply("dedup_exact", key_first_occurrences(t.column("_sha"), alive))
        lap("dedup_exact")
    if recipe.dedup.phash_distance is not None:
        apply("dedup_phash", _phash_dedup(ds, t, alive, int(recipe.dedup.phash_distance), phash_pairs, out))
        lap("dedup_phash")
    if threshold is not None and embedding_column is not None:
        kept_state = _EmbeddingState(search_models, search_codes, search_pairs)
        apply("dedup_embedding", _embedding_dedup(ds, t, alive, embedding_column, float(threshold), kept_state, out))
        lap("dedup_embedding")
    kept = t.select(["image_id", "digest", "aspect_bucket"]).take(pa.array(by_id(t.column("image_id"), alive,
                                                                                ids_in_order)))
    del t
    _finish(out, kept, recipe)
    lap("selected")
    return out


def _pushed_down_filters(ds: lance.LanceDataset, recipe: Recipe, out: Subset) -> str | None:
    """The recipe's column filters as one pushed-down predicate; each rule's drop count (one count
    query per rule, in order) goes into ``out.dropped``."""
    clauses: list[str] = []
    remaining = out.total
    for rule, clause in _filters(recipe):
        clauses.append(clause)
        n = _count(ds, clauses, recipe.name)
        out.dropped[rule] = remaining - n
        remaining = n
    return " AND ".join(clauses) or None


def _row_filtered_candidates(ds: lance.LanceDataset, recipe: Recipe, optouts: Sequence[OptOutRequest],
                             where: str | None, digests: KeptDigests | None, out: Subset) -> pa.Table:
    """The candidates of one scan with the per-row rules applied (opt-outs, requests, captions), each
    rule's drops counted in ``out``."""
    rules = _row_rules(recipe, optouts, out.caption_columns)
    t, removed = candidates(ds, where, out.caption_columns, batch_rows=SCAN_ROWS, rules=[rule for _, rule in rules],
                            digests=digests)
    if digests is not None:
        out.work["digests"] = dict(digests.stats)
    for (name, _), n in zip(rules, removed, strict=True):  # requests come before no_caption
        if name.startswith("request:"):
            out.optout_dropped[name.removeprefix("request:")] = n
            continue
        if name == "no_caption" and optouts:
            out.dropped["optout_requests"] = sum(out.optout_dropped.values())
        out.dropped[name] = n
    if optouts:
        out.dropped.setdefault("optout_requests", sum(out.optout_dropped.values()))
    return t


def _phash_dedup(ds: lance.LanceDataset, t: pa.Table, alive: np.ndarray, distance: int,
                 phash_pairs: KeptPhashPairs | None, out: Subset) -> np.ndarray:
    """pHash dedup's keep mask over ``alive`` (kept pairs reused and, on the latest version, kept)."""
    if phash_pairs is not None:
        phash_pairs.stats = {}  # set again only if this cut searches pairs
    keep = phash_keep(_column_at(t, "phash", alive).astype(np.uint64), distance, kept=phash_pairs,
                      keep_found=phash_pairs is not None and ds.version == ds.latest_version)
    if phash_pairs is not None and phash_pairs.stats:
        out.work["phash_pairs"] = dict(phash_pairs.stats)
    return keep


@dataclass
class _EmbeddingState:
    """What embedding dedup keeps between a recipe's cuts (any of it may be absent)."""

    models: SearchModels | None
    codes: SearchCodes | None
    pairs: KeptPairs | None


def _embedding_dedup(ds: lance.LanceDataset, t: pa.Table, alive: np.ndarray, column: str, threshold: float,
                     state: _EmbeddingState, out: Subset) -> np.ndarray:
    """Embedding dedup's keep mask over ``alive``; what the kept state did goes into ``out.work``."""
    if state.models is not None:
        state.models.last = None  # set again only if this cut files its rows with a model
    if state.codes is not None:
        state.codes.stats = {}  # set again only if this cut reads or computes codes
    if state.pairs is not None:
        state.pairs.stats = {}  # set again only if this cut searches with a kept model
    keep = embedding_keep(
        ds, column, _column_at(t, "_rowid", alive), threshold, models=state.models,
        addresses=_column_at(t, "_rowaddr", alive) if state.codes is not None else None,
        search_codes=state.codes, search_pairs=state.pairs)
    if state.codes is not None and state.codes.stats:
        out.work["search_codes"] = dict(state.codes.stats)
    if state.pairs is not None and state.pairs.stats:
        out.work["search_pairs"] = dict(state.pairs.stats)
    if state.models is not None and state.models.last is not None:
        out.lineage["search_model"] = dict(state.models.last)
    return keep


def _finish(out: Subset, kept: pa.Table, recipe: Recipe) -> None:
    """The cap, the selected rows, the content hash and the bucket counts of the cut."""
    if recipe.cap is not None and kept.num_rows > recipe.cap:
        pick = np.sort(np.random.default_rng(recipe.seed).permutation(kept.num_rows)[: recipe.cap])
        out.dropped["cap"] = kept.num_rows - len(pick)
        kept = kept.take(pa.array(pick))
    out.selected = pa.table({"image_id": kept.column("image_id"), "digest": kept.column("digest")},
                            schema=SELECTED_SCHEMA).combine_chunks()
    out.content_hash = content_hash_of(out.caption_columns, out.selected)
    counts = pc.value_counts(kept.column("aspect_bucket")).to_pylist() if kept.num_rows else []
    out.buckets = dict(sorted((c["values"], int(c["counts"])) for c in counts))


class _Laps:
    """Seconds of each stage of a cut, into ``work["seconds"]`` (each call closes the stage that began
    at the one before): where a cut's time goes, reported with its run."""

    def __init__(self, subset: Subset) -> None:
        self.subset = subset
        self.began = time.perf_counter()
        subset.work["seconds"] = {}

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.subset.work["seconds"][stage] = round(now - self.began, 3)
        self.began = now


def id_order(ids: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """Positions of ``ids`` in ascending order, equal ids in position order, from the 64-bit numbers
    the 16-hex-digit ids this project writes spell (the same order as the texts'; a stable NumPy sort,
    about half the time of Arrow's sort of the texts); ``None`` when some id is no such text."""
    keys, ok = hex64(ids)
    return np.argsort(keys, kind="stable") if ok.all() else None


def dedup_order(t: pa.Table, ids_in_order: np.ndarray | None) -> np.ndarray:
    """Positions of the candidates ``t`` (:func:`candidates`) in dedup's order: most pixels first, then
    the smallest id, equal ones in position order, as Arrow's stable sort of the two columns gives.
    With ``ids_in_order`` (:func:`id_order` of the ids) one more stable sort, by pixels: with the ids'
    own sort, 9.8M candidates in 4.3-5.5 s in a 10M-row cut, against about 9 s for Arrow's sort with
    the id texts as its second key."""
    if ids_in_order is None:
        return pc.sort_indices(t, sort_keys=[("_area", "descending"), ("image_id", "ascending")]).to_numpy()
    area = t.column("_area").to_numpy()
    return ids_in_order[np.argsort(-area[ids_in_order], kind="stable")]


def by_id(ids: pa.ChunkedArray | pa.Array, positions: np.ndarray, ids_in_order: np.ndarray | None) -> np.ndarray:
    """``positions`` (distinct positions of ``ids``) in ascending order of their ids, equal ids in
    position order: picked out of ``ids_in_order`` (:func:`id_order`) without sorting again, or, for
    ids that are not all 16 hex digits, by Arrow's sort of the texts."""
    if ids_in_order is not None:
        picked = np.zeros(len(ids), dtype=bool)
        picked[positions] = True
        return ids_in_order[picked[ids_in_order]]
    positions = np.sort(positions)
    return positions[pc.sort_indices(ids.take(pa.array(positions))).to_numpy()]


def _column_at(t: pa.Table, name: str, positions: np.ndarray) -> np.ndarray:
    """The values of column ``name`` at ``positions`` (a NumPy array, in that order)."""
    return t.column(name).combine_chunks().to_numpy(zero_copy_only=False)[positions]


#: A per-batch rule: the keep mask of a batch of candidate rows.
RowRule = Callable[[pa.RecordBatch], pa.Array]


class _NotIn:
    """A rule keeping rows whose id and source URI are in neither list; ``columns`` are what it reads
    (the URIs only when there are URIs to drop: a scan of 10M rows then leaves out about 60 bytes a row)."""

    def __init__(self, ids: Iterable[str], uris: Iterable[str]) -> None:
        self.ids, self.uris = pa.array(sorted(ids), pa.string()), pa.array(sorted(uris), pa.string())
        self.columns = ("image_id", "uri") if len(self.uris) else ("image_id",)

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        gone = pc.is_in(batch.column("image_id"), value_set=self.ids)
        if len(self.uris):
            gone = pc.or_(gone, pc.is_in(batch.column("uri"), value_set=self.uris))
        return pc.invert(pc.fill_null(gone, False))


class _HasCaption:
    """A rule keeping rows with a caption in each of the recipe's caption columns (from the kept
    digests' flag where the batch has it, else from the caption texts the scan reads anyway)."""

    columns: tuple[str, ...] = ()

    def __init__(self, caption_columns: Sequence[str]) -> None:
        self.caption_columns = list(caption_columns)

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        if "_has_caption" in batch.schema.names:  # read from the kept digests (see candidates)
            return batch.column("_has_caption")
        return caption_flags(batch, self.caption_columns)


def _row_rules(recipe: Recipe, optouts: Sequence[OptOutRequest],
               caption_columns: Sequence[str]) -> list[tuple[str, RowRule]]:
    """The rules that look at one row at a time, in the order their drops are counted: the recipe's
    opt-out lists (``optout``), each recorded request (``request:<id>``), then ``no_caption``."""
    rules: list[tuple[str, RowRule]] = []
    ids_out, uris_out = recipe.optout_ids(), recipe.optout_uris()
    if ids_out or uris_out:
        rules.append(("optout", _NotIn(ids_out, uris_out)))
    for req in optouts:
        rules.append((f"request:{req.request_id}", _NotIn(req.image_ids, req.uris)))
    if caption_columns:
        rules.append(("no_caption", _HasCaption(caption_columns)))
    return rules


def candidates(ds: lance.LanceDataset, where: str | None, caption_columns: Sequence[str],
               batch_rows: int = SCAN_ROWS, rules: Sequence[RowRule] = (),
               digests: KeptDigests | None = None) -> tuple[pa.Table, list[int]]:
    """The rows ``where`` selects that every one of ``rules`` keeps (applied per batch, in order),
    as the compact table dedup runs on, and how many rows each rule removed.

    Columns: ``image_id``, ``_sha`` (the original's sha256 as 32 bytes, see :func:`sha_keys`),
    ``phash``, ``_area`` (pixels), ``aspect_bucket``, ``digest`` (content digest), ``_rowid`` and
    ``_rowaddr`` (the row's fragment and offset).
    Streamed from one scan a batch at a time: the caption texts are hashed into the digest, and the
    URIs and captions the rules read are dropped with their batch: what is held is these columns,
    about 93 bytes a row plus the id. With ``digests`` the digests and caption flags are read from
    the kept ones (computed for fragments not seen before), so neither caption texts nor
    ``ingest_config`` are read (``_has_caption`` in the batch for the ``no_caption`` rule). A rule's
    ``columns`` attribute names the columns it reads beyond these; ``uri`` is read only when a rule
    needs it (or does not say: every rule without ``columns`` is taken to read it)."""
    cols = ["image_id", "sha256", "phash", "width", "height", "aspect_bucket"]
    if any("uri" in getattr(rule, "columns", ("uri",)) for rule in rules):
        cols.insert(1, "uri")
    if digests is None:
        cols += ["ingest_config", *caption_columns]
    lookup = digests.bind(ds, caption_columns) if digests is not None else None
    removed = [0] * len(rules)
    parts = []
    try:
        for batch in ds.scanner(columns=cols, filter=where, with_row_id=True, with_row_address=True,
                                batch_size=batch_rows).to_batches():
            part = _candidate_part(batch, rules, removed, caption_columns, lookup)
            if part is not None:
                parts.append(part)
    except BaseException:
        if lookup is not None:
            lookup.close(prune=False)
        raise
    if lookup is not None:
        lookup.close()
    if not parts:
        return pa.schema({"image_id": pa.string(), "_sha": pa.binary(32), "phash": pa.uint64(), "_area": pa.int64(),
                          "aspect_bucket": pa.string(), "digest": pa.string(), "_rowid": pa.uint64(),
                          "_rowaddr": pa.uint64()}).empty_table(), removed
    return pa.concat_tables(parts), removed


def _candidate_part(batch: pa.RecordBatch, rules: Sequence[RowRule], removed: list[int],
                    caption_columns: Sequence[str], lookup: DigestLookup | None) -> pa.Table | None:
    """One scanned batch through ``rules`` (counting into ``removed``) as :func:`candidates`' columns,
    or ``None`` when no row is left."""
    if lookup is not None:
        digest, has = lookup.lookup(batch.column("_rowaddr").to_numpy())
        batch = batch.append_column("_digest", digest).append_column("_has_caption", has)
    for k, rule in enumerate(rules):
        if not batch.num_rows:
            break
        keep = rule(batch)
        if keep.null_count == 0 and pc.all(keep).as_py():  # nothing to drop: no copy of the batch
            continue
        before = batch.num_rows
        batch = batch.filter(keep)
        removed[k] += before - batch.num_rows
    if not batch.num_rows:
        return None
    return pa.table({
        "image_id": batch.column("image_id"), "_sha": sha_keys(batch.column("sha256")),
        "phash": batch.column("phash"),
        "_area": pc.multiply(pc.cast(batch.column("width"), pa.int64()), pc.cast(batch.column("height"), pa.int64())),
        "aspect_bucket": batch.column("aspect_bucket"),
        "digest": batch.column("_digest") if lookup is not None else digests_of(batch, caption_columns),
        "_rowid": batch.column("_rowid"), "_rowaddr": batch.column("_rowaddr")})


#: A sha256 text that is its own 32 bytes (lowercase hex).
_HEX_TEXT = re.compile(r"[0-9a-f]{64}")


def key_first_occurrences(keys: pa.ChunkedArray, order: np.ndarray) -> np.ndarray:
    """Exact dedup of fixed-size binary ``keys`` (:func:`sha_keys`) in the order ``order`` (positions in
    ``keys``): ``True`` for the first occurrence of each key, as :func:`first_occurrences` of the keys'
    dictionary codes gives. The keys' first 8 bytes are sorted as numbers, and only the keys that share
    them with another (duplicates, or two hashes that agree on 64 bits) are compared whole: 9.8M
    sha256 keys in a few tenths of a second, where a dictionary over every key (a hash table of 32-byte
    keys) took 11-14 s at 10M rows.

    >>> k = sha_keys(pa.array(["ab" * 32, "cd" * 32, "ab" * 32, "ab" * 4 + "ef" * 28]))
    >>> key_first_occurrences(pa.chunked_array([k]), np.array([3, 2, 1, 0])).tolist()
    [True, True, True, False]
    """
    width = keys.type.byte_width
    if width < 8:
        return first_occurrences(keys.combine_chunks().take(pa.array(order)).dictionary_encode().indices.to_numpy())
    lead = np.concatenate([_leading_words(c, width) for c in keys.chunks]) if keys.num_chunks else \
        np.zeros(0, np.uint64)
    keep = np.ones(len(order), dtype=bool)
    rows = repeating(lead[order])  # the keys to compare whole, in order
    if len(rows):
        whole = keys.take(pa.array(order[rows])).combine_chunks()
        keep[rows] = first_occurrences(whole.dictionary_encode().indices.to_numpy())
    return keep


def _leading_words(chunk: pa.FixedSizeBinaryArray, width: int) -> np.ndarray:
    """The first 8 bytes of each value of ``chunk`` (values of ``width`` bytes) as a uint64, no copy
    of the values."""
    if not len(chunk):
        return np.zeros(0, np.uint64)
    data = np.frombuffer(chunk.buffers()[1], dtype=np.uint8)[chunk.offset * width:(chunk.offset + len(chunk)) * width]
    return np.ndarray(len(chunk), dtype=np.uint64, buffer=data, strides=(width,))


def sha_keys(sha256: pa.Array) -> pa.FixedSizeBinaryArray:
    """A 32-byte key per sha256 text, equal for two texts exactly when the texts are equal: a
    lowercase 64-digit hex text (every stored sha256) is its 32 bytes; any other text (or null)
    the blake2b-256 digest of a marker and the text, which no hex text's bytes equal in practice.

    >>> k = sha_keys(pa.array(["ab" * 32, "ab" * 32, "AB" * 32, "x"]))
    >>> k[0] == k[1], k[0] == k[2], k[0].as_py()[:2], k[0] == sha_keys(pa.array(["ab" * 32]))[0]
    (True, False, b'\\xab\\xab', True)
    """
    n = len(sha256)
    digits, ok = hex_digits(sha256, 64)
    out = np.empty((n, 32), dtype=np.uint8)
    out[ok] = digit_bytes(digits[ok])
    if not ok.all():
        texts = sha256.cast(pa.string()).to_pylist()
        for i in np.flatnonzero(~ok):
            text = texts[i]
            if text is not None and _HEX_TEXT.fullmatch(text):
                key = bytes.fromhex(text)
            else:
                key = hashlib.blake2b(b"\x00null" if text is None else b"\x00text:" + text.encode(),
                                      digest_size=32).digest()
            out[i] = np.frombuffer(key, dtype=np.uint8)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), n, [None, pa.py_buffer(out.tobytes())])


def embedding_keep(ds: lance.LanceDataset, column: str, row_ids: np.ndarray, threshold: float,
                   models: SearchModels | None = None, addresses: np.ndarray | None = None,
                   search_codes: SearchCodes | None = None, search_pairs: KeptPairs | None = None) -> np.ndarray:
    """Greedy embedding dedup of the rows ``row_ids`` in their order (see
    :mod:`prx_assets.core.curate.dedup`); ``models`` keeps the multi-index's trained part.

    Up to ``EMBEDDING_EXACT_BELOW`` rows their vectors are read into one matrix and every pair is
    compared. Above it only int8 codes of the vectors are held (about 132 bytes a row, 1.3 GB at
    10M: the float32 vectors of 1,152 dimensions would be 46 GB), filled as the vectors stream in,
    or, with ``search_codes`` and the rows' ``addresses``, read from the codes kept per data file
    (computed for the files not seen before), and with ``search_pairs`` too, the candidate pairs
    found by earlier cuts are taken as found; the candidate pairs' full vectors are taken by row id
    afterwards."""
    row_ids = np.asarray(row_ids, dtype=np.uint64)
    n = len(row_ids)
    dim = ds.schema.field(column).type.list_size
    if n <= EMBEDDING_EXACT_BELOW:
        vecs = np.full((n, dim), np.nan, dtype=np.float32)

        def fill(pos: np.ndarray, block: np.ndarray) -> None:
            vecs[pos] = block
        read_by_row_ids(ds, column, row_ids, fill)
        return np.asarray(near_duplicates_embedding(vecs, threshold, overwrite=True), dtype=bool)
    rng = np.random.default_rng(0)  # the same draws as ``embedding_pairs(seed=0)``: the same pairs
    mapping = search_map(dim, rng)
    codes = np.zeros((n, mapping.shape[1]), dtype=np.int8)
    scale = np.zeros(n, dtype=np.float32)
    ok = np.zeros(n, dtype=bool)

    def encode(pos: np.ndarray, block: np.ndarray) -> None:
        good, c, sc = encode_for_search(block, mapping)
        codes[pos[good]] = c
        scale[pos[good]] = sc
        ok[pos[good]] = True
    kept = search_codes is not None and addresses is not None
    if kept:
        def put(pos: np.ndarray, good: np.ndarray, c: np.ndarray, sc: np.ndarray) -> None:
            codes[pos[good]], scale[pos[good]], ok[pos[good]] = c[good], sc[good], True
        codes_by_address(ds, column, addresses, mapping, search_codes, put)
    else:
        read_by_row_ids(ds, column, row_ids, encode)
    valid = np.flatnonzero(ok)
    for a in range(0, len(valid), SCAN_ROWS):  # compact in place: each chunk reads rows at or after it
        take = valid[a:a + SCAN_ROWS]
        codes[a:a + len(take)] = codes[take]
        scale[a:a + len(take)] = scale[take]

    def fetch(rows: np.ndarray) -> np.ndarray:
        out = np.full((len(rows), dim), np.nan, dtype=np.float32)

        def put(pos: np.ndarray, block: np.ndarray) -> None:
            out[pos] = block
        read_by_row_ids(ds, column, row_ids[rows], put, scan=False)
        return out

    def cells(model: SearchModel, model_id: str, table: int) -> np.ndarray:
        """The valid rows' cells in one table of the model, from the cells kept per data file."""
        out = np.empty((len(valid), probe_width(model.tables[table])), dtype=np.int32)

        def put(pos: np.ndarray, block: np.ndarray) -> None:
            out[pos] = block
        assert search_codes is not None and addresses is not None
        cells_by_address(ds, column, np.asarray(addresses)[valid], mapping, search_codes, model, model_id, table,
                         put)
        return out

    if kept and search_pairs is not None:
        search_pairs.bind(ds, column, np.asarray(addresses)[valid], codes_key(mapping))
    later, earlier = projected_pairs(codes[:len(valid)], scale[:len(valid)], ok, threshold, dim, fetch, rng,
                                     models=models, cells=cells if kept else None,
                                     kept_pairs=search_pairs if kept else None)
    return greedy_keep(n, later, earlier)


def read_by_row_ids(ds: lance.LanceDataset, column: str, row_ids: np.ndarray,
                    on_block: Callable[[np.ndarray, np.ndarray], None], batch_rows: int = 32_768,
                    scan: bool | None = None) -> None:
    """Call ``on_block(positions, vectors)`` for the ``column`` vectors of ``row_ids`` (positions
    index ``row_ids``; a null vector is NaN), a block at a time, never the whole column: taken by
    row id in row order, or (``scan``, default above ``SCAN_ABOVE_SHARE`` of the table) picked out
    of one scan of the column (row ids matched by a sorted search, not a set of strings)."""
    n = len(row_ids)
    if not n:
        return
    order = np.argsort(row_ids, kind="stable")
    sorted_ids = row_ids[order]
    if scan is None:
        scan = n > SCAN_ABOVE_SHARE * ds.count_rows()
    if not scan:
        for a in range(0, n, batch_rows):
            got = take_rows(ds, pa.array(sorted_ids[a:a + batch_rows]), [column])
            on_block(order[a:a + batch_rows], vector_matrix(got.column(0)))
        return
    for batch in ds.scanner(columns=[column], with_row_id=True, batch_size=batch_rows).to_batches():
        rid = batch.column("_rowid").to_numpy()
        hit, loc = lookup(sorted_ids, rid)
        if hit.any():
            on_block(order[loc[hit]], vector_matrix(batch.column(0).filter(pa.array(hit))))
