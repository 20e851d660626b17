"""Embedding dedup's candidate pairs kept between a recipe's cuts, so that a cut searches only the
pairs that involve rows no earlier cut searched.

Which candidate pairs the multi-index finds (:func:`~prx_assets.core.curate.multi_index.multi_index_pairs`)
is decided by the two rows' codes, their cells and the search model, at the candidate threshold:
nothing about the other rows. A row's code is named by its Lance data file and offset (data files
are immutable; see :mod:`~prx_assets.core.curate.search_codes`). So after a cut the rows it searched
and the candidate pairs it found among them are kept, by data file and offset, at
``curated/<recipe>/_search/pairs-v<version>-<codes key>-<model id>-<threshold>.npz``
(:func:`layout.search_pairs`). The next cut with the same codes, model and threshold takes the kept
pairs whose rows are both still there, and searches only the pairs with at least one row the kept
ones do not cover: a new batch's rows, those of a data file rewritten by the lab sync or a
compaction, rows that reached embedding dedup for the first time. A retrained model (the
survivors doubled), another threshold or other codes search everything once. Only a cut of the
table's latest version keeps what it found (replacing the recipe's earlier file); rows deleted
since are left out by the next cut, and the found pairs are checked on the full vectors as always.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.search_codes import SearchCodesError, column_files, file_stem
from prx_assets.core.sorted_lookup import lookup

#: Bump when what a kept pairs file holds changes: files of another version are never read (the
#: next cut searches every pair once and replaces them).
PAIRS_VERSION = 1
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def write_replacing(root: DataRoot, rel: str, data: bytes, prefix: str) -> None:
    """Write ``data`` at ``rel``, then delete the other files in its folder whose names start with
    ``prefix``: a recipe keeps one file of each kind (the one its last cut of the latest version wrote)."""
    root.write_bytes(rel, data)
    folder, _, name = rel.rpartition("/")
    for other in root.list(folder):
        other_name = other.rpartition("/")[2]
        if other_name.startswith(prefix) and other_name != name:
            root.delete(other)


def pack(i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Two arrays of 32-bit values as one of 64-bit keys (``i`` high), e.g. pairs or (file, offset)."""
    return (np.asarray(i, dtype=np.uint64) << _SHIFT) | np.asarray(j, dtype=np.uint64)


