"""Training mixtures: streams (shard sets) with proportions, resolved to published versions.

``mixtures.yaml``::

    mixtures:
      - name: base
        epoch_size: 100000            # optional; default: the sum of the streams' samples
        streams:
          - {recipe: hq_photos, proportion: 0.7}
          - {recipe: catalog, proportion: 0.3}
          # or per stream: repeat: 2.0 (upsample), or choose: 5000 (a fixed count)
      - name: progressive             # phases: trained in order, each for its steps
        phases:
          - {name: low_res, steps: 20000, resolution: 512,
             streams: [{recipe: hq_photos, proportion: 0.5}, {recipe: catalog, proportion: 0.5}]}
          - {name: anneal, steps: 2000, resolution: 1024, streams: [{recipe: hq_photos, proportion: 1}]}

The resolved spec is JSON the trainer consumes: for each stream its shard-set URI and id,
sample count and weighting, plus the expected samples per stream per epoch; a phased mixture's
spec has the same per phase, with the phase's steps and resolution (its version covers them).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prx_assets.core.config.project import config_dir, read_entries
from prx_assets.core.config.schema import STRICT, validate
from prx_assets.core.manifests import MixturePhase, MixtureSpec, MixtureStream, ShardSetManifest
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
class Phase:
    """One phase of a phased mixture: streams, steps, and the resolution it trains at."""

    name: str
    steps: int
    streams: tuple[StreamSpec, ...]
    resolution: int | None = None
    epoch_size: int | None = None


@dataclass(frozen=True)
class Mixture:
    """A named list of streams, or of phases that each have their own."""

    name: str
    streams: tuple[StreamSpec, ...]
    epoch_size: int | None = None
    phases: tuple[Phase, ...] = ()


class StreamEntry(BaseModel):
    """One stream: a recipe's current shard set, weighted by at most one of proportion, repeat, choose."""

    model_config = STRICT
    recipe: str
    proportion: float | None = Field(default=None, gt=0, description="Share of the epoch (relative to the others).")
    repeat: float | None = Field(default=None, gt=0, description="Times the set's samples per epoch (2.0: upsample).")
    choose: int | None = Field(default=None, ge=1, description="Exactly this many samples per epoch.")


class PhaseEntry(BaseModel):
    """One phase of a phased mixture, trained for ``steps`` optimizer steps at ``resolution``."""

    model_config = STRICT
    name: str = Field(pattern=NAME_RE.pattern)
    steps: int = Field(ge=1)
    resolution: int | None = Field(default=None, ge=1)
    epoch_size: int | None = Field(default=None, ge=1)
    streams: list[StreamEntry]


class MixtureEntry(BaseModel):
    """One ``mixtures:`` entry: streams, or phases that each have their own."""

    model_config = STRICT
    name: str = Field(pattern=NAME_RE.pattern)
    epoch_size: int | None = Field(default=None, ge=1, description="Default: the sum of the streams' samples.")
    streams: list[StreamEntry] | None = None
    phases: list[PhaseEntry] | None = None


class MixturesFile(BaseModel):
    """``mixtures.yaml``: the training mixtures."""

    model_config = STRICT
    mixtures: list[MixtureEntry]


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
        for listed in [raw.get("streams")] + [ph.get("streams") for ph in raw.get("phases") or []
                                              if isinstance(ph, Mapping)]:
            _shape_of_streams(listed, spath, where)
        validate(MixtureEntry, raw, spath, where)  # types and keys; the values below are the file's own
        raw_phases = raw.get("phases")
        if raw_phases is not None:
            if raw.get("streams") is not None:
                raise ConfigError("sets both streams and phases", path=spath, entry=where,
                                  fix="give each phase its streams, and the mixture none")
            phases = _phases(raw_phases, spath, where, known_recipes)
            out[name] = Mixture(name=name, streams=_union(phases), phases=phases)
            continue
        out[name] = Mixture(name=name, streams=_streams(raw.get("streams") or [], spath, where, known_recipes),
                            epoch_size=raw.get("epoch_size"))
    return out


def _phases(raw_phases: Any, spath: str, where: str, known_recipes: list[str] | None) -> tuple[Phase, ...]:
    """Parse a mixture's ``phases:`` (name, steps, streams; resolution and epoch_size optional)."""
    if not isinstance(raw_phases, list) or not raw_phases:
        raise ConfigError(f"phases={raw_phases!r}: expected a list of phases", path=spath, entry=where,
                          fix="write phases: [{name: low_res, steps: 2000, resolution: 512, streams: [...]}]")
    phases: list[Phase] = []
    for j, raw in enumerate(raw_phases):
        pname = raw.get("name") if isinstance(raw, Mapping) else None
        at = f"{where} phase {j}"
        if not isinstance(pname, str) or not NAME_RE.match(pname) or pname in {p.name for p in phases}:
            raise ConfigError(f"phase name {pname!r} is invalid or duplicated", path=spath, entry=at,
                              fix="give each phase a unique lowercase name")
        phases.append(Phase(name=pname, steps=raw["steps"],
                            streams=_streams(raw.get("streams") or [], spath, at, known_recipes),
                            resolution=raw.get("resolution"), epoch_size=raw.get("epoch_size")))
    return tuple(phases)


