"""Ingest: ``raw_images`` (one partition per batch of a source), its blocking q92 check, and the sensor that discovers new batches."""

from prx_assets.defs.ingest.assets import discover_batches, ingest_resources, raw_images
from prx_assets.defs.ingest.checks import ingest_sample, jpeg_q92_cycles
from prx_assets.defs.ingest.sensors import ingest_job, raw_batch_sensor

__all__ = ['discover_batches', 'ingest_job', 'ingest_resources', 'ingest_sample', 'jpeg_q92_cycles', 'raw_batch_sensor', 'raw_images']
