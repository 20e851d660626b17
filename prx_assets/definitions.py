"""The one Definitions object: assets, checks, sensors, jobs, resources bound once.

Nothing here reads files, the environment or the network at import time: resources
resolve the data root and config when a run or sensor uses them.
"""


import dagster as dg

from prx_assets.defs.curation import curated_subsets
from prx_assets.defs.enrichment import caption_quality, image_embeddings, recaptions
from prx_assets.defs.ingest import ingest_job, jpeg_q92_cycles, raw_batch_sensor, raw_images
from prx_assets.defs.lab import (
    lance_maintenance,
    lance_maintenance_schedule,
    lance_maintenance_sensor,
    lance_table,
)
from prx_assets.defs.mixture import training_mixture
from prx_assets.defs.shards import mds_readback, mds_shards
from prx_assets.defs.training import training_run, training_sensor
from prx_assets.resources.models import CaptionerResource, EmbedderResource
from prx_assets.resources.s3 import PrxS3Resource as S3Resource
from prx_assets.resources.slurm import SlurmResource
from prx_assets.resources.storage import ProjectConfigResource, StorageResource

defs = dg.Definitions(
    assets=[raw_images, recaptions, image_embeddings, lance_table, curated_subsets, mds_shards,
            training_mixture, training_run],
    asset_checks=[jpeg_q92_cycles, caption_quality, mds_readback],
    jobs=[ingest_job, lance_maintenance],
    schedules=[lance_maintenance_schedule],
    sensors=[raw_batch_sensor, training_sensor, lance_maintenance_sensor],
    resources={
        "storage": StorageResource(),
        "project": ProjectConfigResource(),
        # Endpoint and credentials come from AWS_ENDPOINT_URL / AWS_* in the environment.
        "s3": S3Resource(),
        "captioner": CaptionerResource(),
        "embedder": EmbedderResource(),
        # Jobs: SLURM when `sinfo` answers, else a local subprocess running the same script.
        "slurm": SlurmResource(),
    },
)
