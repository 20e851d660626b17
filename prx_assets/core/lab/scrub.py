"""The lab's stored images checked against the digests ingest recorded (``stored_sha256``).

A flipped byte in a Lance data file either makes the file unreadable or silently changes the
bytes it returns; neither is seen until something decodes that image (a trainer, days into a
run). :func:`scrub_images` reads every stored image once, a fragment at a time in batches of
``rows`` (memory bounded by the batch, not the table), and names the images whose bytes no
longer hash to their digest and the fragments that cannot be read. Rows written before digests
were recorded have none; ``prx-assets migrate`` records theirs (:func:`fill_digests`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import lance
import pyarrow as pa

#: Rows read per batch while scrubbing (their stored bytes are in memory at once).
SCRUB_ROWS = 256


@dataclass
class ScrubReport:
    """What a scrub of the images table found."""

    rows: int = 0
    checked: int = 0
    without_digest: int = 0
    corrupt: dict[str, list[str]] = field(default_factory=dict)  # batch -> image ids
    unreadable: dict[int, str] = field(default_factory=dict)  # fragment id -> error

    @property
    def clean(self) -> bool:
        """Nothing corrupt or unreadable."""
        return not self.corrupt and not self.unreadable


def _batches(frag: lance.LanceFragment, columns: list[str], rows: int) -> Iterator[pa.RecordBatch]:
    yield from frag.to_batches(columns=columns, batch_size=rows)


def scrub_images(ds: lance.LanceDataset, rows: int = SCRUB_ROWS) -> ScrubReport:
    """Hash every stored image of ``ds`` (the images table) against its ``stored_sha256``."""
    report = ScrubReport()
    if "stored_sha256" not in ds.schema.names:
        report.without_digest = report.rows = ds.count_rows()
        return report
    for frag in ds.get_fragments():
        try:
            for b in _batches(frag, ["image_id", "batch", "jpeg", "stored_sha256"], rows):
                report.rows += b.num_rows
                ids, batches, data, want = (b.column(i).to_pylist() for i in range(4))
                for image_id, batch, jpeg, digest in zip(ids, batches, data, want, strict=True):
                    if not digest:
                        report.without_digest += 1
                        continue
                    report.checked += 1
                    if hashlib.sha256(jpeg).hexdigest() != digest:
                        report.corrupt.setdefault(batch, []).append(image_id)
        except Exception as e:  # a data file Lance cannot decode: named, never a crash of the scrub
            report.unreadable[frag.fragment_id] = f"{type(e).__name__}: {str(e)[:300]}"
    return report


def fill_digests(ds: lance.LanceDataset, rows: int = SCRUB_ROWS) -> int:
    """Record ``stored_sha256`` for every row when some rows have none (written before digests were
    recorded): the column is dropped and added again from a pass over the stored bytes
    (``add_columns`` with a batch UDF writes the new column's files only; no image byte is
    rewritten). Returns the rows that had none."""
    names = ds.schema.names
    if "stored_sha256" in names:
        missing = ds.count_rows(filter="stored_sha256 IS NULL")
        if not missing:
            return 0
        ds.drop_columns(["stored_sha256"])
    else:
        missing = ds.count_rows()

    @lance.batch_udf(output_schema=pa.schema([pa.field("stored_sha256", pa.string())]))
    def digests(batch: pa.RecordBatch) -> pa.RecordBatch:
        values = [hashlib.sha256(x).hexdigest() for x in batch.column(0).to_pylist()]
        return pa.RecordBatch.from_arrays([pa.array(values, pa.string())], names=["stored_sha256"])

    ds.add_columns(digests, read_columns=["jpeg"], batch_size=rows)
    return missing
