"""Runs one pipeline-stage partition inside a SLURM (or local) job and reports through Pipes.

``python -m prx_assets.stage_job recaptions 'photos-00000|detailed-1a2b' --resources JSON``;
started by :func:`prx_assets.defs.remote.run_stage`, never by hand.
"""

import argparse
import dataclasses
import sys

from dagster_pipes import open_dagster_pipes


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the stage, report its result dataclass as a Pipes custom message."""
    from prx_assets.defs.remote import STAGE_HOMES, StageResources, load_stage

    p = argparse.ArgumentParser(prog="prx_assets.stage_job")
    p.add_argument("stage", choices=sorted(STAGE_HOMES))
    p.add_argument("partition_key")
    p.add_argument("--resources", required=True)
    args = p.parse_args(argv)
    fn, _ = load_stage(args.stage)
    with open_dagster_pipes() as pipes:
        pipes.log.info(f"running {args.stage} {args.partition_key}")
        result = fn(StageResources.from_json(args.resources), args.partition_key, pipes.log.info)
        pipes.report_custom_message({"result": dataclasses.asdict(result)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