def unpack(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pack` undone, as int64 arrays."""
    return (keys >> _SHIFT).astype(np.int64), (keys & _LOW).astype(np.int64)


@dataclass
class KeptPairs:
    """A recipe's kept candidate pairs under a data root (see module docs). A cut names the rows it
    searches (:meth:`bind`), asks what is kept for its model and threshold (:meth:`known`) and keeps
    what it found (:meth:`keep`); ``stats`` says what the last cut did (``rows_new``: rows searched
    against every row, ``pairs_kept``: pairs taken as kept, ``pairs_found``: pairs found now,
    ``kept``: whether what it found is kept, by this cut or, when it searched no new row, before)."""

    root: DataRoot
    recipe: str
    stats: dict[str, Any] = field(default_factory=dict)
    _ds: lance.LanceDataset | None = None
    _column: str = ""
    _key: str = ""
    _addresses: np.ndarray | None = None

    def bind(self, ds: lance.LanceDataset, column: str, addresses: np.ndarray, codes_key: str) -> None:
        """The rows this cut searches: their row addresses in ``ds``, in the order of their codes."""
        self._ds, self._column, self._key = ds, column, codes_key
        self._addresses = np.asarray(addresses, dtype=np.uint64)
        self.stats = {}

    def rel(self, model_id: str, threshold: float) -> str:
        """Where the pairs of ``model_id`` at candidate ``threshold`` are kept."""
        return layout.search_pairs(self.recipe, PAIRS_VERSION, self._key, model_id, threshold)

    def _bound(self) -> tuple[lance.LanceDataset, np.ndarray]:
        if self._ds is None or self._addresses is None:
            raise RuntimeError("KeptPairs.bind() must come first")
        return self._ds, self._addresses

    def known(self, model_id: str, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(new, pairs, held)``: which of the bound rows no kept pairs cover, the kept pairs among
        the others (``m x 2`` positions in the bound order, first > second) and whether each held on
        the full vectors; ``None`` when nothing is kept for this model and threshold."""
        ds, addresses = self._bound()
        rel = self.rel(model_id, threshold)
        try:
            data = self.root.read_bytes(rel)
        except FileNotFoundError:
            self.stats.update(rows_new=len(addresses), pairs_kept=0)
            return None
        where = self.root.join(rel)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                files, rows, pairs, held = [str(f) for f in z["files"]], z["rows"], z["pairs"], z["held"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise SearchCodesError(f"kept search pairs {where} cannot be read ({e}); delete the file and the next "
                                   "cut searches every pair again") from None
        if rows.dtype != np.uint64 or pairs.dtype != np.uint64 or pairs.ndim != 2 or pairs.shape[1] != 2 \
                or held.shape != (len(pairs),) or held.dtype != bool:
            raise SearchCodesError(f"kept search pairs {where} hold {rows.dtype} rows, {pairs.dtype} {pairs.shape} "
                                   f"pairs and {held.dtype} {held.shape} checks, not uint64 rows, m x 2 pairs and "
                                   "m flags; delete the file and the next cut searches every pair again")
        # The kept files' indices to the fragments holding them now (-1: the file is gone).
        now = {file_stem(path): fid for fid, (path, _) in column_files(ds, self._column).items() if path}
        frag_of = np.array([now.get(f, -1) for f in files] + [-1], dtype=np.int64)

        def here(keys: np.ndarray) -> np.ndarray:
            """Kept (file, offset) keys as row addresses now (``2**64 - 1`` where the file is gone)."""
            f, off = unpack(keys)
            frag = frag_of[np.minimum(f, len(files))]
            out = pack(np.maximum(frag, 0), off)
            out[frag < 0] = np.iinfo(np.uint64).max
            return out

        order = np.argsort(addresses, kind="stable")
        bound_sorted = addresses[order]

        def position(addr: np.ndarray) -> np.ndarray:
            """Positions in the bound order of ``addr`` (-1 where it is not bound)."""
            hit, at = lookup(bound_sorted, addr)
            return np.where(hit, order[at], -1) if len(order) else np.full(len(hit), -1, dtype=np.int64)

        covered = np.sort(here(rows))
        new = ~lookup(covered, addresses)[0]
        a, b = position(here(pairs[:, 0])), position(here(pairs[:, 1]))
        both = (a >= 0) & (b >= 0)
        a, b = a[both], b[both]
        kept = np.stack([np.maximum(a, b), np.minimum(a, b)], axis=1)
        self.stats.update(rows_new=int(new.sum()), pairs_kept=len(kept))
        return new, kept, held[both]

    def keep(self, model_id: str, threshold: float, pairs: np.ndarray, held: np.ndarray) -> None:
        """Keep ``pairs`` (``m x 2`` positions in the bound order: every candidate pair among the bound
        rows) and whether each ``held`` on the full vectors, for ``model_id`` at ``threshold``,
        replacing the recipe's other kept pairs; only at the table's latest version, and leaving out
        rows of fragments whose codes are not kept."""
        ds, addresses = self._bound()
        if ds.version != ds.latest_version:
            self.stats["kept"] = False
            return
        if self.stats.get("rows_new") == 0:  # the kept file covers every bound row already: nothing to add
            self.stats["kept"] = True
            return
        files = {fid: file_stem(path) for fid, (path, _) in column_files(ds, self._column).items() if path}
        names = sorted(set(files.values()))
        index = {name: i for i, name in enumerate(names)}
        frag, off = unpack(addresses)
        frags = np.unique(frag)
        file_of = np.array([index[files[f]] if f in files else -1 for f in frags.tolist()], dtype=np.int64)
        file_idx = file_of[np.searchsorted(frags, frag)] if len(frag) else np.zeros(0, np.int64)
        ok = file_idx >= 0
        keys = pack(np.maximum(file_idx, 0), off)
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        both = ok[pairs[:, 0]] & ok[pairs[:, 1]] if len(pairs) else np.zeros(0, bool)
        buf = io.BytesIO()
        np.savez(buf, files=np.array(names, dtype=str), rows=np.sort(keys[ok]),
                 pairs=np.stack([keys[pairs[both, 0]], keys[pairs[both, 1]]], axis=1).astype(np.uint64),
                 held=np.asarray(held, dtype=bool)[both])
        write_replacing(self.root, self.rel(model_id, threshold), buf.getvalue(), "pairs-")
        self.stats["kept"] = True


def search_pairs(root: DataRoot, recipe: str) -> KeptPairs:
    """The kept candidate pairs of ``recipe`` under ``root``."""
    return KeptPairs(root, recipe)
