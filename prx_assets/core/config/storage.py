"""Where data lives: a local folder, an ``s3://`` or a ``gs://`` prefix, behind one small interface.

Object-store settings come only from the environment, never from a file this project writes:
S3 from ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``/``AWS_DEFAULT_REGION`` (or boto3's chain); Google Cloud Storage from Application
Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, a service account, workload identity)
and ``GOOGLE_CLOUD_PROJECT``, with ``STORAGE_EMULATOR_HOST`` pointing everything at an emulator.
The same settings are translated for boto3 / google-cloud-storage, Lance, pyarrow and
mosaicml-streaming (:class:`ObjectStoreSettings`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prx_assets.core.config.stores import SCHEMES, split_object_uri, store_for
from prx_assets.errors import StorageError

#: Guards the first use of a root's store client from threads (search codes read ahead on several).
_STORE_LOCK = threading.Lock()


def is_remote(uri: str) -> bool:
    """True for object-store URIs (``s3://...``, ``gs://...``)."""
    return uri.startswith(SCHEMES)


def split_s3(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``."""
    if not uri.startswith("s3://"):
        raise StorageError(f"not an s3:// URI: {uri!r}")
    _, bucket, key = split_object_uri(uri)
    return bucket, key


@dataclass(frozen=True)
class ObjectStoreSettings:
    """Credentials and endpoints for the object stores: S3-compatible and Google Cloud Storage."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    #: GCS: an emulator's URL (``STORAGE_EMULATOR_HOST``; anonymous access) or None for real GCS.
    gcs_endpoint: str | None = None
    gcs_project: str | None = None

    @classmethod
    def from_env(cls) -> ObjectStoreSettings:
        """Read the standard AWS variables (endpoint from ``AWS_ENDPOINT_URL``) and the Google ones."""
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator and not emulator.startswith(("http://", "https://")):
            emulator = f"http://{emulator}"
        return cls(
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL"),
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            gcs_endpoint=emulator or None,
            gcs_project=os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("GCLOUD_PROJECT"),
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

    def gcs_client(self) -> Any:
        """A google-cloud-storage client: anonymous against an emulator, else Application Default
        Credentials (a service-account key, ``gcloud auth application-default login``, or the
        workload identity of the VM or pod)."""
        from google.cloud import storage

        if self.gcs_endpoint:
            from google.auth.credentials import AnonymousCredentials

            return storage.Client(project=self.gcs_project or "local", credentials=AnonymousCredentials(),
                                  client_options={"api_endpoint": self.gcs_endpoint})
        try:
            return storage.Client(project=self.gcs_project)
        except Exception as e:  # google.auth's DefaultCredentialsError and friends
            raise StorageError(f"no Google Cloud credentials for gs:// ({type(e).__name__}: {e}); set "
                               "GOOGLE_APPLICATION_CREDENTIALS to a service-account key, run `gcloud auth "
                               "application-default login`, or run where workload identity applies") from e

    def lance_storage_options(self, scheme: str = "s3") -> dict[str, str]:
        """Storage options understood by Lance for URIs of ``scheme`` (``s3`` or ``gs``)."""
        if scheme == "gs":
            if not self.gcs_endpoint:
                return {}  # real GCS: object_store finds Application Default Credentials itself
            # Emulators speak only GCS's JSON API, which Lance reaches through its OpenDAL backend.
            return {"use_opendal": "true", "endpoint": self.gcs_endpoint, "allow_anonymous": "true",
                    "disable_vm_metadata": "true", "disable_config_load": "true"}
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

    def pyarrow_fs(self, scheme: str = "s3") -> Any:
        """A pyarrow filesystem (``S3FileSystem`` or ``GcsFileSystem``) for these settings; paths are
        given to it without the scheme."""
        from pyarrow import fs

        if scheme == "gs":
            if self.gcs_endpoint:
                web, _, host = self.gcs_endpoint.partition("://")
                return fs.GcsFileSystem(endpoint_override=host, scheme=web, anonymous=True)
            return fs.GcsFileSystem(project_id=self.gcs_project) if self.gcs_project else fs.GcsFileSystem()
        kwargs: dict[str, Any] = {"region": self.region}
        if self.endpoint_url:
            scheme_, _, host = self.endpoint_url.partition("://")
            kwargs["endpoint_override"] = host
            kwargs["scheme"] = scheme_
        if self.access_key_id:
            kwargs["access_key"] = self.access_key_id
            kwargs["secret_key"] = self.secret_access_key
        return fs.S3FileSystem(**kwargs)


class DataRoot:
    """Small file API over the data root (local folder, ``s3://bucket/prefix`` or ``gs://bucket/prefix``).

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

    @property
    def scheme(self) -> str:
        """``file``, ``s3`` or ``gs``."""
        return split_object_uri(self.uri)[0] if self.remote else "file"

    def join(self, *parts: str) -> str:
        """Absolute URI/path of a path under the root."""
        return "/".join([self.uri, *(p.strip("/") for p in parts if p)])

    def storage_options(self) -> dict[str, str] | None:
        """Lance storage options for URIs under this root (``None`` when local)."""
        return self.settings.lance_storage_options(self.scheme) if self.remote else None

    def _store(self) -> Any:
        if self._client is None:
            with _STORE_LOCK:  # boto3 makes clients from its default session, which threads must not share
                if self._client is None:
                    self._client = store_for(self.uri, self.settings)
        return self._client

    def read_bytes(self, rel: str) -> bytes:
        """Read a file under the root; raises FileNotFoundError when absent."""
        target = self.join(rel)
        if not self.remote:
            return Path(target).read_bytes()
        _, bucket, key = split_object_uri(target)
        return self._store().get(bucket, key)

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
            _, bucket, key = split_object_uri(target)
            self._store().put(bucket, key, data)
            return
        path = Path(target)
        os.replace(_write_tmp(path, data), path)

    def write_new(self, rel: str, data: bytes) -> bool:
        """Create a file only if it does not exist yet; return False if it did.

        Used to claim batch numbers: two discoverers racing for the same name cannot
        both win on a local or shared filesystem (``O_EXCL`` link), on S3
        (``If-None-Match: *``) nor on GCS (``ifGenerationMatch=0``).
        """
        target = self.join(rel)
        if self.remote:
            _, bucket, key = split_object_uri(target)
            return self._store().put_new(bucket, key, data)
        path = Path(target)
        tmp = _write_tmp(path, data)
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
            _, bucket, key = split_object_uri(target)
            self._store().delete(bucket, key)
            return
        Path(target).unlink(missing_ok=True)

    def list(self, rel: str) -> list[str]:
        """Sorted relative paths of the files below ``rel`` (recursive)."""
        return sorted(self._iter(rel))

    def folders(self, rel: str) -> list[str]:
        """Sorted names of the folders right below ``rel`` (one listing level: on an object store a
        ``/``-delimited listing, so a folder holding a million objects costs one entry, not a page
        per thousand of them)."""
        base = self.join(rel)
        if not self.remote:
            root = Path(base)
            return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        _, bucket, key = split_object_uri(base)
        return sorted(set(self._store().folders(bucket, key.rstrip("/") + "/")))

    def _iter(self, rel: str) -> Iterator[str]:
        base = self.join(rel)
        if not self.remote:
            root = Path(base)
            if not root.exists():
                return
            with contextlib.suppress(FileNotFoundError):  # removed while listed (a lease released): as seen
                for p in root.rglob("*"):
                    if p.is_file() and not p.name.startswith("."):
                        yield str(p.relative_to(self.uri)).replace(os.sep, "/")
            return
        _, bucket, key = split_object_uri(base)
        prefix = key.rstrip("/") + "/"
        _, _, root_key = split_object_uri(self.uri + "/")
        for obj in self._store().list(bucket, prefix):
            yield obj.key[len(root_key):]


def _write_tmp(path: Path, data: bytes, tries: int = 5) -> Path:
    """``data`` in a new hidden file beside ``path`` (its folder made first). Another process may
    remove that folder once it is empty (a released lease's folder) between the two steps, so a
    folder gone before the write is made again (``tries`` times at most)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    for _ in range(tries - 1):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            tmp.write_bytes(data)
            return tmp
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)  # the last try: a folder gone again is the caller's error
    return tmp


def read_uri(uri: str, settings: ObjectStoreSettings | None = None) -> bytes:
    """The bytes of a file by absolute path or URI (local or object store); object-store settings
    default to the environment's."""
    base, _, name = uri.rpartition("/")
    return DataRoot(base or "/", settings or ObjectStoreSettings.from_env()).read_bytes(name)
