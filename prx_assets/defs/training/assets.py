"""training_run: a SLURM (or local) training job per mixture version, and the sensor that launches it."""

import json
import shlex
from typing import Any

import dagster as dg
from pydantic import Field

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.jobs.render import job_name_for
from prx_assets.defs.keys import TRAINING_RUN, group
from prx_assets.defs.mixture import training_mixture
from prx_assets.infra.partitions import mixture_partitions
from prx_assets.infra.staleness import (
    FINGERPRINT_KEY,
    FingerprintContext,
    digest,
    latest_materialization,
)
from prx_assets.resources.pipes_slurm import PipesSlurmClient, plain, reported_result
from prx_assets.resources.slurm import SlurmResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource
from prx_assets.training.args import DEFAULTS, TrainerArgs

TRAINING_CODE_VERSION = "train-1"


TRAINER_MODULE = "prx_assets.training.train"


class TrainingConfig(dg.Config):
    """Trainer settings for one run (the model and data come from the mixture and models.yaml)."""

    steps: int = Field(default=DEFAULTS.steps, description="Optimizer steps.")
    batch_size: int = Field(default=DEFAULTS.batch_size, description="Samples per batch per rank (one aspect bucket per batch).")
    resolution: int = Field(default=DEFAULTS.resolution, description="Side of a square bucket in pixels (others keep the area).")
    dim: int = Field(default=DEFAULTS.dim, description="Transformer width.")
    depth: int = Field(default=DEFAULTS.depth, description="Transformer blocks.")
    heads: int = Field(default=DEFAULTS.heads, description="Attention heads.")
    lr: float = Field(default=DEFAULTS.lr, description="AdamW learning rate.")
    seed: int = Field(default=DEFAULTS.seed, description="Seed (model init, shuffling, caption choice).")
    workers: int = Field(default=DEFAULTS.workers, description="DataLoader workers per rank.")
    precomputed_latents: bool = Field(
        default=False, description="Read text latents from the shards (written by mds_shards with "
                                   "precomputed_latents) instead of encoding captions on the fly.")
    checkpoint_every: int = Field(default=DEFAULTS.checkpoint_every, description="Checkpoint every N steps (0: only the final one).")
    precision: str = Field(default=DEFAULTS.precision, description="auto (bf16 autocast on CUDA, fp32 on CPU), bf16 "
                                                                   "or fp32 (TF32 on CUDA).")
    compile: bool = Field(default=DEFAULTS.compile, description="torch.compile the transformer.")
    peak_tflops: float = Field(default=DEFAULTS.peak_tflops, description="Peak dense TFLOP/s per GPU for MFU "
                                                                         "(0: known GPUs by name).")
    checkpoint_root: str | None = Field(
        default=None, description="Shared folder for checkpoints (default <data root>/training for a local data "
                                  "root, else <SLURM shared dir>/checkpoints).")
    retrain: bool = Field(
        default=False, description="Train again even when this mixture version was already trained with these "
                                   "settings (by default that run's result is reported, nothing is trained).")


#: Trainer settings that do not change what is trained (left out of the work key).
NOT_WORK = {"retrain", "checkpoint_root"}


def _latest_mixture(instance: dg.DagsterInstance, mixture: str) -> tuple[str, str]:
    mat = latest_materialization(instance, training_mixture.key, mixture)
    if mat is None:
        raise dg.Failure(f"mixture {mixture!r} has no materialization; materialize training_mixture[{mixture}] first")
    version = mat.tags["dagster/data_version"]
    md = mat.metadata.get("spec_uri")
    return version, str(md.value) if md is not None else ""


def training_fingerprint_of(mixture_version: str) -> str:
    """The one formula: code version + the mixture version trained on (a new version means a new run)."""
    return digest(TRAINING_CODE_VERSION, mixture_version)


def training_fingerprint(ctx: FingerprintContext, partition_key: str | None) -> str:
    """The fingerprint a run now would record: of the mixture's current data version."""
    return training_fingerprint_of(ctx.data_version(training_mixture.key, partition_key))




