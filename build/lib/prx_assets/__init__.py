"""prx_assets: a Dagster data platform for training text-to-image diffusion models."""

__version__ = "0.1.0"
