"""SLURM: the only place that calls ``sbatch``/``squeue``/``sacct``/``scontrol``/``scancel``.

- :func:`render_sbatch` turns ``slurm/train.sbatch`` (a template) and a :class:`JobSpec` into a
  job script. It is pure and tested against a golden file. ``#SBATCH`` values must be single
  safe tokens (they cannot be shell-quoted), every exported value and command word is
  quoted with :func:`shlex.quote`, and job names derived from data are sanitised.
- :class:`SlurmResource` holds the cluster settings (partition, account, time, nodes, GPUs,
  environment setup, the shared folder for job files) and submits, polls and cancels jobs.
  ``mode``: ``slurm`` submits with ``sbatch``; ``local`` runs the same rendered script with
  ``bash`` as a subprocess (no cluster needed); ``auto`` picks ``slurm`` when ``sinfo``
  answers.
- :class:`PipesSlurmClient` runs a Python module as a job inside a Dagster Pipes session
  (file context injector + file message reader in the shared folder), so the job's logs,
  metadata and materialization stream back into the Dagster run. A failed, cancelled or
  timed-out job fails the step with the tail of the job log; interrupting the step (run
  termination) cancels the job.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from prx_assets.core import layout
from prx_assets.core.config.project import data_root
from prx_assets.errors import PrxError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TEMPLATE = REPO_ROOT / "slurm" / "train.sbatch"
_SAFE_DIRECTIVE = re.compile(r"^[A-Za-z0-9_.:/@%=,+\-\[\]]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
TERMINAL_OK = {"COMPLETED"}
TERMINAL_BAD = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
# Environment passed to jobs by name when set (never secrets: those reach jobs through the
# cluster's own environment / --export, not through a script written to disk).
PASSTHROUGH_ENV = ("PRX_DATA_ROOT", "PRX_CONFIG_DIR", "PRX_CAPTIONER_MODEL", "PRX_EMBEDDER_MODEL",
                   "PRX_TEXT_ENCODER_MODEL", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                   "HF_HUB_OFFLINE", "HF_HOME", "TRANSFORMERS_OFFLINE")


class SlurmError(PrxError):
    """A job cannot be rendered, submitted or followed."""


@dataclass(frozen=True)
class JobSpec:
    """Everything a job script needs; values from config or data are validated/quoted on render."""

    job_name: str
    log_path: str
    workdir: str
    module: str
    args: tuple[str, ...] = ()
    python: str = "python"
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    mem: str | None = None
    extra_directives: tuple[str, ...] = ()
    env_setup: tuple[str, ...] = ()
    exports: tuple[tuple[str, str], ...] = ()
    procs_per_node: int | None = None  # default: GPUs per node, at least 1
    rdzv_port: int = 29500

    @property
    def ranks_per_node(self) -> int:
        """Processes started on each node (one per GPU unless set)."""
        return self.procs_per_node or max(1, self.gpus_per_node)


def job_name_for(*parts: str) -> str:
    """A SLURM-safe job name from data (``prx-train-demo_mix``): other characters become ``_``."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", "-".join(["prx", *parts]))[:120]


def _directive(flag: str, value: Any) -> str:
    text = str(value)
    if not _SAFE_DIRECTIVE.match(text):
        raise SlurmError(f"#SBATCH --{flag} value {text!r} contains characters that cannot be passed safely "
                         "(spaces, quotes, newlines, shell syntax); use a plain token such as 'gpu', '04:00:00', "
                         "'/shared/logs/%j.out'")
    return f"#SBATCH --{flag}={text}"


def _launch(spec: JobSpec) -> str:
    words = [spec.python, "-m", spec.module, *spec.args]
    if spec.nodes == 1 and spec.ranks_per_node == 1:
        return " ".join(shlex.quote(w) for w in words)
    torchrun = [spec.python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
                f"--nproc-per-node={spec.ranks_per_node}", "--rdzv-backend=c10d",
                "--rdzv-id=${SLURM_JOB_ID:-local}", "--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}",
                "-m", spec.module, *spec.args]
    quoted = [w if "${" in w else shlex.quote(w) for w in torchrun]  # only our own ${...} stay unquoted
    srun = "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " if spec.nodes > 1 else ""
    return srun + " ".join(quoted)


