"""Candidates' content digests kept per fragment's data files, so a cut reads 8 bytes a row instead
of every candidate's caption texts and a hash of them.

A subset's identity hashes each selected image's content digest
(:func:`~prx_assets.core.curate.digests.content_digest`): its ``sha256``, its ``ingest_config`` and
the texts of the recipe's caption columns. Computing them reads those texts (hundreds of bytes a row)
and hashes every candidate, about 2 µs a row, on every cut: a quarter of a re-cut of a million
rows after a 1% batch, and half an hour of one core a cut at 10**9 rows.

A row's digest is a function of its values in the Lance data files that hold those columns for its
fragment, at its offset there, and Lance data files are immutable: a caption re-written by the lab
sync, a merge or a compaction writes a new file (see :mod:`prx_assets.core.curate.search_codes`). So
each fragment's digests are computed once per set of data files, for every live row, and kept at
``curated/_digests/<caption columns>/<key>.npz`` (:func:`layout.kept_digests`), indexed by row offset,
with whether the row has a caption in any of the columns (the ``no_caption`` rule). The key hashes
:data:`DIGESTS_VERSION`, the caption columns and each input column's data file, so a re-captioned or
compacted fragment never reads digests of other bytes. A cut then reads neither the caption texts nor
``ingest_config``. Recipes with the same caption columns share the files. A row unknown to the kept file
(one that was deleted when the file was computed, asked for by a cut of an older version) has the
fragment computed again and the two merged. A cut of the table's latest version deletes the files of
fragments it no longer holds and the folders of caption columns the lab no longer has; a kept file
that cannot be read is an error naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import lance
import numpy as np
import pyarrow as pa

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.digests import digests_of, has_caption
from prx_assets.core.curate.search_codes import _OFFSET_MASK, READ_AHEAD, columns_files, fragment_groups
from prx_assets.core.hexdigits import bytes_hex, digit_bytes, hex_digits
from prx_assets.errors import PrxError

#: Bump when what a kept digest holds changes (the digest's definition, the fields of the file).
DIGESTS_VERSION = 1
#: The columns every digest reads besides the caption columns.
INPUTS = ("sha256", "ingest_config")
#: Rows of a fragment read at a time while its digests are computed.
COMPUTE_ROWS = 65_536
_SAFE = re.compile(r"[A-Za-z0-9_.-]+")


class KeptDigestsError(PrxError):
    """Kept content digests that cannot be read or do not fit their fragment."""


def columns_key(caption_columns: Sequence[str]) -> str:
    """The folder of one set of caption columns: their names joined by ``+`` (``_none`` for none), or
    a hash of them where a name is not a plain file name or the names are long.

    >>> columns_key(["caption__b", "caption__a"]), columns_key([]), columns_key(["a/b"])[:2]
    ('caption__a+caption__b', '_none', 'h-')
    """
    cols = sorted(caption_columns)
    if not cols:
        return "_none"
    joined = "+".join(cols)
    if len(joined) <= 120 and all(_SAFE.fullmatch(c) for c in cols):
        return joined
    return "h-" + hashlib.sha256(json.dumps(cols).encode()).hexdigest()[:16]


def hex_to_bytes(digests: pa.Array) -> np.ndarray:
    """16-digit lowercase hex digests as an ``n x 8`` uint8 array.

    >>> hex_to_bytes(pa.array(["00ff10a0b0c0d0e0"]))[0].tolist()
    [0, 255, 16, 160, 176, 192, 208, 224]
    """
    if digests.null_count:
        raise KeptDigestsError(f"{digests.null_count} content digests are null; every row has one")
    digits, ok = hex_digits(digests, 16)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise KeptDigestsError(f"content digests are 16 lowercase hex digits; {digests[bad].as_py()!r} (row {bad}) "
                               f"and {int((~ok).sum()) - 1} more are not")
    return digit_bytes(digits)


@dataclass
class FragmentDigests:
    """One fragment's digests by row offset (``n x 8`` bytes: the digest's 16 hex digits), whether each
    row has a caption, and which rows are known (live when computed)."""

    digest: np.ndarray
    has_caption: np.ndarray
    known: np.ndarray

    @classmethod
    def empty(cls, rows: int) -> FragmentDigests:
        """``rows`` rows, none known."""
        return cls(np.zeros((rows, 8), np.uint8), np.zeros(rows, bool), np.zeros(rows, bool))

    def merge(self, other: FragmentDigests) -> FragmentDigests:
        """The rows known to either (the same data files give the same values where both know a row)."""
        take = other.known & ~self.known
        out = FragmentDigests(self.digest.copy(), self.has_caption.copy(), self.known | other.known)
        out.digest[take], out.has_caption[take] = other.digest[take], other.has_caption[take]
        return out

    def to_bytes(self) -> bytes:
        """An ``.npz`` of the three arrays."""
        buf = io.BytesIO()
        np.savez(buf, digest=self.digest, has_caption=self.has_caption, known=self.known)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, rows: int, where: str) -> FragmentDigests:
        """Read :meth:`to_bytes`' output, checked against the fragment's ``rows``."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                out = cls(z["digest"], z["has_caption"], z["known"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise KeptDigestsError(f"kept content digests {where} cannot be read ({e}); delete the file and the "
                                   "next cut computes them again") from None
        if out.digest.shape != (rows, 8) or out.digest.dtype != np.uint8 or out.has_caption.shape != (rows,) \
                or out.known.shape != (rows,) or out.known.dtype != bool or out.has_caption.dtype != bool:
            raise KeptDigestsError(f"kept content digests {where} hold {out.digest.shape} {out.digest.dtype} "
                                   f"digests, not ({rows}, 8) uint8 for its fragment; delete the file and the next "
                                   "cut computes them again")
        return out


