"""Object stores behind one small interface: S3 (and S3-compatible) and Google Cloud Storage.

:class:`~prx_assets.core.config.storage.DataRoot` and the source readers speak to an
``s3://`` or ``gs://`` prefix only through :func:`store_for`: get, put, create-if-absent (S3
``If-None-Match: *``, GCS ``ifGenerationMatch=0``), delete and ordered listing. The clients come
from :class:`~prx_assets.core.config.storage.ObjectStoreSettings`, which also translates the same
settings for Lance, pyarrow and mosaicml-streaming.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prx_assets.errors import StorageError


class ClientSettings(Protocol):
    """What :func:`store_for` needs from settings
    (:class:`~prx_assets.core.config.storage.ObjectStoreSettings` meets it)."""

    def boto3_client(self) -> Any:
        """A boto3 S3 client."""
        ...

    def gcs_client(self) -> Any:
        """A google-cloud-storage client."""
        ...

#: URI schemes of the object stores.
SCHEMES = ("s3://", "gs://")


def split_object_uri(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket, key)`` of ``s3://bucket/key`` or ``gs://bucket/key`` (scheme without ``://``).

    >>> split_object_uri("gs://b/k/x.json")
    ('gs', 'b', 'k/x.json')
    """
    for scheme in SCHEMES:
        if uri.startswith(scheme):
            bucket, _, key = uri[len(scheme):].partition("/")
            if not bucket:
                raise StorageError(f"object-store URI without a bucket: {uri!r}; write {scheme}bucket/prefix")
            return scheme[:-3], bucket, key
    raise StorageError(f"not an object-store URI: {uri!r}; use s3://bucket/prefix or gs://bucket/prefix")


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key, size and a stamp that changes when its content does (ETag or
    generation)."""

    key: str
    size: int
    stamp: str


class S3Store:
    """An S3 (or S3-compatible) bucket through a boto3 client."""

    scheme = "s3"

    def __init__(self, client: Any) -> None:
        self.client = client

    def get(self, bucket: str, key: str) -> bytes:
        """The object's bytes; ``FileNotFoundError`` when absent."""
        try:
            return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(f"s3://{bucket}/{key}") from None

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Write the object whole."""
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def put_new(self, bucket: str, key: str, data: bytes) -> bool:
        """Create the object only if absent (``If-None-Match: *``); False when it existed."""
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except self.client.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def delete(self, bucket: str, key: str) -> None:
        """Remove the object (nothing happens when absent)."""
        self.client.delete_object(Bucket=bucket, Key=key)

    def list(self, bucket: str, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Objects under ``prefix`` in key order (after ``start_after``, which S3 skips unlisted)."""
        args = {"Bucket": bucket, "Prefix": prefix, **({"StartAfter": start_after} if start_after else {})}
        for page in self.client.get_paginator("list_objects_v2").paginate(**args):
            for obj in page.get("Contents", []):
                yield ObjectInfo(obj["Key"], int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))

    def folders(self, bucket: str, prefix: str) -> Iterator[str]:
        """Names of the "folders" right below ``prefix`` (a ``/``-delimited listing: one entry per
        folder, not one per object inside it)."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                yield common["Prefix"][len(prefix):].rstrip("/")


class GCSStore:
    """A Google Cloud Storage bucket through a google-cloud-storage client."""

    scheme = "gs"

    def __init__(self, client: Any) -> None:
        self.client = client

    def get(self, bucket: str, key: str) -> bytes:
        """The object's bytes; ``FileNotFoundError`` when absent."""
        from google.api_core.exceptions import NotFound

        try:
            return self.client.bucket(bucket).blob(key).download_as_bytes()
        except NotFound:
            raise FileNotFoundError(f"gs://{bucket}/{key}") from None

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Write the object whole (GCS writes are atomic per object)."""
        self.client.bucket(bucket).blob(key).upload_from_string(data)

    def put_new(self, bucket: str, key: str, data: bytes) -> bool:
        """Create the object only if absent (``ifGenerationMatch=0``); False when it existed."""
        from google.api_core.exceptions import PreconditionFailed

        try:
            self.client.bucket(bucket).blob(key).upload_from_string(data, if_generation_match=0)
        except PreconditionFailed:
            return False
        return True

    def delete(self, bucket: str, key: str) -> None:
        """Remove the object (nothing happens when absent)."""
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            self.client.bucket(bucket).blob(key).delete()

    def list(self, bucket: str, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Objects under ``prefix`` in key order (from ``start_after`` on, that key itself left out:
        GCS's ``startOffset`` skips what sorts before it unlisted)."""
        blobs = self.client.list_blobs(bucket, prefix=prefix, start_offset=start_after or None)
        for blob in blobs:
            if start_after is not None and blob.name <= start_after:
                continue
            yield ObjectInfo(blob.name, int(blob.size or 0), str(blob.generation or blob.etag or ""))

    def folders(self, bucket: str, prefix: str) -> Iterator[str]:
        """Names of the "folders" right below ``prefix`` (a ``/``-delimited listing: one entry per
        folder, not one per object inside it)."""
        blobs = self.client.list_blobs(bucket, prefix=prefix, delimiter="/")
        for page in blobs.pages:
            for common in page.prefixes:
                yield common[len(prefix):].rstrip("/")


def store_for(uri: str, settings: ClientSettings, s3_client: Any = None) -> S3Store | GCSStore:
    """The store holding ``uri`` (``s3_client``: a boto3 client to use instead of one from ``settings``)."""
    scheme, _, _ = split_object_uri(uri)
    if scheme == "s3":
        return S3Store(s3_client if s3_client is not None else settings.boto3_client())
    return GCSStore(settings.gcs_client())
