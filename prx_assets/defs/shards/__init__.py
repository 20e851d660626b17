"""Publishing: ``mds_shards`` (immutable MDS shard sets, by deltas) and their blocking read-back check."""

from prx_assets.defs.shards.assets import mds_shards
from prx_assets.defs.shards.checks import mds_readback

__all__ = ['mds_readback', 'mds_shards']
