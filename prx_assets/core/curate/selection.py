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
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import lance
import numpy as np

from prx_assets.core.curate.optout import OptOutRequest
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.lab.sql import where_in
from prx_assets.core.lab.sync import CAPTION_PREFIX, caption_column
from prx_assets.errors import PrxError


class CurationError(PrxError):
    """A recipe that cannot run against the lab (unknown column or captioner, bad predicate)."""


@dataclass
class Subset:
    """The result of a recipe at one Lance version."""

    recipe: str
    version: int
    image_ids: list[str] = field(default_factory=list)
    caption_columns: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)
    total: int = 0
    content_hash: str = ""
    digests: list[str] = field(default_factory=list)  # content_digest per image id, same order
    optout_dropped: dict[str, int] = field(default_factory=dict)  # request id -> images it removed


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


def near_duplicates_phash(hashes: Sequence[int], distance: int) -> list[bool]:
    """Greedy in the given order: keep an item unless it is within ``distance`` bits of a kept one.

    Candidates are found by splitting the 64 bits into ``distance + 1`` bands: two hashes
    within the distance agree on at least one band (pigeonhole), so no pair is missed.
    """
    bands = distance + 1
    width = 64 // bands
    masks = [((1 << (width if b < bands - 1 else 64 - width * (bands - 1))) - 1, b * width) for b in range(bands)]
    buckets: list[dict[int, list[int]]] = [{} for _ in range(bands)]
    keep = []
    for h in hashes:
        keys = [(h >> shift) & mask for mask, shift in masks]
        dup = False
        for b, k in enumerate(keys):
            for other in buckets[b].get(k, ()):
                if (h ^ other).bit_count() <= distance:
                    dup = True
                    break
            if dup:
                break
        keep.append(not dup)
        if not dup:
            for b, k in enumerate(keys):
                buckets[b].setdefault(k, []).append(h)
    return keep


def near_duplicates_embedding(vectors: np.ndarray, threshold: float) -> list[bool]:
    """Greedy in the given order: keep a vector unless its cosine with a kept one is >= threshold."""
    kept = np.zeros((len(vectors), vectors.shape[1] if vectors.ndim == 2 else 0), np.float32)
    n_kept = 0
    keep = []
    for v in vectors:
        if v is None or not np.isfinite(v).all():
            keep.append(True)
            continue
        dup = n_kept > 0 and float(np.max(kept[:n_kept] @ v)) >= threshold
        keep.append(not dup)
        if not dup:
            kept[n_kept] = v
            n_kept += 1
    return keep


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
    apply to every recipe, each with its own drop count in ``Subset.optout_dropped``."""
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
    if threshold is not None:
        if embedding_column is None or embedding_column not in ds.schema.names:
            raise CurationError(f"recipe {recipe.name!r} asks for embedding dedup but the lab has no "
                                f"embedding column {embedding_column!r}; materialize image_embeddings "
                                "and lance_table first")
        cols.append(embedding_column)
    rows = ds.to_table(columns=cols, filter=" AND ".join(clauses) or None).to_pylist()
    rows.sort(key=lambda r: (-(r["width"] * r["height"]), r["image_id"]))

    def apply(rule: str, keep: list[bool]) -> None:
        nonlocal rows
        out.dropped[rule] = len(rows) - sum(keep)
        rows = [r for r, k in zip(rows, keep, strict=True) if k]

    ids_out, uris_out = recipe.optout_ids(), recipe.optout_uris()
    if ids_out or uris_out:
        apply("optout", [r["image_id"] not in ids_out and r["uri"] not in uris_out for r in rows])
    for req in optouts:
        req_ids, req_uris = set(req.image_ids), set(req.uris)
        keep = [r["image_id"] not in req_ids and r["uri"] not in req_uris for r in rows]
        out.optout_dropped[req.request_id] = len(rows) - sum(keep)
        rows = [r for r, k in zip(rows, keep, strict=True) if k]
    if optouts:
        out.dropped["optout_requests"] = sum(out.optout_dropped.values())
    if out.caption_columns:
        apply("no_caption", [any(r[c] for c in out.caption_columns) for r in rows])
    if recipe.dedup.exact:
        seen: set[str] = set()
        keep = []
        for r in rows:
            keep.append(r["sha256"] not in seen)
            seen.add(r["sha256"])
        apply("dedup_exact", keep)
    if recipe.dedup.phash_distance is not None:
        apply("dedup_phash", near_duplicates_phash([int(r["phash"]) for r in rows],
                                                   int(recipe.dedup.phash_distance)))
    if threshold is not None:
        vecs = np.array([r[embedding_column] for r in rows], np.float32) if rows else np.zeros((0, 1), np.float32)
        apply("dedup_embedding", near_duplicates_embedding(vecs, float(threshold)))
    ids = sorted(r["image_id"] for r in rows)
    if recipe.cap is not None and len(ids) > recipe.cap:
        pick = np.random.default_rng(recipe.seed).permutation(len(ids))[: recipe.cap]
        chosen = sorted(ids[int(i)] for i in pick)
        out.dropped["cap"] = len(ids) - len(chosen)
        ids = chosen
    out.image_ids = ids
    by_row = {r["image_id"]: r for r in rows}
    out.digests = [content_digest(by_row[i]["sha256"], by_row[i]["ingest_config"],
                                  {c: by_row[i][c] for c in out.caption_columns}) for i in ids]
    out.content_hash = content_hash(out.caption_columns, zip(ids, out.digests, strict=True))
    by_id = {r["image_id"]: r["aspect_bucket"] for r in rows}
    buckets: dict[str, int] = {}
    for i in ids:
        buckets[by_id[i]] = buckets.get(by_id[i], 0) + 1
    out.buckets = dict(sorted(buckets.items()))
    return out
