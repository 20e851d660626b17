"""Pipeline stages that can run in-process (default) or as SLURM jobs through Pipes.

A stage is a function ``(StageResources, partition_key, log) -> result dataclass``, the whole
work of one partition of ``raw_images``, ``recaptions`` or ``image_embeddings``. The asset
calls :func:`run_stage` (or :func:`run_stages` for a run over several partitions): in-process
it calls the function directly; when the stage is listed in ``SlurmResource.stages`` it submits
one job, ``python -m prx_assets.stage_job STAGE KEY [KEY ...]``, with the resources' settings;
the job runs the partitions one after another (a model loads once) and reports each result
back as a Pipes message. Either way the asset builds the same metadata and data version from
the result, so a partition run on the cluster equals the in-process one.
"""

import dataclasses
import hashlib
import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg

from prx_assets.core.config.project import config_dir, data_root
from prx_assets.core.jobs.render import job_name_for
from prx_assets.resources.models import CaptionerResource, EmbedderResource
from prx_assets.resources.s3 import PrxS3Resource as S3Resource
from prx_assets.resources.slurm import SlurmResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

STAGE_MODULE = "prx_assets.stage_job"
_SECRET = re.compile(r"secret|access_key|session_token|password|token", re.IGNORECASE)


@dataclass
class StageResources:
    """What a stage needs, in a form that travels to a job as JSON."""

    storage: StorageResource
    project: ProjectConfigResource
    s3: S3Resource | None = None
    captioner: CaptionerResource | None = None
    embedder: EmbedderResource | None = None

    def to_json(self) -> str:
        """Settings of each resource (data root and config folder resolved now); no secrets:
        object-store credentials reach the job through its environment."""
        def fields(res: Any) -> dict[str, Any] | None:
            if res is None:
                return None
            out = {k: getattr(res, k) for k in type(res).model_fields if not _SECRET.search(k)}
            return {k: v for k, v in out.items() if isinstance(v, (str, int, float, bool, list, type(None)))}

        return json.dumps({
            "storage": {"data_root": self.storage.data_root or data_root()},
            "project": {"config_dir": self.project.config_dir or str(config_dir())},
            "s3": fields(self.s3),
            "captioner": fields(self.captioner),
            "embedder": fields(self.embedder),
        })

    @classmethod
    def from_json(cls, text: str) -> "StageResources":
        """Rebuild the resources inside a job."""
        d = json.loads(text)
        return cls(storage=StorageResource(**d["storage"]), project=ProjectConfigResource(**d["project"]),
                   s3=S3Resource(**{k: v for k, v in d["s3"].items() if v is not None})
                   if d.get("s3") is not None else None,
                   captioner=CaptionerResource(**d["captioner"]) if d.get("captioner") else None,
                   embedder=EmbedderResource(**d["embedder"]) if d.get("embedder") else None)


StageFn = Callable[[StageResources, str, Callable[[str], None]], Any]
STAGES: dict[str, tuple[StageFn, type]] = {}
#: The module that registers each stage: a job imports only that one (not every definition).
STAGE_HOMES = {"raw_images": "prx_assets.defs.ingest", "recaptions": "prx_assets.defs.enrichment",
               "image_embeddings": "prx_assets.defs.enrichment"}


def load_stage(name: str) -> tuple[StageFn, type]:
    """The function and result type of stage ``name``, importing its home module if needed."""
    if name not in STAGES:
        if name not in STAGE_HOMES:
            raise dg.Failure(f"unknown stage {name!r}; stages: {', '.join(sorted(STAGE_HOMES))}")
        importlib.import_module(STAGE_HOMES[name])
    return STAGES[name]


def register_stage(name: str, fn: StageFn, result_type: type) -> None:
    """Make ``fn`` runnable as stage ``name`` (in-process or in a job)."""
    STAGES[name] = (fn, result_type)


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
    fn, result_type = STAGES[stage]
    if stage not in slurm.stages:
        return {pk: fn(resources, pk, context.log.info) for pk in partition_keys}
    payload = resources.to_json()
    first = partition_keys[0]
    name_parts = [stage, first] if len(partition_keys) == 1 else [stage, first, f"and-{len(partition_keys) - 1}"]
    invocation = slurm.pipes_client().run(
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
