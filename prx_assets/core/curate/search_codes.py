"""Embedding dedup's search codes, kept per Lance data file, so a cut reads 133 bytes a row instead
of every survivor's vector.

Above the exact method's size, embedding dedup files each survivor by an int8 code of its vector
(:func:`~prx_assets.core.curate.dedup.encode_for_search` through the fixed
:func:`~prx_assets.core.curate.dedup.search_map`: 128 bytes and a scale, a function of the vector
alone). Computing them reads every survivor's vector, 2,304 bytes a row for 1,152 half-float
dimensions, on every cut of every recipe, though a new batch changes a few fragments.

Lance data files are immutable, and a fragment's column lives in exactly one of them: the lab sync's
``update_columns``, a ``merge_insert`` or a compaction that changes the column writes a new file.
So the codes of one data file's rows never change. They are computed once, for every row of the
fragment, and kept at ``curated/_codes/<column>/<key>/<data file>.npz`` (:func:`layout.search_codes`),
indexed by each row's offset in its fragment; the key hashes the map's own values and
:data:`CODES_VERSION`, so a new map or encoding never reads old codes. A cut finds each survivor's
fragment and offset from its row address and reads the kept codes of the fragments it touches,
computing only those of data files it has not seen (new batches, rewritten columns, compacted
fragments). Every recipe shares them. A cut of the table's latest version deletes the codes of
data files that version no longer holds, and those of lab columns it no longer has (a cut of an
older version deletes nothing, and one whose codes were deleted computes them again). A kept file that cannot be read is an error naming it.

The multi-index then files every row under its nearest cells in each table of the recipe's search
model (:func:`~prx_assets.core.curate.multi_index.cell_probes`: a function of the row's code and
the model alone, 36 bytes a row and table). Those are kept the same way, beside the codes, per data
file, model and table (:func:`layout.search_cells`), so a cut after a new batch files only the new
batch's rows; they go with their data file.
"""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import lance
import numpy as np

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.dedup import encode_for_search
from prx_assets.core.curate.multi_index import SearchModel, cell_probes, probe_width
from prx_assets.core.lab.changes import vector_matrix
from prx_assets.errors import PrxError

#: Bump when what a kept code holds changes (the encoding, the fields of the file).
CODES_VERSION = 1
#: Rows of a fragment encoded at a time while its codes are computed.
ENCODE_ROWS = 32_768
#: Kept files read ahead of use, at most (an object store answers one request per file) ...
READ_AHEAD = 8
#: ... and at most this many bytes of them (a compacted fragment of 1M rows keeps 133 MB of codes).
READ_AHEAD_BYTES = 128 * 2**20
_OFFSET_MASK = np.uint64(0xFFFFFFFF)
T = TypeVar("T")


class SearchCodesError(PrxError):
    """Kept search codes that cannot be read or do not fit their fragment."""


def codes_key(mapping: np.ndarray) -> str:
    """What kept codes are keyed by besides their data file: :data:`CODES_VERSION` and the map's values.

    >>> m = np.eye(4, dtype=np.float32)
    >>> codes_key(m) == codes_key(m.copy()), codes_key(m) == codes_key(2 * m)
    (True, False)
    """
    h = hashlib.sha256(f"prx-search-codes-v{CODES_VERSION}:{mapping.shape}:{mapping.dtype}:".encode())
    h.update(np.ascontiguousarray(mapping).tobytes())
    return h.hexdigest()[:12]


