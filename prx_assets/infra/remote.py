"""Pipeline stages that can run in-process (default) or as SLURM jobs through Pipes.

A stage (:mod:`prx_assets.core.stages`, Dagster-free) is a function ``(StageResources,
partition_key, log) -> result dataclass``, the whole work of one partition of ``raw_images``,
``recaptions`` or ``image_embeddings``. The asset
calls :func:`run_stage` (or :func:`run_stages` for a run over several partitions): in-process
it calls the function directly; when the stage is listed in ``SlurmResource.stages`` it submits
one job, ``python -m prx_assets.stage_job STAGE KEY [KEY ...]``, with the resources' settings
(:func:`stage_resources`);
the job runs the partitions one after another (a model loads once) and reports each result
back as a Pipes message. Either way the asset builds the same metadata and data version from
the result, so a partition run on the cluster equals the in-process one.
"""

import dataclasses
import hashlib
from typing import Any

import dagster as dg

from prx_assets.core.jobs.render import job_name_for
from prx_assets.core.stages import STAGES, load_stage
from prx_assets.core.stages.settings import StageResources
from prx_assets.resources.models import CaptionerResource, EmbedderResource
from prx_assets.resources.pipes_slurm import PipesSlurmClient
from prx_assets.resources.s3 import PrxS3Resource as S3Resource
from prx_assets.resources.slurm import SlurmResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

STAGE_MODULE = "prx_assets.stage_job"


def stage_resources(storage: StorageResource, project: ProjectConfigResource, s3: S3Resource | None = None,
                    captioner: CaptionerResource | None = None,
                    embedder: EmbedderResource | None = None) -> StageResources:
    """The settings a stage runs with, from the run's resources."""
    return StageResources(storage=storage.settings(), project=project.settings(),
                          s3=s3.settings() if s3 is not None else None,
                          captioner=captioner.settings() if captioner is not None else None,
                          embedder=embedder.settings() if embedder is not None else None)


def result_from_dict(result_type: type, data: dict[str, Any]) -> Any:
    """Rebuild a result dataclass from its JSON form (unknown keys are an error)."""
    names = {f.name for f in dataclasses.fields(result_type)}
    unknown = set(data) - names
    if unknown:
        raise dg.Failure(f"stage job returned unknown fields {sorted(unknown)} for {result_type.__name__}; "
                         "the job ran a different code version than the Dagster process")
    return result_type(**data)


def run_stage(context: dg.AssetExecutionContext, slurm: SlurmResource, stage: str, partition_key: str,
              resources: StageResources) -> Any:
    """Run one partition of ``stage`` in-process or as a job, per ``slurm.stages``."""
    return run_stages(context, slurm, stage, [partition_key], resources)[partition_key]


def run_stages(context: dg.AssetExecutionContext, slurm: SlurmResource, stage: str, partition_keys: list[str],
               resources: StageResources) -> dict[str, Any]:
    """Run partitions of ``stage`` one after another, in-process or as one job (per ``slurm.stages``):
    either way in one process, so a model loads once for all of them; a result per partition."""
    if stage not in STAGES:
        raise dg.Failure(f"unknown stage {stage!r}; stages: {', '.join(sorted(STAGES))}")
    fn, result_type = load_stage(stage)
    if stage not in slurm.stages:
        return {pk: fn(resources, pk, context.log.info) for pk in partition_keys}
    payload = resources.to_json()
    first = partition_keys[0]
    name_parts = [stage, first] if len(partition_keys) == 1 else [stage, first, f"and-{len(partition_keys) - 1}"]
    invocation = PipesSlurmClient(slurm).run(
        context=context, module=STAGE_MODULE, args=[stage, *partition_keys, "--resources", payload],
        job_name=job_name_for(*name_parts), extras={"stage": stage, "partition_keys": list(partition_keys)},
        work_key=hashlib.sha256("\0".join([stage, *partition_keys, payload]).encode()).hexdigest()[:16])
    results = {m["key"]: m["result"] for m in invocation.get_custom_messages()
               if isinstance(m, dict) and "result" in m and "key" in m}
    missing = [pk for pk in partition_keys if pk not in results]
    if missing:
        raise dg.Failure(f"{stage} job {invocation.metadata.get('job_id')} finished without reporting a result for "
                         f"{missing[:5]}{' ...' if len(missing) > 5 else ''}; see its log")
    context.log.info(f"{stage} {first}{' ...' if len(partition_keys) > 1 else ''} ran as job "
                     f"{invocation.metadata.get('job_id')} ({len(partition_keys)} partitions, one process)")
    return {pk: result_from_dict(result_type, results[pk]) for pk in partition_keys}