@dg.asset(
    partitions_def=mixture_partitions,
    deps=[training_mixture],
    group_name=group(TRAINING_RUN),
    kinds={"pytorch", "slurm"},
    code_version=TRAINING_CODE_VERSION,
    owners=["team:training"],
    tags={"stage": "train"},
)
def training_run(context: dg.AssetExecutionContext, config: TrainingConfig, storage: StorageResource,
                 project: ProjectConfigResource, slurm: SlurmResource) -> dg.MaterializeResult:
    """A training run on the mixture's current version, as a SLURM job (or a local subprocess).

    The job runs the reference trainer (``prx_assets.training.train``): it streams the
    mixture's shard sets with ``StreamingDataset``, encodes captions on the fly with
    models.yaml's ``text_encoder`` (or reads precomputed latents), trains a small
    flow-matching transformer and writes checkpoints. Logs (loss, samples/s) stream into
    this run through Dagster Pipes; the materialization comes from the job, with data
    version ``<mixture version>-<checkpoint hash>``. Launched by ``training_sensor`` once per
    mixture version; terminating the run cancels the job.
    """
    mixture = context.partition_key
    version, spec_uri = _latest_mixture(context.instance, mixture)
    root = storage.root()
    if not spec_uri:
        spec_uri = root.join(layout.mixture_spec(mixture, version))
    models = project.models()
    tower = models.text_encoder
    if tower is None:
        raise dg.Failure(f"no text_encoder in {models.path}; add text_encoder: {{model: Qwen/Qwen3-VL-2B-Instruct}}")
    base = config.checkpoint_root or (root.join(layout.TRAINING_DIR) if not root.remote else
                                      str(slurm.jobs_dir() / "checkpoints"))
    ckpt_dir = f"{base.rstrip('/')}/{mixture}/{version}/{context.run.run_id[:8]}"
    args = TrainerArgs(
        spec=spec_uri, steps=config.steps, batch_size=config.batch_size, resolution=config.resolution,
        dim=config.dim, depth=config.depth, heads=config.heads, lr=config.lr, seed=config.seed,
        workers=config.workers, checkpoint_dir=ckpt_dir, checkpoint_every=config.checkpoint_every,
        text_tower=tower.tower(), max_text_length=tower.max_length, text_layer=tower.layer,
        precomputed_latents=config.precomputed_latents, precision=config.precision, compile=config.compile,
        peak_tflops=config.peak_tflops,
        text_encoder=None if config.precomputed_latents else tower.model).to_argv()
    context.log.info(f"trainer: python -m {TRAINER_MODULE} {shlex.join(args)}")
    _say_phases(context, spec_uri, config.steps)
    # The work: this mixture version with these trainer settings. A job for it that a killed run left
    # behind is adopted (followed, its results read) rather than trained a second time.
    settings = {k: v for k, v in config.model_dump().items() if k not in NOT_WORK}
    work_key = digest(training_fingerprint_of(version), json.dumps(settings, sort_keys=True, default=str), tower.model)
    earlier = _trained(root, mixture, version, work_key)
    if earlier is not None and not config.retrain:
        context.log.info(f"mixture {mixture} version {version} was already trained with these settings (run "
                         f"{earlier['run_id']}, job {earlier['metadata'].get('job_id')}): reporting that result; "
                         "set retrain: true to train again")
        return dg.MaterializeResult(metadata={**earlier["metadata"], "trained_in_run": earlier["run_id"],
                                              "reused_training": True},
                                    data_version=dg.DataVersion(earlier["data_version"]))
    invocation = PipesSlurmClient(slurm).run(
        context=context, module=TRAINER_MODULE, args=args, job_name=job_name_for("train", mixture),
        extras={"mixture": mixture, "mixture_version": version}, training=True, work_key=work_key,
        record={"checkpoint_dir": ckpt_dir})
    adopted = bool(plain(invocation.metadata.get("adopted")))
    if adopted:  # the adopted job writes where its own run told it to
        ckpt_dir = (plain(invocation.metadata.get("work")) or {}).get("checkpoint_dir", ckpt_dir)
    reported = reported_result(invocation, f"training_run[{mixture}]")
    metadata = {
        **(reported.metadata or {}),
        "job_id": invocation.metadata["job_id"],
        "job_mode": invocation.metadata["job_mode"],
        "adopted_job": adopted,
        "mixture_version": version,
        "spec_uri": dg.MetadataValue.path(spec_uri),
        "checkpoint_dir": dg.MetadataValue.path(ckpt_dir),
        "text_encoder": tower.model,
        "work_key": work_key,
        FINGERPRINT_KEY: dg.MetadataValue.text(training_fingerprint_of(version)),
    }
    if reported.data_version is not None:
        _record_trained(root, mixture, version, work_key, context.run.run_id, metadata, reported.data_version.value)
    return dg.MaterializeResult(metadata=metadata, data_version=reported.data_version)


def _trained(root: DataRoot, mixture: str, version: str, work_key: str) -> dict[str, Any] | None:
    """The record of a finished training run of this mixture version with these settings, if any."""
    rel = layout.training_record(mixture, version, work_key)
    if not root.exists(rel):
        return None
    return json.loads(root.read_bytes(rel))


def _record_trained(root: DataRoot, mixture: str, version: str, work_key: str, run_id: str,
                    metadata: dict[str, Any], data_version: str) -> None:
    """Keep what this training run produced beside the data, so the same work is never trained twice
    (a mixture that goes back to a version already trained, from any path)."""
    plain_md = {k: plain(v) for k, v in metadata.items()}
    doc = {"run_id": run_id, "data_version": data_version,
           "metadata": {k: v for k, v in plain_md.items() if isinstance(v, (str, int, float, bool))}}
    root.write_bytes(layout.training_record(mixture, version, work_key), json.dumps(doc, sort_keys=True).encode())


def _say_phases(context: dg.AssetExecutionContext, spec_uri: str, steps: int) -> None:
    """Log the phases a phased mixture's run trains, and warn when ``steps`` ends it inside one."""
    from prx_assets.core.manifests import read_mixture_spec_at

    spec = read_mixture_spec_at(spec_uri)
    if not spec.phases:
        return
    total = sum(p.steps for p in spec.phases)
    context.log.info("phases: " + ", ".join(f"{p.name} ({p.steps} steps, resolution {p.resolution or 'default'})"
                                            for p in spec.phases))
    if steps < total:
        context.log.warning(f"steps={steps} ends the run before the mixture's phases end ({total} steps): set "
                            f"steps: {total} in the run config to train every phase")
