"""Where data lives: a local folder or an ``s3://`` prefix, behind one small interface.

Object-store settings come only from the environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``/``AWS_DEFAULT_REGION``);
the same settings are translated for boto3, Lance and pyarrow.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prx_assets.errors import StorageError


def is_remote(uri: str) -> bool:
    """True for object-store URIs (``s3://...``)."""
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``."""
    if not uri.startswith("s3://"):
        raise StorageError(f"not an s3:// URI: {uri!r}")
    rest = uri[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


@dataclass(frozen=True)
class ObjectStoreSettings:
    """Credentials and endpoint for an S3-compatible object store."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None

    @classmethod
    def from_env(cls) -> ObjectStoreSettings:
        """Read the standard AWS variables (endpoint from ``AWS_ENDPOINT_URL``)."""
        return cls(
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL"),
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        )

    def boto3_client(self) -> Any:
        """A boto3 S3 client for these settings."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def lance_storage_options(self) -> dict[str, str]:
        """Storage options understood by Lance's object_store backend."""
        opts = {"aws_region": self.region}
        if self.endpoint_url:
            opts["aws_endpoint"] = self.endpoint_url
            if self.endpoint_url.startswith("http://"):
                opts["allow_http"] = "true"
        if self.access_key_id:
            opts["aws_access_key_id"] = self.access_key_id
        if self.secret_access_key:
            opts["aws_secret_access_key"] = self.secret_access_key
        return opts

    def pyarrow_fs(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` for these settings."""
        from pyarrow import fs

        kwargs: dict[str, Any] = {"region": self.region}
        if self.endpoint_url:
            scheme, _, host = self.endpoint_url.partition("://")
            kwargs["endpoint_override"] = host
            kwargs["scheme"] = scheme
        if self.access_key_id:
            kwargs["access_key"] = self.access_key_id
            kwargs["secret_key"] = self.secret_access_key
        return fs.S3FileSystem(**kwargs)


class DataRoot:
    """Small file API over the data root (local folder or ``s3://bucket/prefix``).

    Paths passed to the methods are relative to the root and use ``/``.

    Examples
    --------
    >>> import tempfile
    >>> root = DataRoot(tempfile.mkdtemp())
    >>> root.write_bytes("a/b.json", b"{}")
    >>> root.read_bytes("a/b.json")
    b'{}'
    >>> root.list("a")
    ['a/b.json']
    """

    def __init__(self, uri: str, settings: ObjectStoreSettings | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.settings = settings or ObjectStoreSettings.from_env()
        self._client: Any = None

    @property
    def remote(self) -> bool:
        """True when the root is an object-store prefix."""
        return is_remote(self.uri)

    def join(self, *parts: str) -> str:
        """Absolute URI/path of a path under the root."""
        return "/".join([self.uri, *(p.strip("/") for p in parts if p)])

    def storage_options(self) -> dict[str, str] | None:
        """Lance storage options for URIs under this root (``None`` when local)."""
        return self.settings.lance_storage_options() if self.remote else None

    def _s3(self) -> Any:
        if self._client is None:
            self._client = self.settings.boto3_client()
        return self._client

    def read_bytes(self, rel: str) -> bytes:
        """Read a file under the root; raises FileNotFoundError when absent."""
        target = self.join(rel)
        if not self.remote:
            return Path(target).read_bytes()
        bucket, key = split_s3(target)
        client = self._s3()
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(target) from None

    def exists(self, rel: str) -> bool:
        """True when the file exists."""
        try:
            self.read_bytes(rel)
        except FileNotFoundError:
            return False
        return True

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write atomically: a reader sees either nothing or the whole file."""
        target = self.join(rel)
        if self.remote:
            bucket, key = split_s3(target)
            self._s3().put_object(Bucket=bucket, Key=key, Body=data)
            return
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def write_new(self, rel: str, data: bytes) -> bool:
        """Create a file only if it does not exist yet; return False if it did.

        Used to claim batch numbers: two discoverers racing for the same name cannot
        both win on a local or shared filesystem (``O_EXCL`` link), nor on S3
        (``If-None-Match: *``).
        """
        target = self.join(rel)
        if self.remote:
            bucket, key = split_s3(target)
            client = self._s3()
            try:
                client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            except client.exceptions.ClientError as e:
                code = e.response.get("Error", {}).get("Code", "")
                if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                    return False
                raise
            return True
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def delete(self, rel: str) -> None:
        """Remove a file under the root (nothing happens when it is absent)."""
        target = self.join(rel)
        if self.remote:
            bucket, key = split_s3(target)
            self._s3().delete_object(Bucket=bucket, Key=key)
            return
        Path(target).unlink(missing_ok=True)

    def list(self, rel: str) -> list[str]:
        """Sorted relative paths of the files below ``rel`` (recursive)."""
        return sorted(self._iter(rel))

    def _iter(self, rel: str) -> Iterator[str]:
        base = self.join(rel)
        if not self.remote:
            root = Path(base)
            if not root.exists():
                return
            for p in root.rglob("*"):
                if p.is_file() and not p.name.startswith("."):
                    yield str(p.relative_to(self.uri)).replace(os.sep, "/")
            return
        bucket, key = split_s3(base)
        prefix = key.rstrip("/") + "/"
        _, root_key = split_s3(self.uri + "/")
        paginator = self._s3().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"][len(root_key):]


def read_uri(uri: str, settings: ObjectStoreSettings | None = None) -> bytes:
    """The bytes of a file by absolute path or URI (local or object store); object-store settings
    default to the environment's."""
    base, _, name = uri.rpartition("/")
    return DataRoot(base or "/", settings or ObjectStoreSettings.from_env()).read_bytes(name)
