"""``prx-assets lineage TARGET``: resolve a training run or shard set and add what Dagster recorded.

TARGET may be a Dagster run id of a ``training_run`` run, ``training_run`` /
``training_run[<mixture>]`` / a mixture name (its latest training run), a shard set id
(``v30-<recipe hash>-s<settings>``) or a shard set folder/URI (with ``manifest.json``).
The chain itself comes from :mod:`prx_assets.core.lineage`; this module adds the code
version of every materialization on the way, the captioners' models and prompts, and the
sources' configuration.
"""

import re
from typing import Any

import dagster as dg

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.lineage import mixture_lineage, read_mixture_spec, read_shard_set, shard_set_lineage
from prx_assets.core.manifests import ManifestError, ShardSetManifest
from prx_assets.core.publish.shards import read_shard_set_manifest
from prx_assets.defs.keys import (
    CURATED_SUBSETS,
    IMAGE_EMBEDDINGS,
    LANCE_TABLE,
    MDS_SHARDS,
    RAW_IMAGES,
    RECAPTIONS,
    TRAINING_MIXTURE,
    TRAINING_RUN,
)
from prx_assets.errors import PrxError
from prx_assets.infra.staleness import latest_materialization as _latest

_RUN_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_TRAINING = re.compile(r"^training_run(?:\[(?P<p>[^\]]+)\]|:(?P<q>.+))?$")


class LineageError(PrxError):
    """The target cannot be resolved."""


def _code_version(mat: dg.AssetMaterialization | None) -> str | None:
    return None if mat is None else mat.tags.get("dagster/code_version")


def _mat_with_version(instance: dg.DagsterInstance, key: dg.AssetKey | str, partition: str | None,
                      version: str) -> dg.AssetMaterialization | None:
    filt = dg.AssetRecordsFilter(asset_key=dg.AssetKey.from_coercible(key), asset_partitions=[partition] if partition else None)
    for rec in instance.fetch_materializations(filt, limit=200).records:
        mat = rec.asset_materialization
        if mat is not None and mat.tags.get("dagster/data_version") == version:
            return mat
    return None


def _enrich_shard_set(instance: dg.DagsterInstance, ss: dict[str, Any]) -> dict[str, Any]:
    """Code versions of the materializations behind a shard set; captioner and source configs."""
    from prx_assets.core.config.project import load_sources
    from prx_assets.core.models.config import load_models

    batches = sorted({b for info in ss["sources"].values() for b in info["batches"]})
    versions: dict[str, Any] = {
        "mds_shards": _code_version(_mat_with_version(instance, MDS_SHARDS, ss["recipe"], ss["shard_set_id"])),
        "curated_subsets": _code_version(_mat_with_version(instance, CURATED_SUBSETS, ss["recipe"],
                                                           ss["subset"]["subset_id"])),
        "lance_table": _code_version(_mat_with_version(instance, LANCE_TABLE, None, str(ss["lance"]["version"]))),
        "raw_images": sorted({v for b in batches if (v := _code_version(_latest(instance, RAW_IMAGES, b)))}),
        "image_embeddings": sorted({v for b in batches if (v := _code_version(_latest(instance, IMAGE_EMBEDDINGS,
                                                                                      b)))}),
        "recaptions": sorted({v for b in batches for c in ss["captioner_ids"]
                              if (v := _code_version(_latest(instance, RECAPTIONS, f"{b}|{c}")))}),
    }
    ss["asset_code_versions"] = {k: v for k, v in versions.items() if v}
    try:
        models = load_models()
        by_id = {c.captioner_id(): c for c in models.captioners}
        ss["captioners"] = {cid: (f"model {by_id[cid].model}, prompt {by_id[cid].prompt!r}" if cid in by_id
                                  else "no longer in models.yaml") for cid in ss["captioner_ids"]}
    except PrxError:
        ss["captioners"] = {}
    try:
        known = {src.name: src for src in load_sources().sources}
        ss["source_configs"] = {s: f"{known[s].kind} {known[s].location}" for s in ss["sources"] if s in known}
    except PrxError:
        ss["source_configs"] = {}
    return ss


def _find_shard_set(instance: dg.DagsterInstance, root: DataRoot, target: str) -> ShardSetManifest | None:
    if target.endswith(layout.SHARD_SET_MANIFEST) or "/" in target:
        try:
            return read_shard_set(target, root)
        except (OSError, ManifestError):
            return None
    for recipe in instance.get_dynamic_partitions("recipes"):
        if root.exists(layout.shard_set_manifest(recipe, target)):
            return read_shard_set_manifest(root, recipe, target)
    return None


def _training_mat(instance: dg.DagsterInstance, target: str) -> tuple[dg.AssetMaterialization, str] | None:
    if _RUN_ID.match(target):
        for ev in instance.all_logs(target):
            if ev.dagster_event and ev.dagster_event.is_step_materialization:
                mat = ev.dagster_event.step_materialization_data.materialization
                if mat.asset_key == TRAINING_RUN:
                    return mat, target
        raise LineageError(f"run {target} has no training_run materialization; pass the run id of a successful "
                           "training run, or a shard set id")
    m = _TRAINING.match(target)
    mixtures = instance.get_dynamic_partitions("mixtures")
    partition = (m.group("p") or m.group("q")) if m else (target if target in mixtures else None)
    if m and partition is None:
        if len(mixtures) != 1:
            raise LineageError(f"several mixtures {mixtures}: name one, e.g. training_run[{mixtures[0]}]"
                               if mixtures else "no mixtures registered yet")
        partition = mixtures[0]
    if partition is None:
        return None
    if partition not in mixtures:
        raise LineageError(f"unknown mixture {partition!r}; known mixtures: {', '.join(mixtures) or 'none yet'} "
                           "(mixtures.yaml names them; `prx-assets discover` registers them)")
    rec = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=TRAINING_RUN, asset_partitions=[partition]), limit=1).records
    if not rec or rec[0].asset_materialization is None:
        raise LineageError(f"training_run[{partition}] has not been materialized yet")
    return rec[0].asset_materialization, rec[0].run_id


def lineage_for(instance: dg.DagsterInstance, root: DataRoot, target: str) -> dict[str, Any]:
    """The lineage of ``target`` (see module docs) as a JSON-friendly dict."""
    found = _training_mat(instance, target)
    if found is not None:
        mat, run_id = found
        md = {k: v.value for k, v in mat.metadata.items()}
        spec = read_mixture_spec(str(md["spec_uri"]), root)
        mixture = mixture_lineage(root, spec)
        for s in mixture["streams"]:
            _enrich_shard_set(instance, s["shard_set"])
        mixture_mat = _mat_with_version(instance, TRAINING_MIXTURE, spec.name, spec.mixture_version)
        mixture["code_version"] = _code_version(mixture_mat)
        training = {k: md.get(k) for k in ("job_mode", "job_id", "steps", "loss_first", "loss_last",
                                           "samples_per_second", "mode", "text_encoder", "checkpoint")}
        training.update({"dagster_run_id": run_id, "mixture": spec.name,
                         "data_version": mat.tags.get("dagster/data_version"), "code_version": _code_version(mat)})
        return {"training": training, "mixture": mixture}
    manifest = _find_shard_set(instance, root, target)
    if manifest is None:
        raise LineageError(f"{target!r} is not a training run (run id, training_run[<mixture>], mixture name) nor a "
                           f"shard set (id, folder or manifest.json under {root.join(layout.MDS_DIR)})")
    return _enrich_shard_set(instance, shard_set_lineage(root, manifest))
