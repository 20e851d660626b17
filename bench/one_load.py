"""One model load per job: a 20-partition image_embeddings backfill as 20 stage jobs vs one job.

The jobs are the real stage-job processes (``python -m prx_assets.stage_job image_embeddings KEY
[KEY ...]``, as SLURM or the local executor runs them, here without Pipes): one process per
partition, each starting Python, importing torch and loading the embedder, against one process
that loads it once and works through all 20 partitions (what a ranged run now submits). Both sides
embed the same 20 freshly ingested batches (each round starts from a copy of the ingested root, so
neither side finds its work done), alternating after a warm-up of each. Reported: wall time of
both, the measured cut, and the cut predicted from the load share: what one job pays before its
first partition (start, imports, model load: a one-partition job less one partition's marginal
cost in the all-partitions job), paid once instead of 20 times.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prx_assets.core.config.project import IngestSettings, SourceConfig
from prx_assets.core.config.storage import DataRoot
from prx_assets.core.demo.corpus import generate_demo_corpus
from prx_assets.core.demo.tiny_models import build_tiny_siglip
from prx_assets.core.ingest.batches import discover, load_manifests
from prx_assets.core.ingest.pipeline import ingest_batch
from prx_assets.core.ingest.readers import reader_for

PARTITIONS = int(os.environ.get("PRX_BENCH_ONE_LOAD_PARTITIONS", "20"))
ROUNDS = int(os.environ.get("PRX_BENCH_ROUNDS", "3"))


def _jobs(root: Path, config: Path, keys: list[str], one_job: bool) -> float:
    """Run the stage for ``keys`` as one job or one job per key; wall seconds."""
    resources = json.dumps({"storage": {"data_root": str(root)}, "project": {"config_dir": str(config)},
                            "s3": None, "captioner": None, "embedder": {"device": "cpu"}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    started = time.perf_counter()
    for group in [keys] if one_job else [[k] for k in keys]:
        subprocess.run([sys.executable, "-W", "ignore", "-m", "prx_assets.stage_job", "image_embeddings", *group,
                        "--resources", resources], check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def run() -> dict[str, Any]:
    """Run the benchmark and return its figures."""
    tmp = Path(tempfile.mkdtemp(prefix="prx-bench-one-load-"))
    try:
        model = build_tiny_siglip(tmp / "tiny-siglip")
        config = tmp / "config"
        config.mkdir()
        (config / "models.yaml").write_text(f"captioners: []\nembedder: {{model: {model}, batch_size: 8}}\n")
        generate_demo_corpus(DataRoot(str(tmp)), n_photos=PARTITIONS * 4, n_catalog=0, n_web=0)
        base = tmp / "ingested"
        root = DataRoot(str(base))
        cfg = SourceConfig(name="b", kind="folder", location=str(tmp / "demo" / "photos"), batch_size=4,
                           ingest=IngestSettings(max_side=256))
        discover(cfg, reader_for(cfg), root)
        manifests = load_manifests(root, "b")[:PARTITIONS]
        for m in manifests:
            ingest_batch(m, reader_for(cfg), root, cfg.ingest)
        keys = [m.key for m in manifests]
        sides = {"per_partition": (keys, False), "one_job": (keys, True), "single": (keys[:1], True)}
        times: dict[str, list[float]] = {side: [] for side in sides}
        for r in range(ROUNDS + 1):  # round 0 warms every side up and is not counted
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for side in order:
                work = tmp / f"round-{r}-{side}"
                shutil.copytree(base, work)
                t = _jobs(work, config, sides[side][0], one_job=sides[side][1])
                shutil.rmtree(work)
                if r:
                    times[side].append(t)
        per, one, single = (statistics.median(times[s]) for s in ("per_partition", "one_job", "single"))
        # What a job pays before its first partition (start, imports, model load): a one-partition job
        # less one partition's marginal cost inside the all-partitions job. One job pays it once, not n times.
        marginal = max(0.0, one - single) / max(1, len(keys) - 1)
        load = max(0.0, single - marginal)
        return {"partitions": len(keys), "rounds": ROUNDS, "per_partition_jobs_s": round(per, 2),
                "one_job_s": round(one, 2), "single_partition_job_s": round(single, 2),
                "cut": round(1 - one / per, 4),
                "load_share_predicted": round(load * (len(keys) - 1) / per, 4),
                "job_start_and_load_s": round(load, 2), "partition_marginal_s": round(marginal, 3),
                "spread_per_partition_s": [round(x, 2) for x in times["per_partition"]],
                "spread_one_job_s": [round(x, 2) for x in times["one_job"]]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def format_table(r: dict[str, Any]) -> str:
    """Human-readable table."""
    return "\n".join([
        f"image_embeddings backfill of {r['partitions']} partitions (tiny SigLIP, CPU), median of {r['rounds']} "
        "alternating rounds",
        f"  one job per partition: {r['per_partition_jobs_s']} s   one job for all: {r['one_job_s']} s",
        f"  wall time cut {r['cut']:.1%}; predicted by the per-job start + load ({r['job_start_and_load_s']} s, "
        f"paid {r['partitions'] - 1} fewer times): {r['load_share_predicted']:.1%}"])