def render_sbatch(template: str, spec: JobSpec) -> str:
    """Render a job script from ``template`` (``{{ name }}`` placeholders) and ``spec``.

    Raises :class:`SlurmError` for a placeholder the renderer doesn't know, an unsafe
    ``#SBATCH`` value or an invalid environment variable name.
    """
    if spec.nodes < 1 or spec.gpus_per_node < 0 or spec.cpus_per_task < 1:
        raise SlurmError(f"nodes={spec.nodes}, gpus_per_node={spec.gpus_per_node}, "
                         f"cpus_per_task={spec.cpus_per_task}: need nodes >= 1, GPUs >= 0, CPUs >= 1")
    directives = [_directive("job-name", spec.job_name), _directive("output", spec.log_path),
                  _directive("nodes", spec.nodes), "#SBATCH --ntasks-per-node=1",
                  _directive("cpus-per-task", spec.cpus_per_task)]
    if spec.gpus_per_node:
        directives.append(_directive("gpus-per-node", spec.gpus_per_node))
    for flag, value in (("time", spec.time), ("partition", spec.partition), ("account", spec.account),
                        ("mem", spec.mem)):
        if value:
            directives.append(_directive(flag, value))
    for extra in spec.extra_directives:
        flag, _, value = extra.lstrip("-").partition("=")
        if not re.match(r"^[a-z][a-z\-]*$", flag) or not value:
            raise SlurmError(f"extra directive {extra!r} is not of the form --flag=value")
        directives.append(_directive(flag, value))
    exports = []
    for name, value in spec.exports:
        if not _ENV_NAME.match(name):
            raise SlurmError(f"environment variable name {name!r} is invalid; use letters, digits and _")
        exports.append(f"export {name}={shlex.quote(value)}")
    values = {
        "sbatch_directives": "\n".join(directives),
        "env_setup": "\n".join(spec.env_setup) or ":",
        "exports": "\n".join(exports) or ":",
        "workdir": shlex.quote(spec.workdir),
        "launch": _launch(spec),
        "job_name": shlex.quote(spec.job_name),
    }

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise SlurmError(f"template placeholder {{{{ {m.group(1)} }}}} is unknown; known: {sorted(values)}")
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, template)


@dataclass
class JobStatus:
    """A job's state as SLURM (or the local runner) reports it."""

    job_id: str
    state: str
    exit_code: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        """Finished, successfully or not."""
        return self.state in TERMINAL_OK or self.failed

    @property
    def failed(self) -> bool:
        """Finished unsuccessfully (failed, cancelled, timed out, out of memory, ...)."""
        return self.state.split()[0] in TERMINAL_BAD if self.state else False


