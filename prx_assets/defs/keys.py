"""Every asset's key and group, in graph order: the one place a stage's name is spelled.

Stage names in ``core/`` (the stage table, writer leases) are these keys' names; a test keeps
them equal.
"""

import dagster as dg

RAW_IMAGES = dg.AssetKey("raw_images")
IMAGE_EMBEDDINGS = dg.AssetKey("image_embeddings")
RECAPTIONS = dg.AssetKey("recaptions")
LANCE_TABLE = dg.AssetKey("lance_table")
CURATED_SUBSETS = dg.AssetKey("curated_subsets")
MDS_SHARDS = dg.AssetKey("mds_shards")
TRAINING_MIXTURE = dg.AssetKey("training_mixture")
TRAINING_RUN = dg.AssetKey("training_run")

#: The assets in graph order.
ASSETS = (RAW_IMAGES, IMAGE_EMBEDDINGS, RECAPTIONS, LANCE_TABLE, CURATED_SUBSETS, MDS_SHARDS, TRAINING_MIXTURE,
          TRAINING_RUN)
#: Each asset's group in the UI.
GROUPS = {RAW_IMAGES: "ingest", IMAGE_EMBEDDINGS: "enrichment", RECAPTIONS: "enrichment", LANCE_TABLE: "lab",
          CURATED_SUBSETS: "curation", MDS_SHARDS: "curation", TRAINING_MIXTURE: "training", TRAINING_RUN: "training"}


def group(key: dg.AssetKey) -> str:
    """The UI group of asset ``key``."""
    return GROUPS[key]
