"""The ``slurm`` resource: cluster settings and the shared folder for job files.

``mode``: ``slurm`` submits with ``sbatch``; ``local`` runs the same rendered script with
``bash`` as a subprocess (no cluster needed); ``auto`` picks ``slurm`` when ``sinfo``
answers. The pieces live apart: the pure renderer in :mod:`prx_assets.core.jobs.render`,
SLURM output parsers in :mod:`prx_assets.core.jobs.parse`, the executors in
:mod:`prx_assets.core.jobs.executors`, and the Pipes client in
:mod:`prx_assets.resources.pipes_slurm`.
"""

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg
from pydantic import Field

from prx_assets.core import layout
from prx_assets.core.config.project import data_root
from prx_assets.core.jobs.executors import Executor, cluster_up, executor_for
from prx_assets.core.jobs.render import DEFAULT_TEMPLATE, JobSpec
from prx_assets.errors import SlurmError

# Environment passed to jobs by name when set (never secrets: those reach jobs through the
# cluster's own environment / --export, not through a script written to disk).
PASSTHROUGH_ENV = ("PRX_DATA_ROOT", "PRX_CONFIG_DIR", "PRX_CAPTIONER_MODEL", "PRX_EMBEDDER_MODEL",
                   "PRX_TEXT_ENCODER_MODEL", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                   "HF_HUB_OFFLINE", "HF_HOME", "TRANSFORMERS_OFFLINE", "PRX_CAPTION_SERVER_URL",
                   "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST")


class SlurmResource(dg.ConfigurableResource):
    """Where and how jobs run: the cluster settings and the shared folder for job files."""

    mode: str = Field(default="auto", description="slurm (sbatch), local (same script, bash subprocess), "
                                                  "or auto (slurm when `sinfo` answers)")
    partition: str | None = Field(default=None, description="#SBATCH --partition")
    account: str | None = Field(default=None, description="#SBATCH --account")
    time: str | None = Field(default=None, description="#SBATCH --time, e.g. 04:00:00")
    mem: str | None = Field(default=None, description="#SBATCH --mem, e.g. 64G")
    nodes: int = Field(default=1, description="Nodes for training jobs (torchrun over srun when > 1).")
    gpus_per_node: int = Field(default=0, description="GPUs per node for training jobs (one rank per GPU).")
    cpus_per_task: int = Field(default=1, description="CPUs per node task.")
    extra_directives: list[str] = Field(default_factory=list, description="More #SBATCH flags: --flag=value")
    env_setup: list[str] = Field(default_factory=list, description="Shell lines run first in every job "
                                                                   "(module load ..., source venv/bin/activate)")
    python: str | None = Field(default=None, description="Python in the job (default: this interpreter).")
    template: str | None = Field(default=None, description="Job script template (default: prx_assets/templates/train.sbatch).")
    shared_dir: str | None = Field(
        default=None, description="Folder visible to Dagster and every node, for job scripts, logs and Pipes "
                                  "files (default $PRX_SLURM_SHARED_DIR, else <PRX_DATA_ROOT>/slurm for a local "
                                  "data root, else ./.slurm_jobs)")
    poll_seconds: float = Field(default=1.0, description="How often a job's state is polled.")
    stage_gpus_per_node: int = Field(default=0, description="GPUs for stage jobs (recaptions and image_embeddings "
                                                              "on GPU nodes: 1).")
    caption_server: str | None = Field(
        default=None, description="Command that starts an OpenAI-compatible server in each recaptions job, {port} "
                                  "for its port, e.g. 'vllm serve Qwen/Qwen3-VL-8B-Instruct --port {port}'. The job "
                                  "waits for its /health, captioners with backend openai use it, and it stops "
                                  "when the job ends.")
    caption_server_ready_s: int = Field(default=1800, description="How long a job waits for its caption server.")
    stages: list[str] = Field(
        default_factory=list, description="Pipeline stages whose partitions run as jobs instead of in-process: "
                                          "any of raw_images, recaptions, image_embeddings")

    # --- where things go -------------------------------------------------------------------
    def jobs_dir(self) -> Path:
        """The shared folder for job files."""
        chosen = self.shared_dir or os.environ.get("PRX_SLURM_SHARED_DIR")
        if not chosen:
            root = data_root()
            chosen = os.path.join(root, layout.SLURM_DIR) if "://" not in root else ".slurm_jobs"
        path = Path(chosen).absolute()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def template_text(self) -> str:
        """The job script template."""
        path = Path(self.template) if self.template else DEFAULT_TEMPLATE
        try:
            return path.read_text()
        except OSError as e:
            raise SlurmError(f"job template {path} cannot be read ({e}); set SlurmResource.template") from e

    # --- cluster ----------------------------------------------------------------------------
    def cluster_up(self) -> bool:
        """Whether ``sinfo`` answers with at least one usable node."""
        return cluster_up()

    def effective_mode(self) -> str:
        """``slurm`` or ``local`` (``auto`` resolved)."""
        if self.mode not in ("auto", "slurm", "local"):
            raise SlurmError(f"SlurmResource.mode {self.mode!r} is not one of auto, slurm, local")
        if self.mode == "auto":
            return "slurm" if self.cluster_up() else "local"
        return self.mode

    def executor(self, mode: str | None = None) -> Executor:
        """The executor for ``mode`` (default: the effective mode)."""
        return executor_for(mode or self.effective_mode())

    def job_spec(self, *, job_name: str, module: str, args: Sequence[str], script_dir: Path,
                 exports: Mapping[str, str], training: bool, stage: str | None = None) -> JobSpec:
        """The JobSpec of a job with this resource's settings (stages: 1 node, ``stage_gpus_per_node``
        GPUs; a ``recaptions`` job starts ``caption_server`` when set)."""
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if os.environ.get(k)}
        env.update(exports)
        return JobSpec(
            job_name=job_name, log_path=str(script_dir / "job.log"), workdir=str(Path.cwd()),
            module=module, args=tuple(args), python=self.python or sys.executable,
            nodes=self.nodes if training else 1,
            gpus_per_node=self.gpus_per_node if training else self.stage_gpus_per_node,
            cpus_per_task=self.cpus_per_task, time=self.time, partition=self.partition, account=self.account,
            mem=self.mem, extra_directives=tuple(self.extra_directives), env_setup=tuple(self.env_setup),
            exports=tuple(sorted(env.items())),
            server_command=self.caption_server if stage == "recaptions" else None,
            server_ready_s=self.caption_server_ready_s,
        )