def _run(cmd: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise SlurmError(f"{cmd[0]} not found: install the SLURM client tools (or run `make slurm-up` "
                         "for a local cluster), or set SlurmResource.mode to 'local'") from e


def log_tail(path: str | os.PathLike[str], lines: int = 40) -> str:
    """The last ``lines`` lines of a job log ('' when it doesn't exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


_LOCAL_JOBS: dict[str, subprocess.Popen[bytes]] = {}  # local-mode jobs of this process
# open_pipes_session touches a preview API internally; the file message reader has one writer.
warnings.filterwarnings("ignore", message=".*expected_writer_count.*", category=dg.PreviewWarning)


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
    template: str | None = Field(default=None, description="Job script template (default slurm/train.sbatch).")
    shared_dir: str | None = Field(
        default=None, description="Folder visible to Dagster and every node, for job scripts, logs and Pipes "
                                  "files (default $PRX_SLURM_SHARED_DIR, else <PRX_DATA_ROOT>/slurm for a local "
                                  "data root, else ./.slurm_jobs)")
    poll_seconds: float = Field(default=1.0, description="How often a job's state is polled.")
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
        if shutil.which("sinfo") is None:
            return False
        try:
            out = _run(["sinfo", "-h", "-o", "%t"], timeout=10)
        except (SlurmError, subprocess.TimeoutExpired):
            return False
        return out.returncode == 0 and any(s.strip().rstrip("*").startswith(("idle", "mix", "alloc"))
                                           for s in out.stdout.split())

    def effective_mode(self) -> str:
        """``slurm`` or ``local`` (``auto`` resolved)."""
        if self.mode not in ("auto", "slurm", "local"):
            raise SlurmError(f"SlurmResource.mode {self.mode!r} is not one of auto, slurm, local")
        if self.mode == "auto":
            return "slurm" if self.cluster_up() else "local"
        return self.mode

    def submit(self, script: Path, mode: str) -> str:
        """Submit a rendered script; returns the job id (``local-<pid>`` in local mode)."""
        if mode == "local":
            log = open(self._log_of(script), "ab")  # noqa: SIM115 - handed to the child
            proc = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=script.parent)
            log.close()
            job_id = f"local-{proc.pid}"
            _LOCAL_JOBS[job_id] = proc
            return job_id
        out = _run(["sbatch", "--parsable", str(script)])
        if out.returncode != 0:
            raise SlurmError(f"sbatch {script} failed: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout.strip().split(";")[0]

    @staticmethod
    def _log_of(script: Path) -> Path:
        return script.with_suffix(".log")

    def status(self, job_id: str) -> JobStatus:
        """Current state: ``scontrol show job`` while SLURM remembers the job, then ``sacct``."""
        if job_id.startswith("local-"):
            proc = _LOCAL_JOBS[job_id]
            rc = proc.poll()
            if rc is None:
                return JobStatus(job_id, "RUNNING")
            state = "COMPLETED" if rc == 0 else ("CANCELLED" if rc < 0 else "FAILED")
            return JobStatus(job_id, state, f"{rc}:0")
        out = _run(["scontrol", "show", "job", "-o", job_id])
        if out.returncode == 0 and "JobState=" in out.stdout:
            fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
            reason = fields.get("Reason", "")
            return JobStatus(job_id, fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", ""),
                             "" if reason == "None" else reason)
        acct = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "--format=JobID,State,ExitCode"])
        for line in acct.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] == job_id:
                return JobStatus(job_id, parts[1].split()[0], parts[2])
        return JobStatus(job_id, "UNKNOWN", reason=(out.stderr or acct.stderr).strip())

    def queue(self) -> list[dict[str, str]]:
        """Jobs SLURM has queued or running (``squeue``): id, name, state."""
        out = _run(["squeue", "-h", "-o", "%i|%j|%T"])
        if out.returncode != 0:
            raise SlurmError(f"squeue failed: {out.stderr.strip()}")
        return [dict(zip(("job_id", "name", "state"), line.split("|"), strict=False))
                for line in out.stdout.splitlines() if line.strip()]

    def cancel(self, job_id: str) -> None:
        """Cancel a job (``scancel``; SIGTERM to the process group in local mode)."""
        if job_id.startswith("local-"):
            proc = _LOCAL_JOBS[job_id]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        out = _run(["scancel", job_id])
        if out.returncode != 0:
            raise SlurmError(f"scancel {job_id} failed: {out.stderr.strip()}")

    def job_spec(self, *, job_name: str, module: str, args: Sequence[str], script_dir: Path,
                 exports: Mapping[str, str], training: bool) -> JobSpec:
        """The JobSpec of a job with this resource's settings (stages: 1 node, no GPUs unless set)."""
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if os.environ.get(k)}
        env.update(exports)
        return JobSpec(
            job_name=job_name, log_path=str(script_dir / "job.log"), workdir=str(Path.cwd()),
            module=module, args=tuple(args), python=self.python or sys.executable,
            nodes=self.nodes if training else 1, gpus_per_node=self.gpus_per_node if training else 0,
            cpus_per_task=self.cpus_per_task, time=self.time, partition=self.partition, account=self.account,
            mem=self.mem, extra_directives=tuple(self.extra_directives), env_setup=tuple(self.env_setup),
            exports=tuple(sorted(env.items())),
        )

    def pipes_client(self) -> "PipesSlurmClient":
        """A Pipes client bound to these settings."""
        return PipesSlurmClient(self)


