"""Code that runs inside training jobs (SLURM or local): no Dagster import, only dagster-pipes."""
