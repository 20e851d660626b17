"""One epoch of the loader on N ranks over loopback, as ``torchrun`` would start them.

``run_ranks(world, workers, cases, folder)`` starts ``world`` processes (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, a gloo process group on 127.0.0.1), each reading every case
through ``PrxStreamingDataset`` and a ``DataLoader`` with ``workers`` worker processes, and returns
what each rank saw: its batches (sample ``uid``s), and where a case says ``stop_after``, the
``state_dict`` after that many batches; a case with ``resume`` loads that state first. Tests and
``python -m bench loader`` use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def uids(batch: list[dict[str, Any]]) -> list[int]:
    """DataLoader collate: the batch's sample uids (module level: workers may be spawned)."""
    return [int(s["uid"]) for s in batch]


def read_case(case: dict[str, Any], world: int, workers: int) -> dict[str, Any]:
    """One rank's pass over one case: its batches, and the state after ``stop_after`` batches."""
    from torch.utils.data import DataLoader

    from prx_assets.loader import PrxStreamingDataset

    source = {"spec": case["spec"]} if case.get("spec") else {"shard_sets": case["shard_sets"]}
    batch = int(case["batch_size"])
    ds = PrxStreamingDataset(**source, batch_size=batch, shuffle=True, shuffle_seed=int(case.get("seed", 17)),
                             batching_method=case.get("batching", "random"), num_canonical_nodes=1)
    try:
        if case.get("resume"):
            ds.load_state_dict(case["resume"])
        loader = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=uids)
        out: dict[str, Any] = {"batches": [], "epoch_size": int(ds.epoch_size), "live": int(ds.live_samples)}
        stop = case.get("stop_after")
        for got in loader:
            out["batches"].append(got)
            if stop is not None and len(out["batches"]) == stop:
                out["state"] = ds.state_dict(num_samples=stop * batch * world, from_beginning=False)
                break
        del loader
        return out
    finally:
        ds.close()


def rank_main(config_path: str) -> None:
    """Entry point of one rank process (``python -m bench.loader_ranks CONFIG``)."""
    import torch.distributed as dist

    cfg = json.loads(Path(config_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for case in cfg["cases"]:
        results[case["name"]] = read_case(case, world, int(cfg["workers"]))
        if world > 1:
            dist.barrier()
    Path(cfg["out"], f"rank{rank}.json").write_text(json.dumps(results))
    if world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(world: int, workers: int, cases: list[dict[str, Any]], folder: Path,
              timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Run ``cases`` on ``world`` rank processes; each rank's results, rank order. A rank that fails
    or outlives ``timeout_s`` fails the call with its output (and the other ranks are stopped)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    config.write_text(json.dumps({"workers": workers, "cases": cases, "out": str(folder)}))
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        log = open(folder / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, "-m", "bench.loader_ranks", str(config)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent), log))
    deadline = time.monotonic() + timeout_s
    try:
        for proc, _ in procs:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(_failure(procs, folder))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


def _failure(procs: list[tuple[subprocess.Popen[bytes], Any]], folder: Path) -> str:
    """The logs of the ranks that failed, the one that crashed first: a rank whose peer died only
    says the connection closed, so the others get a moment to end and the cause is shown first."""
    for proc, _ in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    failed = [(rank, proc.returncode) for rank, (proc, _) in enumerate(procs) if proc.returncode not in (0, None)]
    logs = {rank: (folder / f"rank{rank}.log").read_text()[-2000:] for rank, _ in failed}
    failed.sort(key=lambda rc: "Connection closed by peer" in logs[rc[0]])
    return "\n".join(f"rank {rank} exited {code}: {logs[rank]}" for rank, code in failed)


if __name__ == "__main__":
    rank_main(sys.argv[1])
