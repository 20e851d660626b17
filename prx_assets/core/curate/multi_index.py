"""Near-duplicate vector pairs at scale: a self-join through an inverted multi-index.

The rows are unit vectors held as int8 codes (:func:`encode_rows`: 1 byte a dimension and one
scale a row; decoding them moves a cosine by at most a few thousandths). Each of ``tables`` independent
tables rotates the vectors at random, splits them into two halves and files every row under
the pair of its halves' nearest k-means centroids (``k`` per half, ``k * k`` cells of about
``CELL_ROWS`` rows: the inverted multi-index of Babenko and Lempitsky, the structure
billion-scale vector indexes use for fine cells). A row is compared with the rows of its
``probes`` nearest cells (by the sum of its halves' distances, among the combinations of the
nearest ``ceil(sqrt(probes))`` centroids of each half) and every pair is kept
whichever row reached the other's cell, so a pair is found when either row's probes reach the
other's cell in any table.

The work grows with ``n`` times ``tables * probes * CELL_ROWS`` (cells stay the same size
as ``n`` grows), not with ``n**1.5`` as a flat inverted file does, and memory holds the codes,
one table's cell lists and a block of products. Recall is measured, not guaranteed: on isotropic
vectors with pairs spread evenly between cosine 0.95 and 1.0 (the hardest case: no cluster
structure to exploit) two tables found 0.99 of the pairs at 1M rows (``bench scale``; a flat
inverted file with 6 probes found 0.96 there at more cost).

Which pairs are found is a function of the two rows alone, so rows added later (that pair with
no earlier row) never change an earlier row's fate: the trained part (rotations and centroids,
:class:`SearchModel`) is kept between cuts, one per size generation (:class:`SearchModels`: the
floor of log2 of the rows, so it is retrained each time the rows double), and every matrix
product whose result decides a row's code or cells runs as same-shaped float64 calls rounded
once (:func:`row_products`), since BLAS picks its kernels by the shape of the call and a row's
float32 sums round differently with other rows beside it.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from prx_assets.errors import PrxError

#: Rows a cell holds on average (``k = sqrt(n / CELL_ROWS)`` centroids per half).
CELL_ROWS = 128
#: Cells a row probes in each table, its home included (from the nearest ``ceil(sqrt(PROBES))`` centroids of each half).
PROBES = 9
#: Independent tables (rotations); a pair missed by one is usually found by another.
TABLES = 2
#: How much lower a threshold on decoded codes is than on the vectors (decoding error, with room).
CODE_MARGIN = 0.015
#: Rows decoded at a time when assigning (a chunk x dim float32 block).
ASSIGN_CHUNK = 65_536
#: Products held at a time in a cell (float32): 64 MB.
PRODUCT_BLOCK = 16 * 2**20
#: k-means iterations per half.
KMEANS_ITERS = 8
#: Rows of every BLAS call in a product whose rows must not depend on each other
#: (:func:`row_products`; 1,024 rows of 1,152 dimensions in float64: 9.4 MB).
PRODUCT_ROWS = 1024
#: Version of the trained model's layout and of how it is trained (part of where models are kept).
MODEL_VERSION = 1


class SearchModelError(PrxError):
    """A kept search model cannot be read or does not fit the rows."""


def row_products(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x @ m`` as float32 with every row's result a function of that row alone: every BLAS call
    has the same shape (``PRODUCT_ROWS`` rows, the last ones zero-padded), sums in float64, and its
    result is rounded once to float32.

    A float32 product is not: BLAS picks its kernels and how it splits the work by the shape of the
    call (a lone row goes through gemv, and on an AMD EPYC with OpenBLAS 0.3.27 even the first 256
    rows of a 512-row call round differently from a 256-row call), so int8 codes and nearest cells
    would move with the rows a row happened to be computed with. With one shape and float64 sums,
    a result can still move only when a kernel's order of summation depends on the row's place in
    the call and the float64 sums straddle a float32 rounding boundary (none seen in 650,000
    values); a decision moves only if that value is also on the decision's own boundary. It costs
    about 2.7 times a float32 product (12.4 against 4.4 s per million rows for curation's shapes).

    >>> rng = np.random.default_rng(0)
    >>> x, m = rng.standard_normal((300, 40)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    >>> bool((row_products(x, m)[299] == row_products(x[299:], m)[0]).all())
    True
    """
    n = len(x)
    m64 = np.asarray(m, dtype=np.float64)
    out = np.empty((n, m.shape[1]), dtype=np.float32)
    block = np.empty((PRODUCT_ROWS, x.shape[1]), dtype=np.float64)
    for a in range(0, n, PRODUCT_ROWS):
        rows = min(PRODUCT_ROWS, n - a)
        block[:rows] = x[a:a + rows]
        if rows < PRODUCT_ROWS:
            block[rows:] = 0.0
        out[a:a + rows] = (block @ m64)[:rows]
    return out


