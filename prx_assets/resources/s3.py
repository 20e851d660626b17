"""The S3 resource: the settings of dagster_aws's ``S3Resource``, with its boto3 client built once
per process, on first use, and without importing dagster_aws.

dagster_aws builds a new boto3 session and client for every step that names the resource (about
0.2 s each: botocore loads its service models again), which ``prx-assets run`` paid twice per
partition even for sources that never touch S3; and importing ``dagster_aws.s3`` imports every
dagster_aws component (0.8 s of the 1.6 s it takes to import the definitions), in every CLI start,
run worker and stage job. Here the client is built when something first calls it, and shared by
every step in the process that asks with the same settings and the same ``AWS_*`` environment
(boto3 clients are thread-safe; refreshable credentials refresh themselves).
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field

from prx_assets.core.stages.settings import S3Settings
from prx_assets.resources.models import settings_of


class LazyClient:
    """Stands in for a boto3 S3 client and builds it on the first attribute access."""

    def __init__(self, resource: PrxS3Resource) -> None:
        self._resource = resource
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = self._resource.get_client()
        return getattr(self._client, name)


class PrxS3Resource(dg.ConfigurableResource, dg.IAttachDifferentObjectToOpContext):
    """S3 access (the settings of ``dagster_aws.s3.S3Resource``); the client is built on first use
    and shared in the process. Credentials come from the settings or boto3's usual chain."""

    use_unsigned_session: bool = Field(default=False, description="Use an unsigned S3 session.")
    region_name: str | None = Field(default=None, description="A custom region for the S3 session.")
    endpoint_url: str | None = Field(default=None, description="A custom endpoint for the S3 session.")
    max_attempts: int = Field(default=5, description="boto3 retry attempts (the first call counts).")
    profile_name: str | None = Field(default=None, description="The profile the session uses.")
    use_ssl: bool = Field(default=True, description="Whether to use SSL.")
    verify: bool | None = Field(default=None, description="Whether to verify SSL certificates.")
    aws_access_key_id: str | None = Field(default=None, description="AWS access key id.")
    aws_secret_access_key: str | None = Field(default=None, description="AWS secret access key.")
    aws_session_token: str | None = Field(default=None, description="AWS session token.")

    def settings(self) -> S3Settings:
        """These settings, for a stage (in-process or in a job)."""
        return settings_of(self, S3Settings)

    def get_client(self) -> Any:
        """The boto3 S3 client for these settings and the current ``AWS_*`` environment (one per process)."""
        return self.settings().get_client()

    def get_object_to_set_on_execution_context(self) -> Any:
        """What ``context.resources.s3`` is: the client, built when first used."""
        return LazyClient(self)
