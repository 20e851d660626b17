"""Enrichment: ``recaptions`` (batch x captioner) and ``image_embeddings``, run in-process or as SLURM jobs, and the caption-quality check."""

from prx_assets.defs.enrichment.assets import image_embeddings, recaptions, split_recaption_key
from prx_assets.defs.enrichment.checks import caption_quality

__all__ = ['caption_quality', 'image_embeddings', 'recaptions', 'split_recaption_key']
