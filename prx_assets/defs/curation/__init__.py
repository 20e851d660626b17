"""Curation: ``curated_subsets``, one partition per recipe, identified by content."""

from prx_assets.defs.curation.assets import curated_subsets

__all__ = ['curated_subsets']
