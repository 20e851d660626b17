"""A local ``dagster dev`` (webserver + daemon + code server) for tests, benchmarks and scripts.

``dagster dev`` started from a script ignores SIGINT, so it is started in its own process
group and stopped by group.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dagster_dev(cwd: str | os.PathLike[str], log_path: str | os.PathLike[str],
                env: Mapping[str, str] | None = None, module: str = "prx_assets.definitions",
                timeout: float = 180) -> Iterator[int]:
    """Run ``dagster dev -m MODULE`` on a free loopback port until ``/server_info`` answers; yield the port."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-m", module,
                                 "-h", "127.0.0.1", "-p", str(port)], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
        try:
            deadline = time.time() + timeout
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"dagster dev did not come up on port {port}; see {log_path}")
                time.sleep(1)
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def graphql(port: int, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """POST a GraphQL query to a local webserver; raises ``RuntimeError`` with GraphQL errors."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", method="POST",
                                 data=json.dumps({"query": query, "variables": dict(variables or {})}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    if "errors" in out:
        raise RuntimeError(out["errors"])
    return out["data"]
