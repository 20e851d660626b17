"""Cross-stage manifests: typed, frozen, round-trip JSON, keep unknown keys, name the file when broken."""

import dataclasses
import doctest
import json

import pytest

from prx_assets.core import manifests
from prx_assets.core.manifests import (
    ManifestError,
    MixtureSpec,
    MixtureStream,
    ShardSetManifest,
    SubsetManifest,
)

SHARD_SET = {"shard_set_id": "v3-ab-s1", "recipe": "r", "subset_id": "v3-ab", "lance_uri": "/d/images.lance",
             "lance_version": 3, "uri": "/d/mds/r/v3-ab-s1", "samples": 10, "shards": 1, "bytes": 1234,
             "recipe_hash": "ab", "lance_tag": "subset-r-v3", "captioner_ids": ["short-1"],
             "caption_plan": {"mode": "first", "columns": {"caption": ["caption__short_1"]}},
             "columns": {"image": "bytes"}, "code_version": "shards-1", "settings": {"hashes": ["xxh64"]},
             "text_latents": None, "bucket_streams": {}, "seconds": 0.5, "dagster_run_id": "abc"}


def test_doctests() -> None:
    assert doctest.testmod(manifests).failed == 0


def test_shard_set_round_trip_keeps_unknown_keys() -> None:
    m = ShardSetManifest.from_json(json.dumps(SHARD_SET))
    assert m.captioner_ids == ("short-1",) and m.extra == {"dagster_run_id": "abc"}
    assert m.validate_hash == "xxh64"
    doc = json.loads(m.to_json())
    assert {k: doc[k] for k in SHARD_SET} == SHARD_SET  # every key readers outside see is kept as it was
    assert m.physical_streams() == [{"uri": m.uri, "samples": 10, "role": "base"}]  # written before streams
    with pytest.raises(AttributeError):
        m.samples = 3  # type: ignore[misc]


def test_subset_round_trip_and_missing_keys_name_the_file() -> None:
    s = SubsetManifest(subset_id="v1-x", recipe="r", recipe_hash="x", lance_uri="/l", lance_version=1,
                       ids="/c/ids.parquet", selected=2, caption_columns=("caption__a",))
    assert SubsetManifest.from_json(s.to_json()) == s
    with pytest.raises(ManifestError, match=r"SubsetManifest /c/subset.json has no 'subset_id'"):
        SubsetManifest.from_json(b"{}", "/c/subset.json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        SubsetManifest.from_json(b"{", "/c/subset.json")


def test_mixture_version_follows_content_not_location() -> None:
    stream = MixtureStream(recipe="r", shard_set_id="s", uri="/d", samples=3, proportion=1.0,
                           caption_plan={"weights": {"caption": 1.0}}, lance_version=2)
    spec = MixtureSpec(name="m", epoch_size=3, streams=(stream,), expected_samples_per_stream={"r": 3}).versioned()
    again = MixtureSpec.from_json(spec.to_json())
    assert again == spec and isinstance(again.streams[0], MixtureStream)
    assert again.streams[0].weighting() == "proportion 1.0"
    elsewhere = dataclasses.replace(spec, streams=(dataclasses.replace(stream, uri="s3://b/x", lance_version=9),))
    assert elsewhere.versioned().mixture_version == spec.mixture_version  # lineage is not identity
    for change in ({"shard_set_id": "t"}, {"proportion": 0.5}, {"samples": 4},
                   {"caption_plan": {"weights": {"caption": 0.5}}}):
        other = dataclasses.replace(spec, streams=(dataclasses.replace(stream, **change),))
        assert other.versioned().mixture_version != spec.mixture_version, change
