"""Partition definitions shared by the stages, and the one rule for registering and pruning keys."""

import os
from collections.abc import Iterable

import dagster as dg

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.errors import PrxError
from prx_assets.resources.storage import ProjectConfigResource

#: One partition per ingest batch, keyed ``<source>-<seq>`` (e.g. ``photos-00003``).
#: Discovery (``raw_batch_sensor`` or ``prx-assets discover``) adds keys as new files arrive.
raw_batches = dg.DynamicPartitionsDefinition(name="raw_batches")

#: One partition per captioner id (``<name>-<hash>``) from models.yaml; registered by
#: discovery, so a new captioner adds a column of partitions to backfill.
captioner_partitions = dg.DynamicPartitionsDefinition(name="captioners")

#: recaptions: every ingest batch x every captioner (keys ``photos-00001|detailed-1a2b3c4d``).
recaption_partitions = dg.MultiPartitionsDefinition(
    {"batch": raw_batches, "captioner": captioner_partitions})

#: One partition per recipe in recipes.yaml; recipes added to the file appear as partitions.
recipe_partitions = dg.DynamicPartitionsDefinition(name="recipes")

#: One partition per mixture in mixtures.yaml.
mixture_partitions = dg.DynamicPartitionsDefinition(name="mixtures")


#: The dynamic partition sets whose keys come from config files (not from discovery).
CONFIGURED = (captioner_partitions, recipe_partitions, mixture_partitions)


def configured_keys(project: ProjectConfigResource) -> dict[str, list[str]]:
    """Keys the config folder defines, per dynamic partitions name (a missing file defines none)."""
    out: dict[str, list[str]] = {}
    if os.path.isfile(project.models_path()):
        out[_name(captioner_partitions)] = project.models().captioner_ids()
    if os.path.isfile(project.path("recipes.yaml")):
        out[_name(recipe_partitions)] = [r.name for r in project.recipes().recipes]
    if os.path.isfile(project.path("mixtures.yaml")):
        out[_name(mixture_partitions)] = list(project.mixtures())
    return out


def missing_partitions(instance: dg.DagsterInstance, project: ProjectConfigResource,
                       batch_keys: Iterable[str]) -> dict[str, list[str]]:
    """Keys to add, per dynamic partitions name: discovered ``batch_keys`` and configured keys not yet known.

    The one registration rule, shared by ``prx-assets discover``/``run`` and the ``raw_batch_sensor``.
    """
    wanted = {_name(raw_batches): list(batch_keys), **configured_keys(project)}
    out = {}
    for name, keys in wanted.items():
        known = set(instance.get_dynamic_partitions(name))
        fresh = [k for k in dict.fromkeys(keys) if k not in known]
        if fresh:
            out[name] = fresh
    return out


def orphan_partitions(instance: dg.DagsterInstance, project: ProjectConfigResource,
                      root: DataRoot) -> dict[str, dict[str, str]]:
    """Registered keys nothing backs any more, per partitions name: ``{key: why}``.

    A batch key without a manifest (e.g. added by hand in the UI's "Add a partition"), or a
    captioner, recipe or mixture no longer in its config file. Planning skips them;
    ``prx-assets partitions --prune`` removes them. Costs one listing per source.
    """
    from prx_assets.core.ingest.batches import parse_batch_key

    out: dict[str, dict[str, str]] = {}
    listed: dict[str, set[str]] = {}
    for key in instance.get_dynamic_partitions(_name(raw_batches)):
        try:
            source, seq = parse_batch_key(key)
        except PrxError as e:
            out.setdefault(_name(raw_batches), {})[key] = f"not a batch key: {e}"
            continue
        if source not in listed:
            listed[source] = set(root.list(layout.batches_dir(source)))
        if layout.batch_manifest(source, seq) not in listed[source]:
            out.setdefault(_name(raw_batches), {})[key] = (
                f"no batch manifest {layout.batch_manifest(source, seq)} under the data root")
    configured = configured_keys(project)
    files = {_name(captioner_partitions): "models.yaml", _name(recipe_partitions): "recipes.yaml",
             _name(mixture_partitions): "mixtures.yaml"}
    for pdef in CONFIGURED:
        name = _name(pdef)
        keep = set(configured.get(name, []))
        for key in instance.get_dynamic_partitions(name):
            if key not in keep:
                out.setdefault(name, {})[key] = f"not in {project.path(files[name])}"
    return out


def is_orphan(orphans: dict[str, dict[str, str]], partitions_def: dg.PartitionsDefinition | None,
              key: str | None) -> str | None:
    """Why ``key`` of ``partitions_def`` is an orphan (any dimension of a multi-partition), else ``None``."""
    if partitions_def is None or key is None:
        return None
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        by_dim = partitions_def.get_partition_key_from_str(key).keys_by_dimension
        for dim in partitions_def.partitions_defs:
            why = is_orphan(orphans, dim.partitions_def, by_dim[dim.name])
            if why:
                return why
        return None
    if isinstance(partitions_def, dg.DynamicPartitionsDefinition):
        return orphans.get(_name(partitions_def), {}).get(key)
    return None


def _name(pdef: dg.DynamicPartitionsDefinition) -> str:
    assert pdef.name is not None  # every definition above is named
    return pdef.name
