"""``recipes.yaml``: declarative curation recipes over the lab.

::

    recipes:
      - name: hq_photos
        where: "source = 'photos' AND orig_bytes > 20000"   # Lance SQL predicate
        captions: [detailed, short]       # captioner names or ids, in order of preference
        caption_mix: {detailed: 0.7, short: 0.3}   # or: several caption columns, sampled by weight
        min_side: 256                     # minimum resolution (shorter side, pixels)
        aspect_buckets: ["1:1", "4:3", "3:4", "16:9", "9:16"]
        dedup: {exact: true, phash_distance: 4, embedding_threshold: 0.97}
        optout: {image_ids: optout/ids.txt, uris: optout/uris.txt}   # one value per line
        cap: 100000                       # optional sample cap ...
        seed: 0                           # ... drawn deterministically with this seed

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from prx_assets.core.config.project import config_dir, expand_env, named, read_entries
from prx_assets.core.config.schema import STRICT, model_of, validate
from prx_assets.errors import ConfigError

RECIPE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


@dataclass(frozen=True)
class Dedup:
    """Dedup policy: exact sha256, perceptual-hash Hamming distance, embedding cosine similarity."""

    exact: bool = True
    phash_distance: int | None = None
    embedding_threshold: float | None = None


#: ``Dedup`` as a strict model (its schema; validation goes through :func:`validate`).
DedupModel = model_of(Dedup)


@dataclass(frozen=True)
class Recipe:
    """One curation recipe (see module docs)."""

    name: str
    where: str | None = None
    captions: tuple[str, ...] = ()
    caption_mix: tuple[tuple[str, float], ...] = ()
    min_side: int | None = None
    min_pixels: int | None = None
    aspect_buckets: tuple[str, ...] = ()
    dedup: Dedup = field(default_factory=Dedup)
    optout_ids_file: str | None = None
    optout_uris_file: str | None = None
    cap: int | None = None
    seed: int = 0
    description: str = ""

    def recipe_hash(self) -> str:
        """Hash of the recipe's settings plus the content of its opt-out files."""
        payload = asdict(self)
        payload.pop("description")
        for key in ("optout_ids_file", "optout_uris_file"):
            path = payload[key]
            payload[key] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def caption_names(self) -> list[str]:
        """The captioners the recipe reads: ``captions``, then those only in ``caption_mix``.

        >>> Recipe(name="r", captions=("a",), caption_mix=(("b", 0.5), ("a", 0.5))).caption_names()
        ['a', 'b']
        """
        return list(self.captions) + [n for n, _ in self.caption_mix if n not in self.captions]

    def optout_ids(self) -> set[str]:
        """Image ids listed in the opt-out file."""
        return _read_lines(self.optout_ids_file)

    def optout_uris(self) -> set[str]:
        """Source URIs listed in the opt-out file."""
        return _read_lines(self.optout_uris_file)


def _read_lines(path: str | None) -> set[str]:
    if not path:
        return set()
    return {ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.startswith("#")}


@dataclass(frozen=True)
class RecipesConfig:
    """The parsed ``recipes.yaml``."""

    path: str
    recipes: tuple[Recipe, ...]

    def get(self, name: str) -> Recipe:
        """The recipe called ``name``; the error lists the known ones."""
        return named(self.recipes, name, "recipe", self.path, "add it to recipes.yaml or use a known name")


class OptoutFiles(BaseModel):
    """A recipe's own opt-out lists: files of image ids or source URIs, one a line (relative to the file)."""

    model_config = STRICT
    image_ids: str | None = None
    uris: str | None = None


class RecipeEntry(BaseModel):
    """One ``recipes:`` entry of ``recipes.yaml``."""

    model_config = STRICT
    name: str = Field(pattern=RECIPE_NAME_RE.pattern)
    description: str | None = None
    where: str | None = Field(default=None, description="A SQL predicate pushed down to the lab's scan.")
    captions: list[str] = Field(default_factory=list, description="Captioner names or ids whose captions go out.")
    caption_mix: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="Captioner name -> weight: one caption per sample drawn by weight.")
    min_side: int | None = Field(default=None, ge=1)
    min_pixels: int | None = Field(default=None, ge=1)
    aspect_buckets: list[str] = Field(default_factory=list, description="Keep only these 'W:H' buckets.")
    dedup: DedupModel = Field(default_factory=DedupModel)  # type: ignore[valid-type]
    optout: OptoutFiles | None = None
    cap: int | None = Field(default=None, ge=1, description="At most this many images, drawn with seed.")
    seed: int = 0


