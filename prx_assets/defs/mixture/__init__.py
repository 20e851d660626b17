"""Mixtures: ``training_mixture``, shard sets with proportions resolved to a versioned spec."""

from prx_assets.defs.mixture.assets import streams_table, training_mixture

__all__ = ['streams_table', 'training_mixture']
