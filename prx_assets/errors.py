"""Typed errors for prx_assets.

Every error carries the offending value and says what to do about it. Code that
catches one of these never turns it into a placeholder result: bad input is either
rejected with a recorded reason (see :mod:`prx_assets.core.ingest.images`) or the run fails
with the message.
"""

from __future__ import annotations


class PrxError(Exception):
    """Base class of every error raised by prx_assets."""


class ConfigError(PrxError):
    """A configuration file (sources.yaml, recipes.yaml, ...) is invalid.

    The message names the file, the entry (source, recipe, ...) and the fix.
    """

    def __init__(self, message: str, *, path: str | None = None, entry: str | None = None,
                 fix: str | None = None) -> None:
        self.path = path
        self.entry = entry
        self.fix = fix
        parts = []
        if path:
            parts.append(str(path))
        if entry:
            parts.append(entry)
        where = ": ".join(parts)
        text = f"{where}: {message}" if where else message
        if fix:
            text = f"{text} (fix: {fix})"
        super().__init__(text)


class SourceError(PrxError):
    """A source could not be listed or read as a whole (not a single bad file)."""


class StorageError(PrxError):
    """Reading or writing under the data root failed."""


class PartitionKeyError(PrxError):
    """A partition key does not name an existing ingest batch or is malformed."""


class SlurmError(PrxError):
    """A job cannot be rendered, submitted or followed."""


class IntegrityError(PrxError):
    """Stored bytes do not match the digest recorded for them: corrupt data that must not be
    published or trained on. The message names what is corrupt and how to repair it."""


class WithdrawnError(PrxError):
    """A shard set (or a mixture spec naming one) that an erasure withdrew: it would yield erased samples."""
