"""Publishing: MDS shard sets and training mixtures."""
