"""Opt-out requests: strict line-numbered parsing, content-addressed requests, applied by curation."""

from pathlib import Path

import lance
import pytest

from prx_assets.core.config.storage import DataRoot
from prx_assets.core.curate.optout import load_requests, new_request, read_lines, record, registry_version
from prx_assets.core.curate.recipes import Recipe
from prx_assets.core.curate.selection import select
from prx_assets.core.lab.table import table_uri
from prx_assets.errors import ConfigError
from tests.unit.test_lab import build


def test_files_are_parsed_strictly_with_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "ids.txt"
    f.write_text("# images to remove\n0123456789abcdef\n\n0123456789abcdef  # twice is once\nnot-an-id\n")
    with pytest.raises(ConfigError, match=r"line 5: 'not-an-id' is not an image id"):
        read_lines(f, "ids")
    f.write_text("0123456789abcdef\n0123456789abcdef\n")
    assert read_lines(f, "ids") == ("0123456789abcdef",)
    u = tmp_path / "uris.txt"
    u.write_text("s3://b/a.jpg\ns3://b/b c.jpg\n")
    with pytest.raises(ConfigError, match=r"line 2: .* contains whitespace"):
        read_lines(u, "uris")
    with pytest.raises(ConfigError, match="file not found"):
        read_lines(tmp_path / "nope.txt", "ids")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="no values"):
        read_lines(tmp_path / "empty.txt", "uris")


def test_requests_are_recorded_once_and_applied_by_every_recipe(tmp_path: Path) -> None:
    root = DataRoot(str(tmp_path / "root"))
    rows = build(root, tmp_path / "photos", n=8, batch_size=100)
    ds = lance.dataset(table_uri(root, "images"))
    gone = sorted(r["image_id"] for r in rows)[:2]
    req = new_request(image_ids=tuple(gone), uris=("/nowhere/x.jpg",), reason="takedown 42")
    assert req == new_request(image_ids=tuple(reversed(gone)), uris=("/nowhere/x.jpg",), reason="takedown 42")
    assert record(root, req) and not record(root, req)
    requests = load_requests(root)
    assert requests == [req] and registry_version(requests) != registry_version([])
    before = select(ds, Recipe(name="a"))
    after = select(ds, Recipe(name="a"), optouts=requests)
    assert set(before.image_ids) - set(after.image_ids) == set(gone)
    assert after.optout_dropped == {req.request_id: 2} and after.dropped["optout_requests"] == 2
    assert after.content_hash != before.content_hash
