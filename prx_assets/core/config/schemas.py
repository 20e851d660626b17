"""The JSON Schemas of the four config files, published in ``docs/schemas/`` for editors.

Generated from the pydantic models the loaders validate with (``SourcesFile``, ``ModelsFile``,
``RecipesFile``, ``MixturesFile``), so the schema and the loader cannot disagree on a key or a
type. ``python -m prx_assets.core.config.schemas`` writes them; ``--check`` fails when a
published one is out of date (a test runs it). An editor with the YAML language server
validates a file that starts with ``# yaml-language-server: $schema=<path to the schema>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from prx_assets.core.config.project import SourcesFile
from prx_assets.core.curate.recipes import RecipesFile
from prx_assets.core.models.config import ModelsFile
from prx_assets.core.publish.mixture import MixturesFile

#: Config file stem -> the model of its shape.
FILES: dict[str, type[BaseModel]] = {"sources": SourcesFile, "models": ModelsFile, "recipes": RecipesFile,
                                     "mixtures": MixturesFile}
DOCS = Path(__file__).resolve().parents[3] / "docs" / "schemas"


def schema(name: str) -> str:
    """The JSON Schema of ``<name>.yaml`` as published (sorted keys, a trailing newline)."""
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"{name}.yaml",
           **FILES[name].model_json_schema()}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    """Write (or with ``--check``, compare) every schema under ``docs/schemas/``."""
    stale = []
    DOCS.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        path = DOCS / f"{name}.schema.json"
        text = schema(name)
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.write_text(text)
        print(path)
    if stale:
        print(f"out of date: {stale}; run `python -m prx_assets.core.config.schemas`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
