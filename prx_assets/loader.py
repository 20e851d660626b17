"""What a trainer imports to read PRX shard sets and mixtures with MosaicML streaming.

The code lives in :mod:`prx_assets.core.publish.loader`, beside the publish code that writes
what it reads; this module is its stable import path for training code.
"""

from prx_assets.core.publish.loader import (
    PrxShardSets,
    PrxStreamingDataset,
    ResolvedStreams,
    read_manifest,
    release_shared_memory,
    resolve,
    streaming_endpoint,
)

__all__ = ["PrxShardSets", "PrxStreamingDataset", "ResolvedStreams", "read_manifest", "release_shared_memory",
           "resolve", "streaming_endpoint"]
