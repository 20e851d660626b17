"""Training mixtures: streams (shard sets) with proportions, resolved to published versions.

``mixtures.yaml``::

    mixtures:
      - name: base
        epoch_size: 100000            # optional; default: the sum of the streams' samples
        streams:
          - {recipe: hq_photos, proportion: 0.7}
          - {recipe: catalog, proportion: 0.3}
          # or per stream: repeat: 2.0 (upsample), or choose: 5000 (a fixed count)

The resolved spec is JSON the trainer consumes: for each stream its shard-set URI and id,
sample count and weighting, plus the expected samples per stream per epoch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prx_assets.core.config.project import config_dir, read_entries
from prx_assets.core.manifests import MixtureSpec, MixtureStream, ShardSetManifest
from prx_assets.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


@dataclass(frozen=True)
class StreamSpec:
    """One stream: a recipe's shard set and exactly one of proportion, repeat or choose."""

    recipe: str
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None


@dataclass(frozen=True)
class Mixture:
    """A named list of streams."""

    name: str
    streams: tuple[StreamSpec, ...]
    epoch_size: int | None = None


def load_mixtures(path: str | os.PathLike[str] | None = None,
                  known_recipes: list[str] | None = None) -> dict[str, Mixture]:
    """Parse ``mixtures.yaml``; a stream naming an unknown recipe fails with the known ones."""
    cfg = Path(path) if path is not None else config_dir() / "mixtures.yaml"
    spath = str(cfg)
    entries = read_entries(cfg, "mixtures", "mixtures: [{name: base, streams: [{recipe: r, proportion: 1}]}]")
    out: dict[str, Mixture] = {}
    for i, raw in enumerate(entries):
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if not isinstance(name, str) or not NAME_RE.match(name) or name in out:
            raise ConfigError(f"mixture name {name!r} is invalid or duplicated", path=spath, entry=f"mixtures[{i}]",
                              fix="use a unique lowercase name")
        where = f"mixture {name!r}"
        streams = []
        listed = raw.get("streams") or []
        if not isinstance(listed, list):
            raise ConfigError(f"streams={listed!r}: expected a list of streams, got {type(listed).__name__}",
                              path=spath, entry=where, fix="write streams: [{recipe: <recipe>, proportion: 1}]")
        for j, raw_s in enumerate(listed):
            if not isinstance(raw_s, Mapping):
                raise ConfigError(f"streams[{j}]={raw_s!r}: expected a mapping with a recipe and a weight, got "
                                  f"{type(raw_s).__name__}", path=spath, entry=where,
                                  fix=f"write {{recipe: {raw_s if isinstance(raw_s, str) else '<recipe>'}, "
                                      "proportion: 1}")
            for k in ("proportion", "repeat", "choose"):
                v = raw_s.get(k)
                whole = k == "choose"
                if v is not None and (isinstance(v, bool) or not isinstance(v, int if whole else int | float) or v <= 0):
                    raise ConfigError(f"streams[{j}].{k}={v!r}: expected a positive {'integer' if whole else 'number'}",
                                      path=spath, entry=where, fix=f"write {k}: {5000 if whole else 0.5}")
            recipe = raw_s.get("recipe")
            if known_recipes is not None and recipe not in known_recipes:
                raise ConfigError(f"stream names unknown recipe {recipe!r}; known recipes: {known_recipes}",
                                  path=spath, entry=where, fix="add the recipe to recipes.yaml or fix the name")
            weights = [k for k in ("proportion", "repeat", "choose") if raw_s.get(k) is not None]
            if len(weights) > 1:
                raise ConfigError(f"stream {recipe!r} sets {weights}; use one of proportion, repeat, choose",
                                  path=spath, entry=where, fix="keep one weighting per stream")
            streams.append(StreamSpec(recipe=str(recipe), proportion=raw_s.get("proportion"),
                                      repeat=raw_s.get("repeat"), choose=raw_s.get("choose")))
        if not streams:
            raise ConfigError("no streams", path=spath, entry=where, fix="add streams: [{recipe: ..., proportion: 1}]")
        if any(s.proportion is not None for s in streams) and any(s.proportion is None for s in streams):
            raise ConfigError("mixes proportion with repeat/choose", path=spath, entry=where,
                              fix="give every stream a proportion, or none of them")
        epoch = raw.get("epoch_size")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1):
            raise ConfigError(f"epoch_size={epoch!r}: expected a positive integer", path=spath, entry=where,
                              fix="write epoch_size: 100000, or leave it out (the streams' own sizes)")
        out[name] = Mixture(name=name, streams=tuple(streams), epoch_size=epoch)
    return out


def resolve(mixture: Mixture, shard_set: Callable[[str], ShardSetManifest]) -> MixtureSpec:
    """The trainer's spec: each stream's current published shard set and expected samples per epoch.

    ``shard_set(recipe)`` returns the manifest of the recipe's current shard set. The spec's
    ``mixture_version`` hashes everything else in it.
    """
    streams = []
    for s in mixture.streams:
        m = shard_set(s.recipe)
        streams.append(MixtureStream(recipe=s.recipe, shard_set_id=m.shard_set_id, uri=m.uri, samples=int(m.samples),
                                     proportion=s.proportion, repeat=s.repeat, choose=s.choose,
                                     caption_plan=m.caption_plan, lance_version=m.lance_version))
    total = sum(x.samples for x in streams)
    if all(x.proportion is not None for x in streams):
        epoch = int(mixture.epoch_size or total)
        weight = sum(float(x.proportion or 0) for x in streams)
        expected = {x.recipe: round(epoch * float(x.proportion or 0) / weight) for x in streams}
    else:
        expected = {x.recipe: int(x.choose) if x.choose is not None else
                    round(x.samples * float(x.repeat if x.repeat is not None else 1.0)) for x in streams}
        epoch = int(mixture.epoch_size or sum(expected.values()))
    return MixtureSpec(name=mixture.name, epoch_size=epoch, streams=tuple(streams),
                       expected_samples_per_stream=expected).versioned()


def streaming_kwargs(spec: MixtureSpec, cache_root: str | None = None) -> dict[str, Any]:
    """``StreamingDataset`` keyword arguments (physical streams + epoch size) for a resolved spec.

    Sets published as deltas carry skip lists that a plain ``StreamingDataset`` cannot apply:
    read specs with :class:`prx_assets.loader.PrxStreamingDataset` (``spec=``), which does.
    """
    from prx_assets.loader import resolve as resolve_streams

    return {"streams": resolve_streams(spec=spec).streams(cache_root), "epoch_size": spec.epoch_size}
