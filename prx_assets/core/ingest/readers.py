"""The reader of each source kind (folder, s3, gcs, parquet, webdataset).

Add a kind by writing a :class:`~prx_assets.core.ingest.sources.SourceReader` subclass and
registering it in ``READERS``.
"""

from __future__ import annotations

from prx_assets.core.config.project import SourceConfig
from prx_assets.core.ingest.folder import FolderReader
from prx_assets.core.ingest.sources import (
    ParquetReader,
    S3ClientFactory,
    S3PrefixReader,
    SourceReader,
    WebDatasetReader,
)

READERS: dict[str, type[SourceReader]] = {
    **{r.kind: r for r in (FolderReader, S3PrefixReader, ParquetReader, WebDatasetReader)},
    "gcs": S3PrefixReader,  # the same reader: the store follows the URI's scheme
}


def reader_for(config: SourceConfig, s3_client: S3ClientFactory | None = None) -> SourceReader:
    """The reader for a source config."""
    return READERS[config.kind](config, s3_client=s3_client)