def compute_fragment(ds: lance.LanceDataset, fragment_id: int, rows: int,
                     caption_columns: Sequence[str]) -> FragmentDigests:
    """Digests and caption flags of every live row of one fragment, by offset, from one scan of it."""
    cols = sorted(caption_columns)
    out = FragmentDigests.empty(rows)
    frag = ds.get_fragment(fragment_id)
    for batch in frag.scanner(columns=[*INPUTS, *cols], with_row_address=True, batch_size=COMPUTE_ROWS).to_batches():
        at = (batch.column("_rowaddr").to_numpy() & _OFFSET_MASK).astype(np.int64)
        out.digest[at] = hex_to_bytes(digests_of(batch, cols))
        out.has_caption[at] = has_caption(batch, cols).to_numpy(zero_copy_only=False) if cols else True
        out.known[at] = True
    return out


@dataclass
class KeptDigests:
    """The kept digests under a data root (shared by every recipe); ``stats`` counts, per cut, the
    fragments whose digests were read (``kept``), computed (``computed``, with ``rows_computed``)
    and the files deleted (``pruned``)."""

    root: DataRoot
    stats: dict[str, int] = field(default_factory=dict)

    def rel(self, columns: str, key: str) -> str:
        """Where the digests of one fragment's data files are kept."""
        return layout.kept_digests(columns, key)

    def load(self, columns: str, key: str, rows: int) -> FragmentDigests | None:
        """The kept digests under ``key``, or ``None`` when there are none."""
        rel = self.rel(columns, key)
        try:
            data = self.root.read_bytes(rel)
        except FileNotFoundError:
            return None
        return FragmentDigests.from_bytes(data, rows, self.root.join(rel))

    def save(self, columns: str, key: str, digests: FragmentDigests) -> None:
        """Keep ``digests`` under ``key`` (whole-file writes: a reader sees all of it or none)."""
        self.root.write_bytes(self.rel(columns, key), digests.to_bytes())

    def prune(self, columns: str, live: set[str], schema: set[str]) -> int:
        """Delete this folder's files whose key is not in ``live``, and the folders of caption columns
        not all in ``schema`` (hashed folder names are left alone); how many files."""
        gone = 0
        for folder in self.root.folders(layout.KEPT_DIGESTS_DIR):
            names = folder.split("+")
            if folder != columns and folder != "_none" and not folder.startswith("h-") \
                    and not all(n in schema for n in names):
                for rel in self.root.list(layout.kept_digests_dir(folder)):
                    self.root.delete(rel)
                    gone += 1
        for rel in self.root.list(layout.kept_digests_dir(columns)):
            name = rel.rpartition("/")[2]
            if name.endswith(".npz") and name.removesuffix(".npz") not in live:
                self.root.delete(rel)
                gone += 1
        return gone

    def bind(self, ds: lance.LanceDataset, caption_columns: Sequence[str]) -> DigestLookup:
        """A lookup of ``ds``'s rows' digests over ``caption_columns`` for one cut."""
        return DigestLookup(ds, caption_columns, self)


