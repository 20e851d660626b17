"""The S3 resource builds its boto3 client on first use and shares it within the process."""

import pytest

from prx_assets.resources.s3 import LazyClient, PrxS3Resource


def test_client_is_lazy_shared_and_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    res = PrxS3Resource(endpoint_url="http://127.0.0.1:9")
    on_context = res.get_object_to_set_on_execution_context()
    assert isinstance(on_context, LazyClient) and on_context._client is None  # nothing built yet
    first = res.get_client()
    assert PrxS3Resource(endpoint_url="http://127.0.0.1:9").get_client() is first  # one per process
    assert on_context.meta is first.meta and on_context._client is first  # built (shared) on first use
    assert PrxS3Resource(endpoint_url="http://127.0.0.1:10").get_client() is not first
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other")  # new credentials: a new client
    assert res.get_client() is not first
