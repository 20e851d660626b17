"""Runs pipeline-stage partitions inside a SLURM (or local) job and reports through Pipes.

``python -m prx_assets.stage_job image_embeddings photos-00000 photos-00001 --resources JSON``;
started by :func:`prx_assets.infra.remote.run_stages`, never by hand. The partitions run one after
another in this process, so a model loads once per job; each reports its own result. A job
imports ``dagster_pipes`` and the stage's module under :mod:`prx_assets.core.stages`, never
Dagster itself.
"""

import argparse
import dataclasses
import sys

from dagster_pipes import open_dagster_pipes


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the stage for each partition, report each result dataclass as a Pipes custom
    message ``{"key": partition, "result": ...}``."""
    from prx_assets.core.stages import STAGES, load_stage
    from prx_assets.core.stages.settings import StageResources

    p = argparse.ArgumentParser(prog="prx_assets.stage_job")
    p.add_argument("stage", choices=sorted(STAGES))
    p.add_argument("partition_keys", nargs="+")
    p.add_argument("--resources", required=True)
    args = p.parse_args(argv)
    fn, _ = load_stage(args.stage)
    resources = StageResources.from_json(args.resources)
    from prx_assets.core.ingest.worker import worker_pools

    with open_dagster_pipes() as pipes, worker_pools():  # the job's partitions share one ingest pool
        for key in args.partition_keys:
            pipes.log.info(f"running {args.stage} {key}")
            result = fn(resources, key, pipes.log.info)
            pipes.report_custom_message({"key": key, "result": dataclasses.asdict(result)})
    return 0


if __name__ == "__main__":
    code = main()
    from prx_assets.core.processes import freeze_before_exit

    freeze_before_exit()  # with torch and transformers imported, 1.8-2.2 s of collecting at exit otherwise
    sys.exit(code)
