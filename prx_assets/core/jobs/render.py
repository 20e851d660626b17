"""The job script: a pure renderer from a template and a :class:`JobSpec`, tested against a golden file.

``#SBATCH`` values must be single safe tokens (they cannot be shell-quoted); every exported
value and command word is quoted with :func:`shlex.quote`; job names derived from data are
sanitised. The default template ships inside the package (``prx_assets/templates``).
"""

from __future__ import annotations

import importlib.resources
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prx_assets.errors import SlurmError

#: The job script template, shipped inside the package (a wheel install finds it too).
DEFAULT_TEMPLATE = Path(str(importlib.resources.files("prx_assets") / "templates" / "train.sbatch"))
_SAFE_DIRECTIVE = re.compile(r"^[A-Za-z0-9_.:/@%=,+\-\[\]]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


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
    #: A shell command that starts an OpenAI-compatible caption server, ``{port}`` for its port
    #: (see :func:`server_block`); ``None``: no server.
    server_command: str | None = None
    server_ready_s: int = 1800

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


def _threads(spec: JobSpec) -> str:
    """CPU threads per process (OpenMP, hence torch's intra-op pool): the task's CPUs shared by the
    ranks on its node, not every core of a node other jobs also run on. An operator's own
    ``OMP_NUM_THREADS`` (env_setup, exports) wins."""
    per_rank = max(1, spec.cpus_per_task // spec.ranks_per_node)
    return f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{per_rank}}}\n"


def _launch(spec: JobSpec) -> str:
    words = [spec.python, "-m", spec.module, *spec.args]
    if spec.nodes == 1 and spec.ranks_per_node == 1:
        return _threads(spec) + " ".join(shlex.quote(w) for w in words)
    torchrun = [spec.python, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
                f"--nproc-per-node={spec.ranks_per_node}", "--rdzv-backend=c10d",
                "--rdzv-id=${SLURM_JOB_ID:-local}", "--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}",
                "-m", spec.module, *spec.args]
    quoted = [w if "${" in w else shlex.quote(w) for w in torchrun]  # only our own ${...} stay unquoted
    srun = "srun --ntasks-per-node=1 --kill-on-bad-exit=1 " if spec.nodes > 1 else ""
    return _threads(spec) + srun + " ".join(quoted)


def server_block(spec: JobSpec) -> str:
    """Shell lines that start ``spec.server_command`` on a free loopback port in the background, stop
    it when the job exits, wait up to ``server_ready_s`` for its ``/health`` (failing with the server
    log's tail if it exits first or never answers) and export ``PRX_JOB_CAPTION_SERVER_URL`` for the
    openai backend. The command is an operator's setting (like ``env_setup``), run as written."""
    if not spec.server_command:
        return ":"
    if "{port}" not in spec.server_command:
        raise SlurmError(f"caption server command {spec.server_command!r} has no {{port}}; write e.g. "
                         "'vllm serve Qwen/Qwen3-VL-8B-Instruct --port {port}'")
    py = shlex.quote(spec.python)
    command = spec.server_command.replace("{port}", '"$PRX_SERVER_PORT"')
    log = shlex.quote(str(Path(spec.log_path).with_name("server.log")))
    probe = ("import sys, urllib.request; urllib.request.urlopen("
             "f'http://127.0.0.1:{sys.argv[1]}/health', timeout=5)")
    return "\n".join([
        "# --- caption server (SlurmResource.caption_server): started here, checked ready, stopped at exit ---",
        f"PRX_SERVER_PORT=$({py} -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
        "print(s.getsockname()[1])')",
        f"PRX_SERVER_LOG={log}",
        "set -m  # the server gets its own process group, so the exit trap stops all of it",
        f"( {command} ) > \"$PRX_SERVER_LOG\" 2>&1 &",
        "PRX_SERVER_PID=$!",
        "set +m",
        "trap 'kill -- -\"$PRX_SERVER_PID\" 2>/dev/null || true; wait \"$PRX_SERVER_PID\" 2>/dev/null || true' EXIT",
        f"PRX_SERVER_DEADLINE=$((SECONDS + {int(spec.server_ready_s)}))",
        f"until {py} -c {shlex.quote(probe)} \"$PRX_SERVER_PORT\" 2>/dev/null; do",
        "  if ! kill -0 \"$PRX_SERVER_PID\" 2>/dev/null; then",
        "    echo \"caption server exited before it was ready; last lines of $PRX_SERVER_LOG:\" >&2",
        "    tail -n 40 \"$PRX_SERVER_LOG\" >&2; exit 1",
        "  fi",
        "  if [ \"$SECONDS\" -ge \"$PRX_SERVER_DEADLINE\" ]; then",
        f"    echo \"caption server not ready after {int(spec.server_ready_s)} s (SlurmResource.caption_server_ready_s); "
        "last lines of $PRX_SERVER_LOG:\" >&2",
        "    tail -n 40 \"$PRX_SERVER_LOG\" >&2; exit 1",
        "  fi",
        "  sleep 2",
        "done",
        "echo \"caption server ready on port $PRX_SERVER_PORT after ${SECONDS} s\"",
        "export PRX_JOB_CAPTION_SERVER_URL=\"http://127.0.0.1:${PRX_SERVER_PORT}/v1\"",
    ])


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
        "server": server_block(spec),
    }
    if spec.server_command and not re.search(r"\{\{\s*server\s*\}\}", template):
        raise SlurmError("SlurmResource.caption_server is set but the job template has no {{ server }} "
                         "placeholder; add it before {{ launch }} (see prx_assets/templates/train.sbatch)")

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise SlurmError(f"template placeholder {{{{ {m.group(1)} }}}} is unknown; known: {sorted(values)}")
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, template)