def random_rotation(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal ``dim x dim`` matrix (float32): angles are unchanged through it."""
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def encode_rows(unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows (float) as int8 codes and per-row scales with ``codes * scale`` of unit length.

    >>> codes, scale = encode_rows(np.array([[0.6, 0.8], [1.0, 0.0]], np.float32))
    >>> codes.tolist(), np.round(decode_rows(codes, scale).astype(float), 3).tolist()
    ([[95, 127], [127, 0]], [[0.599, 0.801], [1.0, 0.0]])
    """
    x = np.asarray(unit, dtype=np.float32)
    peak = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-30)
    codes = np.rint(x * (127.0 / peak)).astype(np.int8)
    norm = np.linalg.norm(codes.astype(np.float32), axis=1)
    return codes, (1.0 / np.maximum(norm, 1e-30)).astype(np.float32)


def decode_rows(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8 codes back to (unit) float32 rows."""
    out = codes.astype(np.float32)
    out *= scale[:, None]
    return out


def _kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = KMEANS_ITERS) -> np.ndarray:
    """Euclidean k-means on ``x`` (rows), seeded from ``k`` distinct rows; an empty cluster keeps
    its centroid."""
    cents = x[rng.choice(len(x), size=k, replace=False)].copy()
    for _ in range(iters):
        assign = _nearest(x, cents, 1)[0][:, 0]
        order = np.argsort(assign, kind="stable")
        present, starts, counts = np.unique(assign[order], return_index=True, return_counts=True)
        cents[present] = np.add.reduceat(x[order], starts, axis=0) / counts[:, None]
    return cents


def _nearest(x: np.ndarray, cents: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``x``, its ``p`` nearest centroids (Euclidean) in order, and their squared
    distances minus ``|x|**2`` (the same order)."""
    d = (cents * cents).sum(axis=1)[None, :] - 2.0 * row_products(x, np.ascontiguousarray(cents.T))
    rows = np.arange(len(x))
    idx = np.empty((len(x), p), dtype=np.int64)
    val = np.empty((len(x), p), dtype=np.float32)
    for t in range(p):  # a few argmin passes beat a partition for small p
        best = np.argmin(d, axis=1)
        idx[:, t] = best
        val[:, t] = d[rows, best]
        d[rows, best] = np.inf
    return idx, val


def _grouped(keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``keys`` (cell ids ``first * k + second``, ``k`` centroids per half) grouped by
    key, in position order within a key, and each key's start in them (``k * k + 1`` offsets: key
    ``c`` holds ``rows[at[c]:at[c + 1]]``).

    A stable radix sort on 16-bit digits (numpy's stable sort of ``uint16`` is a radix sort): one
    pass when every key fits 16 bits; else one pass over every key by its first centroid, then each
    first centroid's positions (still in position order) by their second, a bucket at a time, so the
    second pass runs in cache on a ``k``-th of the keys and reads them in position order (``k`` stays
    at most 2**16 up to about 5 * 10**11 rows). About four times as fast as a comparison sort of the
    keys, and twice as fast as a second pass over every key (80M keys of 280 x 280 cells: 4.0 s
    against 8.4 s); 10 bytes an entry (an argsort's positions and a digit). The offsets come from
    counting the keys, not from searching sorted keys.

    >>> rows, at = _grouped(np.array([3, 0, 3, 1], dtype=np.int32), 2)
    >>> rows.tolist(), at.tolist()
    ([1, 3, 0, 2], [0, 1, 2, 2, 4])
    """
    n_cells = k * k
    at = np.zeros(n_cells + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n_cells), out=at[1:])
    if n_cells <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable"), at
    if k > 1 << 16:
        raise SearchModelError(f"a table of {k} centroids per half: at most {1 << 16} are filed (cells of "
                               f"{CELL_ROWS} rows up to about 5 * 10**11 rows)")
    rows = np.argsort((keys // k).astype(np.uint16), kind="stable")
    for first in range(k):
        a, b = at[first * k], at[(first + 1) * k]
        if b - a > 1:
            bucket = rows[a:b]
            rows[a:b] = bucket[np.argsort((keys[bucket] - first * k).astype(np.uint16), kind="stable")]
    return rows, at


def _per_half(table: TableModel, probes: int) -> int:
    """Nearest centroids per half a row of ``table`` looks at: enough for ``probes`` combinations."""
    return min(math.isqrt(probes - 1) + 1, len(table.first))


def probe_width(table: TableModel, probes: int = PROBES) -> int:
    """How many cells of ``table`` each row probes (its home included): :func:`cell_probes`' columns."""
    return min(probes, _per_half(table, probes) ** 2)


def cell_probes(codes: np.ndarray, scale: np.ndarray, table: TableModel, probes: int = PROBES) -> np.ndarray:
    """Each row's ``probes`` nearest cells of one table, nearest first (column 0: its home), from
    the nearest ``ceil(sqrt(probes))`` centroids of each half, as an ``n x probe_width`` int32 array.
    A row's cells depend on it alone (and the table), so they can be computed in any blocks of rows
    and kept (:mod:`prx_assets.core.curate.search_codes`)."""
    n, dim = codes.shape
    half = dim // 2
    k = len(table.first)
    p = _per_half(table, probes)
    probes = probe_width(table, probes)
    cells = np.empty((n, probes), dtype=np.int32)
    for a in range(0, n, ASSIGN_CHUNK):
        x = row_products(decode_rows(codes[a:a + ASSIGN_CHUNK], scale[a:a + ASSIGN_CHUNK]), table.rotation)
        i1, d1 = _nearest(np.ascontiguousarray(x[:, :half]), table.first, p)
        i2, d2 = _nearest(np.ascontiguousarray(x[:, half:]), table.second, p)
        total = (d1[:, :, None] + d2[:, None, :]).reshape(len(x), p * p)
        cell = (i1[:, :, None] * k + i2[:, None, :]).reshape(len(x), p * p)
        nearest = np.argsort(total, axis=1, kind="stable")[:, :probes]
        cells[a:a + len(x)] = np.take_along_axis(cell, nearest, axis=1)
    return cells


#: Positions reordered at a time in place (bounds the temporaries).
REORDER_CHUNK = 1 << 20
#: Queries gathered at a time against a cell's members (their codes as int8 and float32: 1.3 MB
#: for 128-d codes).
QUERY_BLOCK = 2048


class _Scratch:
    """Buffers one table's search reuses for every cell: the queries' codes gathered (int8), the
    same as float32, and the products (grown to the largest block asked for)."""

    def __init__(self, dim: int) -> None:
        self.codes = np.empty((QUERY_BLOCK, dim), dtype=np.int8)
        self.rows = np.empty((QUERY_BLOCK, dim), dtype=np.float32)
        self.out = np.empty(0, dtype=np.float32)

    def products(self, q: np.ndarray, codes: np.ndarray, mv: np.ndarray) -> np.ndarray:
        """``codes[q] @ mv.T`` as float32 (``len(q) <= QUERY_BLOCK``), in the kept buffers: the view
        is overwritten by the next call."""
        m, width = len(q), len(mv)
        np.take(codes, q, axis=0, out=self.codes[:m])
        rows = self.rows[:m]
        rows[...] = self.codes[:m]
        if len(self.out) < m * width:  # grown by doubling, up to the products' block
            self.out = np.empty(max(m * width, min(2 * len(self.out), PRODUCT_BLOCK)), dtype=np.float32)
        return np.matmul(rows, mv.T, out=self.out[:m * width].reshape(m, width))


def _rows_by_cell(cells: np.ndarray, wanted: np.ndarray | None, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``cells`` (:func:`cell_probes`, a row's cells in a row) filed under each cell they
    probe, their homes left out (:func:`_grouped`, rows in order within a cell); with ``wanted``
    (a mask of the same shape as ``cells``, its homes' column cleared here) only the probes it marks."""
    per_row = cells.shape[1]
    if wanted is None:  # every probe but the homes
        rows, at = _grouped(cells[:, 1:].ravel(), k)
        rows //= max(1, per_row - 1)
        return rows, at
    wanted[:, 0] = False
    entries = np.flatnonzero(wanted)
    rows, at = _grouped(cells.ravel()[entries], k)
    for a in range(0, len(rows), REORDER_CHUNK):  # entries[rows] // per_row in place, a chunk at a time
        rows[a:a + REORDER_CHUNK] = entries[rows[a:a + REORDER_CHUNK]] // per_row
    return rows, at


def _old_probes(cells: np.ndarray, fresh_cells: np.ndarray, new: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows that are not ``new`` filed under each cell holding a new row (``fresh_cells``, a mask
    of the cells) that they probe, their homes left out: each such cell's rank among those cells, the
    rows grouped by it (in row order within a cell, as :func:`_rows_by_cell`) and each rank's start in
    them. Keyed by rank rather than by cell, the keys fit one 16-bit radix pass up to 65,535 cells
    holding a new row (a batch of 1% at 10M rows reaches about 56,000 of 78,400 cells), where cell ids
    take two above 65,536 cells; every probe is filed, the others under one more key, last, so that
    each filed probe's row is its position over the probes a row has (no gather back).

    >>> cells = np.array([[0, 1, 2], [1, 0, 2], [2, 1, 0], [1, 2, 0]], dtype=np.int32)
    >>> rank, rows, at = _old_probes(cells, np.array([False, True, True]), np.array([False, False, False, True]))
    >>> rank.tolist(), rows.tolist(), at[:3].tolist()
    ([-1, 0, 1], [0, 2, 0, 1], [0, 2, 4])
    """
    fresh_ids = np.flatnonzero(fresh_cells)
    n_fresh = len(fresh_ids)
    rank = np.full(len(fresh_cells), n_fresh, dtype=np.int32)  # n_fresh: no new row there, filed last
    rank[fresh_ids] = np.arange(n_fresh, dtype=np.int32)
    per_row = cells.shape[1] - 1
    keys = rank[cells[:, 1:]]  # every probe but the homes, as ranks
    keys[new] = n_fresh  # a new row's probes are searched from its side
    # Every probe is filed, those left out under the last key, so that a probe's row is its position
    # over ``per_row``: no list of the wanted probes to gather back from afterwards (a random gather
    # of every filed probe, the largest part of this when half the probes or more are wanted).
    rows, at = _grouped(keys.ravel(), math.isqrt(n_fresh) + 1)
    del keys
    filed = int(at[n_fresh])
    rows.resize(filed, refcheck=False)  # the probes left out are last: dropped without a copy
    rows //= per_row
    rank[rank == n_fresh] = -1
    at = at[:n_fresh + 1]
    return rank, rows, at


def _table_pairs(codes: np.ndarray, scale: np.ndarray, threshold: float, table: TableModel,
                 probes: int, kept: Callable[[], np.ndarray] | None = None,
                 new: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(i, j)``, ``i > j``, with decoded cosine >= ``threshold`` found by one table;
    ``kept()`` gives the rows' :func:`cell_probes` when they are kept (called here, so that they
    are freed once filed, as computed ones are); with ``new`` (a mask of the rows) only the pairs
    with at least one new row.

    With ``new``, a cell's pairs with a new row are its new rows' pairs with its other rows, its
    rows' pairs with the new rows probing it, and its new rows' pairs with the other rows probing
    it; so only the probes of new rows and the other rows' probes into a cell holding a new row
    are filed and visited (a small batch files a small share of the probes: 0.1% new rows in cells
    of 128 reach about 12% of the cells), each kind apart, so a cell takes slices, not masks."""
    cells = cell_probes(codes, scale, table, probes) if kept is None else kept()
    if cells.shape != (len(codes), probe_width(table, probes)):
        raise SearchModelError(f"cells given for {cells.shape[0]} rows x {cells.shape[1]} probes, the table "
                               f"needs {len(codes)} x {probe_width(table, probes)}")
    k = len(table.first)
    home_rows, home_at = _grouped(cells[:, 0], k)
    if new is None:
        probe_rows, probe_at = _rows_by_cell(cells, None, k)
    else:
        new_ids = np.flatnonzero(new)
        fresh_rows, fresh_at = _grouped(cells[new_ids, 0], k)  # each cell's new rows
        fresh_rows = new_ids[fresh_rows]
        fresh_cells = np.diff(fresh_at) > 0  # the cells holding a new row
        new_probe_rows, new_probe_at = _rows_by_cell(cells, np.repeat(new[:, None], cells.shape[1], axis=1), k)
        fresh_rank, old_probe_rows, old_probe_at = _old_probes(cells, fresh_cells, new)
    del cells
    found_i: list[np.ndarray] = []
    found_j: list[np.ndarray] = []

    def keep(a: np.ndarray, b: np.ndarray) -> None:
        found_i.append(np.maximum(a, b))
        found_j.append(np.minimum(a, b))

    scratch = _Scratch(codes.shape[1])

    def against(queries: np.ndarray, members: np.ndarray, mv: np.ndarray) -> None:
        """Pairs of ``queries`` with the cell's ``members`` (decoded as ``mv``) at the threshold."""
        step = max(1, min(QUERY_BLOCK, PRODUCT_BLOCK // max(1, len(members))))
        width = len(members)
        for a in range(0, len(queries), step):
            q = queries[a:a + step]
            # the queries' codes times the members, scaled per query afterwards: the same
            # similarities as decoding the queries first (up to rounding) without scaling every
            # code, which costs as much as the product when a cell holds one or two new rows;
            # gathered and converted into buffers kept for the whole table (a fresh block each
            # time was half of a cell's time when it holds one new row and a thousand queries)
            sims = scratch.products(q, codes, mv)
            sims *= scale[q][:, None]
            hits = np.flatnonzero(sims >= threshold)
            if len(hits):
                keep(q[hits // width], members[hits % width])

    # Every product from here on is small (a cell's rows against a few queries), so BLAS runs one
    # thread: its threads cost more than they share out. On 2 vCPUs, one table's new-row search at 2M
    # rows took 0.66x the time with one thread while another process used a core (the whole search
    # 0.29x), about the same on an idle machine; on a node of many cores each call would wake them all.
    # (Sharing the cells out over Python threads instead gave nothing on 2 vCPUs: not done.)
    with threadpool_limits(limits=1, user_api="blas"):
        if new is not None:
            visit = fresh_cells | (np.diff(new_probe_at) > 0)
            for c in np.flatnonzero(visit & (np.diff(home_at) > 0)):
                members = home_rows[home_at[c]:home_at[c + 1]]
                mv = decode_rows(codes[members], scale[members])
                fresh = fresh_rows[fresh_at[c]:fresh_at[c + 1]]
                if len(fresh):  # pairs inside the cell with a new row (itself: dropped below)
                    fresh_v = decode_rows(codes[fresh], scale[fresh])
                    mi, mj = np.nonzero(fresh_v @ mv.T >= threshold)
                    if len(mi):
                        keep(fresh[mi], members[mj])
                    r = fresh_rank[c]
                    against(old_probe_rows[old_probe_at[r]:old_probe_at[r + 1]], fresh, fresh_v)
                against(new_probe_rows[new_probe_at[c]:new_probe_at[c + 1]], members, mv)
        else:
            for c in np.flatnonzero(np.diff(home_at)):
                members = home_rows[home_at[c]:home_at[c + 1]]
                queries = probe_rows[probe_at[c]:probe_at[c + 1]]
                mv = decode_rows(codes[members], scale[members])
                if len(members) > 1:  # pairs inside the cell, each once
                    mi, mj = np.nonzero(np.triu(mv @ mv.T >= threshold, 1))
                    if len(mi):
                        keep(members[mi], members[mj])
                against(queries, members, mv)
    if not found_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    i, j = np.concatenate(found_i), np.concatenate(found_j)
    distinct = i != j
    return i[distinct], j[distinct]


def cells_per_half(n: int, cell_rows: int = CELL_ROWS) -> int:
    """Centroids per half for ``n`` rows: cells of about ``cell_rows`` rows.

    >>> cells_per_half(1_000_000), cells_per_half(10_000_000)
    (88, 280)
    """
    return max(2, round(math.sqrt(n / cell_rows)))


@dataclass(frozen=True, eq=False)
class TableModel:
    """One table's trained part: a rotation and the k-means centroids of each half of the rotated rows."""

    rotation: np.ndarray
    first: np.ndarray
    second: np.ndarray


@dataclass(frozen=True, eq=False)
class SearchModel:
    """The trained part of the multi-index (see module docs), kept between cuts so that which pairs
    are found does not move when rows are added: ``rows`` is how many rows it was trained on."""

    tables: tuple[TableModel, ...]
    rows: int

    @property
    def dim(self) -> int:
        """Dimensions of the codes it files."""
        return self.tables[0].rotation.shape[0]

    def to_bytes(self) -> bytes:
        """The model as an ``.npz`` file's bytes (float32 arrays, no pickles)."""
        arrays: dict[str, np.ndarray] = {"version": np.array([MODEL_VERSION]), "rows": np.array([self.rows])}
        for t, table in enumerate(self.tables):
            arrays.update({f"rotation{t}": table.rotation, f"first{t}": table.first, f"second{t}": table.second})
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "model") -> SearchModel:
        """A model from :meth:`to_bytes`; :class:`SearchModelError` naming ``where`` when it is not one."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                if int(z["version"][0]) != MODEL_VERSION:
                    raise SearchModelError(f"{where}: search model version {int(z['version'][0])}, this code "
                                           f"reads {MODEL_VERSION}; delete it to train a new one")
                tables = tuple(TableModel(z[f"rotation{t}"], z[f"first{t}"], z[f"second{t}"])
                               for t in range(sum(1 for k in z.files if k.startswith("rotation"))))
                return cls(tables=tables, rows=int(z["rows"][0]))
        except (OSError, KeyError, ValueError, EOFError) as e:
            raise SearchModelError(f"{where} is not a readable search model ({type(e).__name__}: {e}); delete it "
                                   "to train a new one (near-threshold embedding dedup decisions may then "
                                   "differ once)") from None


def train_model(codes: np.ndarray, scale: np.ndarray, rng: np.random.Generator, tables: int = TABLES,
                cell_rows: int = CELL_ROWS) -> SearchModel:
    """Train the rotations and centroids for ``codes`` (:func:`encode_rows`): ``k`` centroids per half
    (cells of about ``cell_rows`` rows), each table's k-means on a sample of the rows."""
    n, dim = codes.shape
    k = min(cells_per_half(n, cell_rows), max(2, n // 8))
    half = dim // 2
    out = []
    for _ in range(max(1, tables)):
        rot = random_rotation(dim, rng)
        sample = np.sort(rng.choice(n, size=min(n, max(65_536, 64 * k)), replace=False))
        x = row_products(decode_rows(codes[sample], scale[sample]), rot)
        first = _kmeans(np.ascontiguousarray(x[:, :half]), k, rng)
        second = _kmeans(np.ascontiguousarray(x[:, half:]), k, rng)
        out.append(TableModel(rot, first, second))
    return SearchModel(tables=tuple(out), rows=n)


def generation(rows: int) -> int:
    """The size generation of ``rows`` (the floor of log2): a kept model serves every cut of its
    generation, so it is retrained each time the rows double (or halve).

    >>> generation(1_000_000), generation(1_048_576), generation(1)
    (19, 20, 0)
    """
    return max(0, int(rows).bit_length() - 1)


@dataclass
class SearchModels:
    """Trained models kept between cuts, one per size generation: ``load(generation)`` gives a
    kept model's bytes or ``None``; ``save_new(generation, bytes)`` keeps one unless another writer
    kept one first (then it returns ``False`` and that one is used). ``where`` names the place in
    errors. ``trained`` lists the generations this object trained; ``last`` describes the model the
    last :meth:`model_for` returned (``generation``, ``model_id``, ``trained_now``: lineage)."""

    load: Callable[[int], bytes | None]
    save_new: Callable[[int, bytes], bool]
    where: Callable[[int], str] = lambda g: f"search model g{g}"
    trained: list[int] = field(default_factory=list)
    last: dict[str, Any] | None = None

    @classmethod
    def in_memory(cls) -> SearchModels:
        """Models kept in this object only (tests, benches)."""
        kept: dict[int, bytes] = {}

        def save_new(g: int, data: bytes) -> bool:
            return kept.setdefault(g, data) is data
        return cls(load=kept.get, save_new=save_new)

    def model_for(self, codes: np.ndarray, scale: np.ndarray, rng: np.random.Generator) -> SearchModel:
        """The kept model of the rows' generation, trained (from ``rng``) and kept when there is none."""
        g = generation(len(codes))
        data = self.load(g)
        trained_now = False
        if data is None:
            model = train_model(codes, scale, rng)
            data = model.to_bytes()
            if self.save_new(g, data):
                self.trained.append(g)
                trained_now = True
            else:  # another cut kept one first: use it, so every cut of this generation agrees
                data = self.load(g)
                if data is None:
                    raise SearchModelError(f"{self.where(g)}: another writer kept a model but it cannot be read back")
        model = SearchModel.from_bytes(data, self.where(g))
        if model.dim != codes.shape[1]:
            raise SearchModelError(f"{self.where(g)} files {model.dim}-d codes, these are {codes.shape[1]}-d; "
                                   "delete it to train a new one")
        # the kept file's content hash is the model's id (lineage): from the bytes read, not re-serialized
        self.last = {"generation": g, "model_id": hashlib.sha256(data).hexdigest()[:12], "trained_now": trained_now}
        return model


def multi_index_pairs(codes: np.ndarray, scale: np.ndarray, threshold: float, rng: np.random.Generator,
                      tables: int = TABLES, probes: int = PROBES, cell_rows: int = CELL_ROWS,
                      model: SearchModel | None = None,
                      cells: Callable[[int], np.ndarray] | None = None, new: np.ndarray | None = None) -> np.ndarray:
    """Unique pairs ``(i, j)``, ``i > j``, of rows whose decoded cosine is >= ``threshold``, found
    through ``tables`` inverted multi-indexes (see module docs), as an ``m x 2`` array sorted by row.

    ``codes``/``scale`` come from :func:`encode_rows`. With ``model`` (a kept :class:`SearchModel`)
    nothing is drawn from ``rng``; without one it is trained from ``rng`` (rotations, k-means
    samples), so the same rows and seed give the same pairs. ``cells(t)``, with ``model``, gives the
    rows' :func:`cell_probes` in table ``t`` when they are kept (the same pairs, without computing them).
    With ``new`` (a mask of the rows) only the pairs with at least one new row are searched and
    returned: with the pairs found earlier among the other rows, the same pairs as a whole search
    (:mod:`prx_assets.core.curate.search_pairs`)."""
    n, dim = codes.shape
    if n < 2 or dim < 2 or (new is not None and not new.any()):
        return np.zeros((0, 2), np.int64)
    model_given = model is not None
    if model is None:
        model = train_model(codes, scale, rng, tables, cell_rows)
    found = [_table_pairs(codes, scale, threshold, table, probes, partial(cells, t) if cells is not None and model_given
                          else None, new) for t, table in enumerate(model.tables)]
    return np.stack(unique_pairs(np.concatenate([i for i, _ in found]), np.concatenate([j for _, j in found])), axis=1)


def unique_pairs(later: np.ndarray, earlier: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs without repeats, sorted by ``later`` then ``earlier`` (rows below 2**32).

    >>> [a.tolist() for a in unique_pairs(np.array([3, 2, 3]), np.array([1, 0, 1]))]
    [[2, 3], [0, 1]]
    """
    packed = np.unique((later.astype(np.uint64) << np.uint64(32)) | earlier.astype(np.uint64))
    return (packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)