def _union(phases: tuple[Phase, ...]) -> tuple[StreamSpec, ...]:
    """Every recipe any phase reads (unweighted: the phases carry the weights), first use first."""
    return tuple(StreamSpec(recipe=r) for r in dict.fromkeys(s.recipe for p in phases for s in p.streams))


def _shape_of_streams(listed: Any, spath: str, where: str) -> None:
    """A streams list written as names or as one name: said with the fix, before type checks."""
    if listed is None:
        return
    if not isinstance(listed, list):
        raise ConfigError(f"streams={listed!r}: expected a list of streams, got {type(listed).__name__}",
                          path=spath, entry=where, fix="write streams: [{recipe: <recipe>, proportion: 1}]")
    for j, raw_s in enumerate(listed):
        if not isinstance(raw_s, Mapping):
            raise ConfigError(f"streams[{j}]={raw_s!r}: expected a mapping with a recipe and a weight, got "
                              f"{type(raw_s).__name__}", path=spath, entry=where,
                              fix=f"write {{recipe: {raw_s if isinstance(raw_s, str) else '<recipe>'}, "
                                  "proportion: 1}")


def _streams(listed: Any, spath: str, where: str, known_recipes: list[str] | None) -> tuple[StreamSpec, ...]:
    """Parse a list of streams, each a recipe with at most one of proportion, repeat or choose."""
    streams = []
    for raw_s in listed:
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
    return tuple(streams)


def resolve(mixture: Mixture, shard_set: Callable[[str], ShardSetManifest]) -> MixtureSpec:
    """The trainer's spec: each stream's current published shard set and expected samples per epoch
    (per phase for a phased mixture, whose ``streams`` then list every set any phase reads).

    ``shard_set(recipe)`` returns the manifest of the recipe's current shard set. The spec's
    ``mixture_version`` hashes everything else in it.
    """
    shard_set = functools.cache(shard_set)  # a recipe several phases read is looked up once
    if not mixture.phases:
        streams, epoch, expected = _resolve_streams(mixture.streams, mixture.epoch_size, shard_set)
        return MixtureSpec(name=mixture.name, epoch_size=epoch, streams=streams,
                           expected_samples_per_stream=expected).versioned()
    phases = []
    for p in mixture.phases:
        streams, epoch, expected = _resolve_streams(p.streams, p.epoch_size, shard_set)
        phases.append(MixturePhase(name=p.name, steps=p.steps, epoch_size=epoch, streams=streams,
                                   expected_samples_per_stream=expected, resolution=p.resolution))
    every, _, _ = _resolve_streams(mixture.streams, None, shard_set)
    return MixtureSpec(name=mixture.name, epoch_size=phases[0].epoch_size, streams=every,
                       expected_samples_per_stream=phases[0].expected_samples_per_stream,
                       phases=tuple(phases)).versioned()


def _resolve_streams(specs: tuple[StreamSpec, ...], epoch_size: int | None, shard_set: Callable[[str], ShardSetManifest],
                     ) -> tuple[tuple[MixtureStream, ...], int, dict[str, int]]:
    """Streams pinned to their current shard sets, the epoch size, and the expected samples per stream."""
    streams = []
    for s in specs:
        m = shard_set(s.recipe)
        streams.append(MixtureStream(recipe=s.recipe, shard_set_id=m.shard_set_id, uri=m.uri, samples=int(m.samples),
                                     proportion=s.proportion, repeat=s.repeat, choose=s.choose,
                                     caption_plan=m.caption_plan, lance_version=m.lance_version))
    total = sum(x.samples for x in streams)
    if all(x.proportion is not None for x in streams):
        epoch = int(epoch_size or total)
        weight = sum(float(x.proportion or 0) for x in streams)
        expected = {x.recipe: round(epoch * float(x.proportion or 0) / weight) for x in streams}
    else:
        expected = {x.recipe: int(x.choose) if x.choose is not None else
                    round(x.samples * float(x.repeat if x.repeat is not None else 1.0)) for x in streams}
        epoch = int(epoch_size or sum(expected.values()))
    return tuple(streams), epoch, expected


def streaming_kwargs(spec: MixtureSpec, cache_root: str | None = None) -> dict[str, Any]:
    """``StreamingDataset`` keyword arguments (physical streams + epoch size) for a resolved spec.

    Sets published as deltas carry skip lists that a plain ``StreamingDataset`` cannot apply:
    read specs with :class:`prx_assets.loader.PrxStreamingDataset` (``spec=``), which does.
    """
    from prx_assets.core.publish.loader import resolve as resolve_streams

    return {"streams": resolve_streams(spec=spec).streams(cache_root), "epoch_size": spec.epoch_size}