class RecipesFile(BaseModel):
    """``recipes.yaml``: the curation recipes."""

    model_config = STRICT
    recipes: list[RecipeEntry]


def _bad(msg: str, path: str, where: str, fix: str) -> ConfigError:
    return ConfigError(msg, path=path, entry=where, fix=fix)


def _file(value: Any, cfg: Path, where: str, what: str) -> str:
    try:
        p = Path(expand_env(str(value))).expanduser()
    except KeyError as e:
        raise _bad(f"environment variable {e.args[0]} is not set", str(cfg), where,
                   f"export {e.args[0]}") from None
    if not p.is_absolute():
        p = (cfg.parent / p).resolve()
    if not p.is_file():
        raise _bad(f"{what} file {str(p)!r} does not exist", str(cfg), where,
                   "create it (one value per line) or remove the entry")
    return str(p)


def _bucket(bucket: Any, path: str, where: str) -> None:
    """An aspect bucket must be ``'W:H'`` with positive sides."""
    try:
        w, h = (float(x) for x in str(bucket).split(":"))
        if not (w > 0 and h > 0):
            raise ValueError
    except ValueError:
        raise _bad(f"aspect bucket {bucket!r} is not of the form 'W:H' with positive sides", path, where,
                   "write buckets like '16:9' (ingest assigns the nearest of its aspect_buckets)") from None


def _parse_one(raw: Any, i: int, cfg: Path) -> Recipe:
    spath = str(cfg)
    name = raw.get("name") if isinstance(raw, Mapping) else None
    if not isinstance(name, str) or not RECIPE_NAME_RE.match(name):
        raise _bad(f"recipe name {name!r} is invalid", spath, f"recipes[{i}]",
                   "use lowercase letters, digits and '_' starting with a letter")
    where = f"recipe {name!r}"
    if isinstance(raw.get("aspect_buckets"), str):
        raise _bad(f"aspect_buckets={raw['aspect_buckets']!r} must be a list of 'W:H' buckets", spath, where,
                   "write aspect_buckets: ['1:1', '4:3']")
    entry = validate(RecipeEntry, {k: v for k, v in raw.items() if v is not None or k in ("where", "cap")},
                     spath, where)
    dedup = entry.dedup
    if dedup.phash_distance is not None and not (0 <= dedup.phash_distance <= 16):
        raise _bad(f"phash_distance={dedup.phash_distance!r} is outside 0..16", spath, where, "use e.g. 4")
    if dedup.embedding_threshold is not None and not (0.0 < dedup.embedding_threshold <= 1.0):
        raise _bad(f"embedding_threshold={dedup.embedding_threshold!r} is outside (0, 1]", spath, where,
                   "use a cosine similarity such as 0.97")
    for bucket in entry.aspect_buckets:
        _bucket(bucket, spath, where)
    optout = entry.optout or OptoutFiles()
    return Recipe(
        name=name, description=entry.description or "", where=entry.where, captions=tuple(entry.captions),
        caption_mix=tuple((k, float(v)) for k, v in entry.caption_mix.items()), min_side=entry.min_side,
        min_pixels=entry.min_pixels, aspect_buckets=tuple(entry.aspect_buckets),
        dedup=Dedup(**dedup.model_dump()),
        optout_ids_file=_file(optout.image_ids, cfg, where, "opt-out image_ids") if optout.image_ids else None,
        optout_uris_file=_file(optout.uris, cfg, where, "opt-out uris") if optout.uris else None,
        cap=entry.cap, seed=entry.seed)


def load_recipes(path: str | os.PathLike[str] | None = None) -> RecipesConfig:
    """Parse and validate ``recipes.yaml`` (default ``$PRX_CONFIG_DIR/recipes.yaml``).

    Column names and captioner ids are checked against the lab when a recipe runs
    (:func:`prx_assets.core.curate.selection.select`), where the table is known.
    """
    cfg = Path(path) if path is not None else config_dir() / "recipes.yaml"
    spath = str(cfg)
    entries = read_entries(cfg, "recipes", "recipes: [{name: all, where: \"width >= 256\"}]")
    recipes: list[Recipe] = []
    for i, raw in enumerate(entries):
        recipe = _parse_one(raw, i, cfg)
        if any(r.name == recipe.name for r in recipes):
            raise ConfigError("duplicate recipe name", path=spath, entry=f"recipe {recipe.name!r}",
                              fix="give every recipe a unique name")
        recipes.append(recipe)
    return RecipesConfig(path=spath, recipes=tuple(recipes))