@dataclass
class FragmentCodes:
    """One data file's codes by row offset: ``ok`` says which rows have a usable vector (a deleted
    row, a null, non-finite or zero vector has none)."""

    codes: np.ndarray
    scale: np.ndarray
    ok: np.ndarray

    @classmethod
    def empty(cls, rows: int, width: int) -> FragmentCodes:
        """``rows`` rows of no usable vector."""
        return cls(np.zeros((rows, width), np.int8), np.zeros(rows, np.float32), np.zeros(rows, bool))

    def to_bytes(self) -> bytes:
        """An ``.npz`` of the three arrays (uncompressed: int8 codes of a random map do not shrink)."""
        buf = io.BytesIO()
        np.savez(buf, codes=self.codes, scale=self.scale, ok=self.ok)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, rows: int, width: int, where: str) -> FragmentCodes:
        """Read :meth:`to_bytes`' output, checked against the fragment's ``rows`` and the code ``width``."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                out = cls(z["codes"], z["scale"], z["ok"])
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise SearchCodesError(f"kept search codes {where} cannot be read ({e}); delete the file and the "
                                   "next cut computes them again") from None
        if out.codes.shape != (rows, width) or out.scale.shape != (rows,) or out.ok.shape != (rows,) \
                or out.codes.dtype != np.int8:
            raise SearchCodesError(f"kept search codes {where} hold {out.codes.shape} {out.codes.dtype} codes, not "
                                   f"({rows}, {width}) int8 for its fragment; delete the file and the next cut "
                                   "computes them again")
        return out


@dataclass
class SearchCodes:
    """The kept codes of one lab column under a data root; ``stats`` counts, per cut, the data files
    whose codes were read (``kept``), computed (``computed``) and deleted (``pruned``), and the rows
    computed (``rows_computed``)."""

    root: DataRoot
    column: str
    stats: dict[str, int] = field(default_factory=dict)

    def rel(self, key: str, data_file: str) -> str:
        """Where the codes of ``data_file`` (a Lance data file's name) are kept."""
        return layout.search_codes(self.column, key, file_stem(data_file))

    def load(self, key: str, data_file: str, rows: int, width: int) -> FragmentCodes | None:
        """The kept codes of ``data_file``, or ``None`` when there are none."""
        rel = self.rel(key, data_file)
        try:
            data = self.root.read_bytes(rel)
        except FileNotFoundError:
            return None
        return FragmentCodes.from_bytes(data, rows, width, self.root.join(rel))

    def save(self, key: str, data_file: str, codes: FragmentCodes) -> None:
        """Keep ``codes`` for ``data_file`` (whole-file writes: a reader sees all of it or none)."""
        self.root.write_bytes(self.rel(key, data_file), codes.to_bytes())

    def rel_cells(self, key: str, data_file: str, model_id: str, table: int) -> str:
        """Where the cells of ``data_file``'s rows in table ``table`` of model ``model_id`` are kept."""
        return layout.search_cells(self.column, key, file_stem(data_file), model_id, table)

    def load_cells(self, key: str, data_file: str, model_id: str, table: int, rows: int,
                   width: int, n_cells: int) -> np.ndarray | None:
        """The kept cells (``rows x width`` int32 by row offset, -1 for a row without a code) of
        ``data_file`` in a model's table of ``n_cells`` cells, or ``None`` when there are none."""
        rel = self.rel_cells(key, data_file, model_id, table)
        try:
            data = self.root.read_bytes(rel)
        except FileNotFoundError:
            return None
        where = self.root.join(rel)
        try:
            cells = np.load(io.BytesIO(data), allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise SearchCodesError(f"kept search cells {where} cannot be read ({e}); delete the file and the "
                                   "next cut computes them again") from None
        if cells.shape != (rows, width) or cells.dtype != np.int32 or (len(cells) and (
                int(cells.min()) < -1 or int(cells.max()) >= n_cells)):
            raise SearchCodesError(f"kept search cells {where} hold {cells.shape} {cells.dtype} values, not "
                                   f"({rows}, {width}) int32 cells below {n_cells} for its fragment; delete the "
                                   "file and the next cut computes them again")
        return cells

    def save_cells(self, key: str, data_file: str, model_id: str, table: int, cells: np.ndarray) -> None:
        """Keep ``cells`` (see :meth:`load_cells`) for ``data_file`` in a model's table."""
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(cells, dtype=np.int32), allow_pickle=False)
        self.root.write_bytes(self.rel_cells(key, data_file, model_id, table), buf.getvalue())

    def prune(self, key: str, live: set[str], columns: set[str]) -> int:
        """Delete the kept codes and cells of this column whose key is not ``key`` or whose data file
        is not in ``live``, and all kept files of columns not in ``columns`` (an embedder's column
        dropped from the lab); how many files."""
        gone = 0
        stale = [c for c in self.root.folders(layout.SEARCH_CODES_DIR) if c not in columns and c != self.column]
        for rel in [r for c in stale for r in self.root.list(layout.search_codes_dir(c))]:
            self.root.delete(rel)  # absent already (another cut pruned it): nothing happens
            gone += 1
        for rel in self.root.list(layout.search_codes_dir(self.column)):
            folder, _, name = rel.rpartition("/")
            if name.endswith((".npz", ".npy")) and (folder.rpartition("/")[2] != key or file_stem(name) not in live):
                self.root.delete(rel)
                gone += 1
        return gone


_CELLS_SUFFIX = re.compile(r"\.cells-\w+-\d+\.npy$")


def file_stem(name: str) -> str:
    """A data file's name (as Lance names it, or a kept file's name) less its folder and suffixes.

    >>> file_stem("data/0101f3.lance"), file_stem("0101f3.npz"), file_stem("a/0101f3.cells-9c0e1d2f3a4b-1.npy")
    ('0101f3', '0101f3', '0101f3')
    """
    base = name.rsplit("/", 1)[-1].removesuffix(".lance").removesuffix(".npz")
    return _CELLS_SUFFIX.sub("", base)


def column_files(ds: lance.LanceDataset, column: str) -> dict[int, tuple[str | None, int]]:
    """Per fragment id: the name of the data file holding ``column`` (``None`` when no file of the
    fragment holds it: every value is null), and the fragment's physical rows. A fragment with data
    overlays (which this project never writes) is left out: its codes are computed on every cut,
    never kept."""
    return columns_files(ds, [column])[column]


def columns_files(ds: lance.LanceDataset, columns: Sequence[str],
                  fragments: Sequence[lance.LanceFragment] | None = None) -> dict[str, dict[int, tuple[str | None, int]]]:
    """:func:`column_files` of several columns from one pass over the fragments' metadata
    (``fragments``: ``ds.get_fragments()`` when the caller holds them already)."""
    ids = {c: ds.lance_schema.field(c).id() for c in columns}
    out: dict[str, dict[int, tuple[str | None, int]]] = {c: {} for c in columns}
    for frag in ds.get_fragments() if fragments is None else fragments:
        meta = frag.metadata
        if getattr(meta, "overlays", None):
            continue
        files = [(df.path, set(df.fields)) for df in meta.files]
        for c, field_id in ids.items():
            path = next((p for p, fields in files if field_id in fields), None)
            out[c][frag.fragment_id] = (path, meta.physical_rows)
    return out


def compute_fragment(ds: lance.LanceDataset, column: str, fragment_id: int, rows: int, mapping: np.ndarray,
                     ) -> FragmentCodes:
    """Codes of every row of one fragment, by offset, from one scan of its ``column``."""
    out = FragmentCodes.empty(rows, mapping.shape[1])
    frag = ds.get_fragment(fragment_id)
    for batch in frag.scanner(columns=[column], with_row_address=True, batch_size=ENCODE_ROWS).to_batches():
        offsets = (batch.column("_rowaddr").to_numpy() & _OFFSET_MASK).astype(np.int64)
        good, codes, scale = encode_for_search(vector_matrix(batch.column(column)), mapping)
        at = offsets[good]
        out.codes[at], out.scale[at], out.ok[at] = codes, scale, True
    return out


def _where(ds: lance.LanceDataset, files: dict[int, tuple[str | None, int]], fid: int) -> tuple[str | None, int]:
    """Fragment ``fid``'s data file for the column (:func:`column_files`) and its rows; a fragment
    with overlays, left out there, has no file whose codes or cells are kept."""
    return files[fid] if fid in files else (None, ds.get_fragment(fid).metadata.physical_rows)


def fragment_groups(addresses: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """The fragment ids of ``addresses`` (row addresses) and, per fragment, the positions of its rows."""
    frag_ids = (addresses >> np.uint64(32)).astype(np.int64)
    order = np.argsort(frag_ids, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(frag_ids[order])) + 1)
    return [int(frag_ids[g[0]]) for g in groups], groups


def _read_ahead(fids: list[int], load: Callable[[int], T], window: int) -> Iterator[T]:
    """``load(fid)`` for each fragment in order, up to ``window`` of them read ahead on threads (what
    an object store serves best); memory holds at most ``window`` results not yet taken."""
    with ThreadPoolExecutor(max_workers=window) as pool:
        ahead: list[Future[T] | None] = [pool.submit(load, f) for f in fids[:window]]
        for i in range(len(fids)):
            future = ahead[i]
            assert future is not None
            got = future.result()
            ahead[i] = None
            if i + window < len(fids):
                ahead.append(pool.submit(load, fids[i + window]))
            yield got


def _window(largest_bytes: int) -> int:
    """Files read ahead when the largest is ``largest_bytes``: :data:`READ_AHEAD`, fewer for large files."""
    return max(1, min(READ_AHEAD, READ_AHEAD_BYTES // max(1, largest_bytes)))


def codes_by_address(ds: lance.LanceDataset, column: str, addresses: np.ndarray, mapping: np.ndarray,
                     kept: SearchCodes | None,
                     on_block: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]) -> None:
    """Call ``on_block(positions, ok, codes, scale)`` for the rows at ``addresses`` (row addresses of
    ``ds``; positions index ``addresses``), a fragment at a time: codes read from ``kept`` where it
    holds the fragment's data file (up to :data:`READ_AHEAD` files and :data:`READ_AHEAD_BYTES` read
    ahead, as an object store serves them best), else computed for the whole fragment (and kept).
    With ``kept`` at the table's latest version, the codes and cells of data files and columns it
    no longer holds are deleted afterwards."""
    addresses = np.asarray(addresses, dtype=np.uint64)
    if not len(addresses):
        return
    key = codes_key(mapping)
    width = mapping.shape[1]
    files = column_files(ds, column)
    fids, groups = fragment_groups(addresses)
    stats = {"kept": 0, "computed": 0, "rows_computed": 0, "pruned": 0}

    def where(fid: int) -> tuple[str | None, int]:
        return _where(ds, files, fid)

    def load(fid: int) -> tuple[FragmentCodes | None, str]:
        data_file, rows = where(fid)
        if fid in files and data_file is None:  # no file holds the column here: no usable vector
            return FragmentCodes.empty(rows, width), "null"
        got = kept.load(key, data_file, rows, width) if kept is not None and data_file is not None else None
        return got, "kept"

    window = _window(max(where(f)[1] for f in fids) * (width + 5))  # codes, scale and flag per row
    for fid, positions, (got, how) in zip(fids, groups, _read_ahead(fids, load, window), strict=True):
        if got is None:
            data_file, rows = where(fid)
            got = compute_fragment(ds, column, fid, rows, mapping)
            stats["computed"] += 1
            stats["rows_computed"] += rows
            if kept is not None and data_file is not None:
                kept.save(key, data_file, got)
        elif how == "kept":
            stats["kept"] += 1
        offsets = (addresses[positions] & _OFFSET_MASK).astype(np.int64)
        on_block(positions, got.ok[offsets], got.codes[offsets], got.scale[offsets])
    if kept is not None:
        if ds.version == ds.latest_version:  # a cut of an older version deletes nothing
            live = {file_stem(path) for path, _ in files.values() if path}
            stats["pruned"] = kept.prune(key, live, set(ds.schema.names))
        kept.stats = stats


def cells_by_address(ds: lance.LanceDataset, column: str, addresses: np.ndarray, mapping: np.ndarray,
                     kept: SearchCodes, model: SearchModel, model_id: str, table: int,
                     on_block: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """Call ``on_block(positions, cells)`` with the :func:`~prx_assets.core.curate.multi_index.cell_probes`
    of the rows at ``addresses`` (rows that have a code) in table ``table`` of ``model`` (kept as
    ``model_id``), a fragment at a time: read from ``kept`` where it holds the fragment's data file,
    else computed for every row of the fragment that has a code, from its kept codes, and kept.
    Counts files read and computed in ``kept.stats`` (``cells_kept``, ``cells_computed``)."""
    addresses = np.asarray(addresses, dtype=np.uint64)
    if not len(addresses):
        return
    key = codes_key(mapping)
    width = probe_width(model.tables[table])
    n_cells = len(model.tables[table].first) * len(model.tables[table].second)
    files = column_files(ds, column)
    fids, groups = fragment_groups(addresses)

    def where(fid: int) -> tuple[str | None, int]:
        return _where(ds, files, fid)

    def load(fid: int) -> np.ndarray | None:
        data_file, rows = where(fid)
        return kept.load_cells(key, data_file, model_id, table, rows, width, n_cells) if data_file else None

    def compute(fid: int) -> np.ndarray:
        data_file, rows = where(fid)
        codes = kept.load(key, data_file, rows, mapping.shape[1]) if data_file else None
        if codes is None:  # a fragment with overlays, or codes another cut pruned meanwhile
            codes = compute_fragment(ds, column, fid, rows, mapping)
        cells = np.full((rows, width), -1, dtype=np.int32)
        at = np.flatnonzero(codes.ok)
        cells[at] = cell_probes(codes.codes[at], codes.scale[at], model.tables[table])
        if data_file:
            kept.save_cells(key, data_file, model_id, table, cells)
        return cells

    stats = kept.stats
    window = _window(max(where(f)[1] for f in fids) * width * 4)
    for fid, positions, got in zip(fids, groups, _read_ahead(fids, load, window), strict=True):
        if got is None:
            got = compute(fid)
            stats["cells_computed"] = stats.get("cells_computed", 0) + 1
        else:
            stats["cells_kept"] = stats.get("cells_kept", 0) + 1
        block = got[(addresses[positions] & _OFFSET_MASK).astype(np.int64)]
        if (block < 0).any():
            raise SearchCodesError(f"rows of fragment {fid} have no kept code but are asked for their cells; "
                                   f"delete {kept.root.join(layout.search_codes_dir(column))} and cut again")
        on_block(positions, block)


def search_codes(root: DataRoot, column: str) -> SearchCodes:
    """The kept search codes of the lab's ``column`` under ``root`` (shared by every recipe)."""
    return SearchCodes(root, column)
