"""training_mixture: streams and proportions over the current shard sets, one partition per mixture."""

import dagster as dg

from prx_assets.core import layout
from prx_assets.core.faults import crash_point
from prx_assets.core.manifests import MixtureSpec, ShardSetManifest
from prx_assets.core.publish.mixture import resolve
from prx_assets.core.publish.shards import read_shard_set_manifest
from prx_assets.defs.keys import MDS_SHARDS, TRAINING_MIXTURE, group
from prx_assets.defs.shards import mds_shards
from prx_assets.infra.partitions import mixture_partitions
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    digest,
    latest_data_version,
)
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

MIXTURE_CODE_VERSION = "mixture-1"


def _current_shard_set(instance: dg.DagsterInstance, recipe: str) -> str:
    version = latest_data_version(instance, MDS_SHARDS, recipe)
    if not version:
        raise dg.Failure(f"recipe {recipe!r} has no published shard set; materialize mds_shards[{recipe}] first")
    return version


def mixture_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """Code version + the mixture's streams + their current shard set ids."""
    mix = ctx.config().mixtures()[partition_key or ""]
    ids = [ctx.data_version(MDS_SHARDS, s.recipe) for s in mix.streams]
    return digest(MIXTURE_CODE_VERSION, repr(mix), ids)




def streams_table(spec: MixtureSpec) -> str:
    """The spec's streams as a Markdown table (per phase, in training order, for a phased mixture)."""
    if not spec.phases:
        return "\n".join(["| stream | shard set | samples | weighting | expected per epoch |", "|---|---|---|---|---|"] +
                         [f"| {s.recipe} | {s.shard_set_id} | {s.samples} | {s.weighting()} | "
                          f"{spec.expected_samples_per_stream[s.recipe]} |" for s in spec.streams])
    head = ["| phase | steps | resolution | stream | shard set | samples | weighting | expected per epoch |",
            "|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + [f"| {p.name} | {p.steps} | {p.resolution or 'trainer default'} | {s.recipe} | "
                             f"{s.shard_set_id} | {s.samples} | {s.weighting()} | "
                             f"{p.expected_samples_per_stream[s.recipe]} |" for p in spec.phases for s in p.streams])


@dg.asset(
    partitions_def=mixture_partitions,
    deps=[dg.AssetDep(mds_shards, partition_mapping=dg.AllPartitionMapping())],
    group_name=group(TRAINING_MIXTURE),
    kinds={"mosaicml", "json"},
    code_version=MIXTURE_CODE_VERSION,
    owners=["team:training"],
    tags={"stage": "mixture"},
)
def training_mixture(context: dg.AssetExecutionContext, storage: StorageResource,
                     project: ProjectConfigResource) -> dg.MaterializeResult:
    """A mixture spec (JSON) the trainer consumes: each stream pinned to its recipe's current
    published shard set, with proportion/repeat/choose and the expected samples per stream
    per epoch. The data version is the spec's hash, so one spec version means one training run."""
    root = storage.root()
    mix = project.mixtures(known_recipes=[r.name for r in project.recipes().recipes])[context.partition_key]

    def manifest(recipe: str) -> ShardSetManifest:
        return read_shard_set_manifest(root, recipe, _current_shard_set(context.instance, recipe))

    spec = resolve(mix, manifest)
    rel = layout.mixture_spec(mix.name, spec.mixture_version)
    crash_point("mixture.before_spec")
    root.write_bytes(rel, spec.to_json())
    table = streams_table(spec)
    return dg.MaterializeResult(
        data_version=dg.DataVersion(spec.mixture_version),
        metadata={
            "spec_uri": dg.MetadataValue.path(root.join(rel)),
            "mixture_version": spec.mixture_version,
            "epoch_size": spec.epoch_size,
            "streams": dg.MetadataValue.md(table),
            "expected_samples_per_stream": dg.MetadataValue.json(spec.expected_samples_per_stream),
            **({"phases": dg.MetadataValue.json([{"name": p.name, "steps": p.steps, "resolution": p.resolution,
                                                   "epoch_size": p.epoch_size} for p in spec.phases])}
               if spec.phases else {}),
            FINGERPRINT_KEY: dg.MetadataValue.text(mixture_fingerprint(
                FingerprintContext(root=root, sources=None, instance=context.instance, project=project),
                context.partition_key)),
        },
    )
