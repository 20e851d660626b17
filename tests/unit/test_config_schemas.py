"""The published JSON Schemas of the config files are current and accept the shipped files."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from prx_assets.core.config import schemas

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "config", ROOT / "prx_assets" / "defaults" / "config"]


def test_the_published_schemas_are_generated_from_the_loaders_models() -> None:
    assert schemas.main(["--check"]) == 0, "run `python -m prx_assets.core.config.schemas`"


@pytest.mark.parametrize("folder", SHIPPED, ids=["config", "defaults"])
@pytest.mark.parametrize("name", sorted(schemas.FILES))
def test_every_shipped_config_file_meets_its_schema(folder: Path, name: str) -> None:
    doc = yaml.safe_load((folder / f"{name}.yaml").read_text())
    jsonschema.validate(doc, json.loads((schemas.DOCS / f"{name}.schema.json").read_text()))
    schemas.FILES[name].model_validate_json(json.dumps(doc))


@pytest.mark.parametrize(("name", "doc"), [
    ("sources", {"sources": [{"name": "x", "kind": "ftp", "path": "/x"}]}),
    ("sources", {"sources": [{"name": "x", "kind": "s3", "path": "/x"}]}),  # s3 needs a uri
    ("sources", {"sources": [{"name": "x", "kind": "folder", "path": "/x", "ingest": {"jpeg_quality": "92"}}]}),
    ("models", {"captioners": [{"name": "d", "model": "m", "max_new_tokens": True}]}),
    ("recipes", {"recipes": [{"name": "r", "dedup": {"exact": "yes"}}]}),
    ("mixtures", {"mixtures": [{"name": "m", "streams": [{"recipe": "a", "weight": 1}]}]}),
])
def test_an_editor_sees_what_the_loader_refuses(name: str, doc: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json.loads((schemas.DOCS / f"{name}.schema.json").read_text()))