class PipesSlurmClient(dg.PipesClient):
    """Runs ``python -m MODULE ARGS`` as a SLURM (or local) job inside a Dagster Pipes session."""

    def __init__(self, slurm: SlurmResource) -> None:
        self.slurm = slurm

    def run(self, *, context: dg.AssetExecutionContext | dg.OpExecutionContext, module: str,  # type: ignore[override]
            args: Sequence[str] = (), job_name: str, extras: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None, training: bool = False) -> dg.PipesClientCompletedInvocation:
        """Submit, follow and collect one job; raises ``dg.Failure`` with the log tail if it fails."""
        mode = self.slurm.effective_mode()
        job_dir = self.slurm.jobs_dir() / f"{job_name}-{uuid.uuid4().hex[:8]}"
        job_dir.mkdir(parents=True)
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesFileContextInjector(str(job_dir / "pipes_context.json")),
            message_reader=dg.PipesFileMessageReader(str(job_dir / "pipes_messages.jsonl"), cleanup_file=False),
            extras=dict(extras or {}),
        ) as session:
            exports = {**(env or {}), **session.get_bootstrap_env_vars()}
            spec = self.slurm.job_spec(job_name=job_name, module=module, args=args, script_dir=job_dir,
                                       exports=exports, training=training)
            script = job_dir / "job.sbatch"
            script.write_text(render_sbatch(self.slurm.template_text(), spec))
            job_id = self.slurm.submit(script, mode)
            log_path = Path(spec.log_path)
            context.log.info(f"submitted {job_name} as {mode} job {job_id}; script {script}, log {log_path}")
            status = self._follow(context, job_id)
            if status.state != "COMPLETED":
                tail = log_tail(log_path)
                raise dg.Failure(
                    description=f"{mode} job {job_id} ({job_name}) ended {status.state} "
                                f"(exit {status.exit_code or '?'}{', ' + status.reason if status.reason else ''})."
                                f" Last lines of {log_path}:\n{tail}",
                    metadata={"job_id": job_id, "state": status.state, "log": dg.MetadataValue.path(str(log_path)),
                              "log_tail": dg.MetadataValue.text(tail)},
                )
            context.log.info(f"job {job_id} COMPLETED")
        return dg.PipesClientCompletedInvocation(session, metadata={"job_id": job_id, "job_mode": mode})

    def _follow(self, context: Any, job_id: str) -> JobStatus:
        last = ""
        unknown_since: float | None = None
        try:
            while True:
                st = self.slurm.status(job_id)
                if st.state != last:
                    context.log.info(f"job {job_id}: {st.state}{' (' + st.reason + ')' if st.reason else ''}")
                    last = st.state
                if st.done:
                    return st
                if st.state == "UNKNOWN":  # e.g. sacct not yet aware of a just-finished job
                    unknown_since = unknown_since or time.monotonic()
                    if time.monotonic() - unknown_since > 120:
                        return st
                else:
                    unknown_since = None
                time.sleep(self.slurm.poll_seconds)
        except BaseException:  # run terminated (DagsterExecutionInterruptedError), KeyboardInterrupt, ...
            context.log.warning(f"interrupted: cancelling job {job_id}")
            self.slurm.cancel(job_id)
            raise
