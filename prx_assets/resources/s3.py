"""The S3 resource: dagster_aws's ``S3Resource`` with its client built once per process, on first use.

dagster_aws builds a new boto3 session and client for every step that names the resource (about
0.2 s each: botocore loads its service models again), which ``prx-assets run`` paid twice per
partition even for sources that never touch S3. Here the client is built when something first calls
it, and shared by every step in the process that asks with the same settings and the same ``AWS_*``
environment (boto3 clients are thread-safe; refreshable credentials refresh themselves).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dagster_aws.s3 import S3Resource
from dagster_aws.s3.utils import construct_s3_client

_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


def _key(res: S3Resource) -> tuple[Any, ...]:
    fields = (res.max_attempts, res.region_name, res.endpoint_url, res.use_unsigned_session, res.profile_name,
              res.use_ssl, res.verify, res.aws_access_key_id, res.aws_secret_access_key, res.aws_session_token)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return fields + env


class LazyClient:
    """Stands in for a boto3 S3 client and builds it on the first attribute access."""

    def __init__(self, resource: S3Resource) -> None:
        self._resource = resource
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = self._resource.get_client()
        return getattr(self._client, name)


class PrxS3Resource(S3Resource):
    """``S3Resource`` (same settings) whose client is built on first use and shared in the process."""

    def get_client(self) -> Any:
        """The boto3 S3 client for these settings and the current ``AWS_*`` environment."""
        key = _key(self)
        with _LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = construct_s3_client(
                    max_attempts=self.max_attempts, region_name=self.region_name, endpoint_url=self.endpoint_url,
                    use_unsigned_session=self.use_unsigned_session, profile_name=self.profile_name,
                    use_ssl=self.use_ssl, verify=self.verify, aws_access_key_id=self.aws_access_key_id,
                    aws_secret_access_key=self.aws_secret_access_key, aws_session_token=self.aws_session_token)
        return client

    def get_object_to_set_on_execution_context(self) -> Any:
        """What ``context.resources.s3`` is: the client, built when first used."""
        return LazyClient(self)