def fragment_key(caption_columns: Sequence[str], data_files: Sequence[str | None]) -> str:
    """The key of one fragment's digests: :data:`DIGESTS_VERSION`, the caption columns (sorted) and
    the data file of each of ``INPUTS`` then each caption column (``None``: no file holds it).

    >>> fragment_key(["c"], ["a.lance", "a.lance", "b.lance"]) == fragment_key(["c"], ["a.lance", "a.lance", "x.lance"])
    False
    """
    text = json.dumps([DIGESTS_VERSION, sorted(caption_columns), list(data_files)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class DigestLookup:
    """Digests of one dataset version's rows over one set of caption columns, a batch of row addresses
    at a time (see module docs). Kept files are read ahead in fragment order on threads (an object
    store answers one request per file); at most a few fragments' digests are held."""

    def __init__(self, ds: lance.LanceDataset, caption_columns: Sequence[str], kept: KeptDigests) -> None:
        self.ds, self.kept = ds, kept
        self.cols = sorted(caption_columns)
        self.folder = columns_key(self.cols)
        fragments = ds.get_fragments()
        per_column = list(columns_files(ds, [*INPUTS, *self.cols], fragments).values())
        self.rows: dict[int, int] = {}
        self.keys: dict[int, str] = {}  # fragments with overlays (no kept file) are left out
        for frag in fragments:
            fid = frag.fragment_id
            self.rows[fid] = frag.metadata.physical_rows
            if all(fid in files for files in per_column):
                self.keys[fid] = fragment_key(self.cols, [files[fid][0] for files in per_column])
        self.position = {f: i for i, f in enumerate(self.rows)}  # the scan's order of fragments
        self.order = list(self.rows)
        self.held: dict[int, FragmentDigests] = {}
        self.ahead: dict[int, Future[FragmentDigests | None]] = {}
        self.pool = ThreadPoolExecutor(max_workers=READ_AHEAD)
        kept.stats = self.stats = {"kept": 0, "computed": 0, "rows_computed": 0, "pruned": 0}

    def _load(self, fid: int) -> FragmentDigests | None:
        key = self.keys.get(fid)
        return self.kept.load(self.folder, key, self.rows[fid]) if key is not None else None

    def _fragment(self, fid: int, offsets: np.ndarray) -> FragmentDigests:
        got = self.held.get(fid)
        if got is None:
            at = self.position[fid]
            for nxt in self.order[at:at + READ_AHEAD]:
                if nxt not in self.ahead and nxt not in self.held:
                    self.ahead[nxt] = self.pool.submit(self._load, nxt)
            got = self.ahead.pop(fid).result()
            # fragments the scan passed without a row (its filter) are never asked
            for skipped in [f for f in self.ahead if self.position[f] < at]:
                self.ahead.pop(skipped).cancel()
            if got is not None:
                self.stats["kept"] += 1
        if got is None or not got.known[offsets].all():
            rows = self.rows[fid]
            fresh = compute_fragment(self.ds, fid, rows, self.cols)
            got = fresh if got is None else got.merge(fresh)
            self.stats["computed"] += 1
            self.stats["rows_computed"] += rows
            key = self.keys.get(fid)
            if key is not None:
                self.kept.save(self.folder, key, got)
            if not got.known[offsets].all():
                raise KeptDigestsError(f"rows of fragment {fid} are asked for but its scan does not hold them")
        for old in [f for f in self.held if f != fid]:  # the scan moves on a fragment at a time
            del self.held[old]
        self.held[fid] = got
        return got

    def lookup(self, addresses: np.ndarray) -> tuple[pa.StringArray, pa.BooleanArray]:
        """The digests (16 hex digits) and caption flags of the rows at ``addresses``, in that order."""
        addresses = np.asarray(addresses, dtype=np.uint64)
        digest = np.empty((len(addresses), 8), dtype=np.uint8)
        has = np.empty(len(addresses), dtype=bool)
        if len(addresses):
            fids, groups = fragment_groups(addresses)
            for fid, positions in zip(fids, groups, strict=True):
                offsets = (addresses[positions] & _OFFSET_MASK).astype(np.int64)
                got = self._fragment(fid, offsets)
                digest[positions], has[positions] = got.digest[offsets], got.has_caption[offsets]
        return bytes_hex(digest), pa.array(has, pa.bool_())

    def close(self, prune: bool = True) -> None:
        """Drop what is held; with ``prune`` at the table's latest version, delete the files no
        fragment has now (a cut that failed deletes nothing)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.held.clear()
        self.ahead.clear()
        if prune and self.ds.version == self.ds.latest_version:  # a cut of an older version deletes nothing
            self.stats["pruned"] = self.kept.prune(self.folder, set(self.keys.values()), set(self.ds.schema.names))


def kept_digests(root: DataRoot) -> KeptDigests:
    """The kept content digests under ``root`` (shared by every recipe)."""
    return KeptDigests(root)
