"""Lineage from a training run or a shard set back to the source files.

Everything needed is already recorded: a training run's materialization names its mixture
spec; the spec pins each stream to a shard set; each shard set's ``manifest.json`` names its
curated subset, the Lance URI and version (tagged, so it stays readable) and the captioner
ids; the subset's ids, read against that Lance version, give the sources and ingest batches
of every image. Code versions come from the Dagster materializations (see the CLI's
``lineage`` verb, which adds them).
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prx_assets.core.config.storage import DataRoot, read_uri
from prx_assets.core.curate.subsets import read_subset_manifest
from prx_assets.core.lab.sql import open_pinned
from prx_assets.core.manifests import (
    MixtureSpec,
    ShardSetManifest,
    SubsetManifest,
    read_mixture_spec_at,
    read_shard_set_at,
)


def read_shard_set(uri: str, root: DataRoot) -> ShardSetManifest:
    """A shard set's manifest by folder, ``manifest.json`` path or URI (with ``root``'s credentials)."""
    return read_shard_set_at(uri, root.settings)


def read_mixture_spec(uri: str, root: DataRoot) -> MixtureSpec:
    """A mixture spec by absolute path or URI (with ``root``'s credentials)."""
    return read_mixture_spec_at(uri, root.settings)


def sources_of_subset(root: DataRoot, subset: SubsetManifest) -> dict[str, dict[str, Any]]:
    """Per source: images in the subset and the ingest batches they came from (at the pinned version)."""
    ids = pq.read_table(io.BytesIO(read_uri(subset.ids, root.settings))).column("image_id")
    ds = open_pinned(subset, root.storage_options())
    t = ds.to_table(columns=["image_id", "source", "batch", "uri"])
    t = t.filter(pc.is_in(t.column("image_id"), value_set=pa.array(ids.to_pylist(), pa.string())))
    out: dict[str, dict[str, Any]] = {}
    by_source = Counter(t.column("source").to_pylist())
    batches: dict[str, Counter[str]] = {}
    examples: dict[str, list[str]] = {}
    for src, batch, uri in zip(t.column("source").to_pylist(), t.column("batch").to_pylist(),
                               t.column("uri").to_pylist(), strict=True):
        batches.setdefault(src, Counter())[batch] += 1
        if len(examples.setdefault(src, [])) < 2:
            examples[src].append(uri)
    for src, n in sorted(by_source.items()):
        out[src] = {"images": n, "batches": dict(sorted(batches[src].items())), "example_files": examples[src]}
    return out


def shard_set_lineage(root: DataRoot, manifest: ShardSetManifest) -> dict[str, Any]:
    """A shard set's chain: subset, Lance version, captioners, sources and batches."""
    subset = read_subset_manifest(root, manifest.recipe, manifest.subset_id)
    return {
        "shard_set_id": manifest.shard_set_id, "uri": manifest.uri, "samples": manifest.samples,
        "shards": manifest.shards, "code_version": manifest.code_version or None,
        "text_latents": (manifest.text_latents or {}).get("tower"),
        "dagster_run_id": manifest.extra.get("dagster_run_id"),
        "recipe": manifest.recipe, "recipe_hash": manifest.recipe_hash,
        "subset": {"subset_id": subset.subset_id, "selected": subset.selected, "total": subset.total,
                   "dropped": subset.dropped, "uri": subset.ids.rpartition("/")[0]},
        "lance": {"uri": manifest.lance_uri, "version": manifest.lance_version, "tag": manifest.lance_tag},
        "captioner_ids": list(manifest.captioner_ids),
        "caption_columns": sorted((manifest.caption_plan or {}).get("columns", {})),
        "sources": sources_of_subset(root, subset),
        "layout": manifest.layout, "skipped": manifest.skipped,
        "previous_shard_set_id": manifest.extra.get("previous_shard_set_id"),
        "sidecars": [{"stream": i, "columns": side["columns"], "written_by": side.get("written_by"),
                      "uri": side["uri"]}
                     for i, stream in enumerate(manifest.physical_streams()) for side in stream.get("sidecars", [])],
        "optout_requests": {**subset.optout_requests, **(manifest.extra.get("optout_requests") or {})},
    }


def mixture_lineage(root: DataRoot, spec: MixtureSpec) -> dict[str, Any]:
    """A mixture spec's chain: each stream's weighting and shard-set lineage."""
    streams = []
    for s in spec.streams:
        weighting = {k: getattr(s, k) for k in ("proportion", "repeat", "choose") if getattr(s, k) is not None}
        streams.append({"recipe": s.recipe, "weighting": weighting,
                        "expected_per_epoch": spec.expected_samples_per_stream.get(s.recipe),
                        "shard_set": shard_set_lineage(root, read_shard_set(s.uri, root))})
    phases = [{"name": p.name, "steps": p.steps, "resolution": p.resolution, "epoch_size": p.epoch_size,
               "streams": [{"recipe": s.recipe, "shard_set_id": s.shard_set_id, "weighting": s.weighting(),
                            "expected_per_epoch": p.expected_samples_per_stream.get(s.recipe)} for s in p.streams]}
              for p in spec.phases]
    return {"name": spec.name, "mixture_version": spec.mixture_version, "epoch_size": spec.epoch_size,
            "streams": streams, **({"phases": phases} if phases else {})}


def render(lineage: dict[str, Any]) -> str:
    """An indented text tree of a lineage dict (training run, mixture or shard set)."""
    lines: list[str] = []

    def shard(ss: dict[str, Any], ind: str) -> None:
        lines.append(f"{ind}shard set {ss['shard_set_id']}  ({ss['samples']} samples, {ss['shards']} shards, "
                     f"code {ss.get('code_version')}{', latents ' + ss['text_latents'] if ss.get('text_latents') else ''})")
        lines.append(f"{ind}  uri: {ss['uri']}")
        if ss.get("layout") == "delta":
            lines.append(f"{ind}  published as a delta of {ss.get('previous_shard_set_id')}: "
                         f"{ss.get('skipped', 0)} samples of earlier streams skipped, none rewritten")
        for side in ss.get("sidecars") or []:
            lines.append(f"{ind}  stream {side['stream']} + columns {', '.join(side['columns'])} (sidecar written "
                         f"by {side['written_by']}, no image bytes rewritten)")
        for req, n in (ss.get("optout_requests") or {}).items():
            lines.append(f"{ind}  opt-out {req}: {n} images removed")
        if ss.get("dagster_run_id"):
            lines.append(f"{ind}  written by Dagster run {ss['dagster_run_id']}")
        if ss.get("asset_code_versions"):
            lines.append(f"{ind}  code versions: {ss['asset_code_versions']}")
        sub = ss["subset"]
        lines.append(f"{ind}  curated subset {sub['subset_id']} of recipe {ss['recipe']} (hash {ss['recipe_hash']}): "
                     f"{sub['selected']} of {sub['total']} images; dropped {sub['dropped']}")
        lines.append(f"{ind}    lance {ss['lance']['uri']} version {ss['lance']['version']} "
                     f"(tag {ss['lance']['tag']})")
        lines.append(f"{ind}    captions: {', '.join(ss['caption_columns']) or '-'} from captioners "
                     f"{', '.join(ss['captioner_ids']) or '-'}")
        for cid, desc in (ss.get("captioners") or {}).items():
            lines.append(f"{ind}      {cid}: {desc}")
        for src, info in ss["sources"].items():
            cfg = (ss.get("source_configs") or {}).get(src, "")
            lines.append(f"{ind}    source {src}{' (' + cfg + ')' if cfg else ''}: {info['images']} images from "
                         f"batches {', '.join(f'{b} ({n})' for b, n in info['batches'].items())}")
            for ex in info["example_files"]:
                lines.append(f"{ind}      e.g. {ex}")

    def mixture(mx: dict[str, Any], ind: str) -> None:
        lines.append(f"{ind}mixture {mx['name']} version {mx['mixture_version']} (epoch {mx['epoch_size']} samples)")
        for p in mx.get("phases") or []:
            lines.append(f"{ind}  phase {p['name']}: {p['steps']} steps at resolution {p['resolution'] or 'default'}, "
                         f"epoch {p['epoch_size']}: " + ", ".join(
                             f"{s['recipe']} {s['weighting']} ({s['shard_set_id']})" for s in p["streams"]))
        for s in mx["streams"]:
            lines.append(f"{ind}  stream {s['recipe']} {s['weighting'] or 'all samples'}, "
                         f"{s['expected_per_epoch']} per epoch")
            shard(s["shard_set"], ind + "    ")

    if "training" in lineage:
        t = lineage["training"]
        lines.append(f"training run {t.get('dagster_run_id')} on mixture {t.get('mixture')} "
                     f"(data version {t.get('data_version')}, code {t.get('code_version')})")
        for k in ("job_mode", "job_id", "steps", "loss_first", "loss_last", "samples_per_second", "mode",
                  "text_encoder", "checkpoint"):
            if t.get(k) not in (None, ""):
                lines.append(f"  {k}: {t[k]}")
        mixture(lineage["mixture"], "  ")
    elif "streams" in lineage:
        mixture(lineage, "")
    else:
        shard(lineage, "")
    return "\n".join(lines)
