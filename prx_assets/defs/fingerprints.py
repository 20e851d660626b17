"""Each asset's input fingerprint function, in one table: what planning compares with what the
asset recorded to tell a stale partition (see :mod:`prx_assets.infra.staleness`). Nothing
registers itself at import: an asset without an entry here is planned only when missing.
"""

import dagster as dg

from prx_assets.defs.curation.assets import curated_fingerprint
from prx_assets.defs.enrichment.assets import embeddings_fingerprint, recaptions_fingerprint
from prx_assets.defs.ingest.assets import raw_images_fingerprint
from prx_assets.defs.keys import (
    CURATED_SUBSETS,
    IMAGE_EMBEDDINGS,
    LANCE_TABLE,
    MDS_SHARDS,
    RAW_IMAGES,
    RECAPTIONS,
    TRAINING_MIXTURE,
    TRAINING_RUN,
)
from prx_assets.defs.lab.assets import lab_fingerprint
from prx_assets.defs.mixture.assets import mixture_fingerprint
from prx_assets.defs.shards.assets import shards_fingerprint
from prx_assets.defs.training.assets import training_fingerprint
from prx_assets.infra.staleness import FingerprintFn

FINGERPRINTS: dict[dg.AssetKey, FingerprintFn] = {
    RAW_IMAGES: raw_images_fingerprint,
    IMAGE_EMBEDDINGS: embeddings_fingerprint,
    RECAPTIONS: recaptions_fingerprint,
    LANCE_TABLE: lab_fingerprint,
    CURATED_SUBSETS: curated_fingerprint,
    MDS_SHARDS: shards_fingerprint,
    TRAINING_MIXTURE: mixture_fingerprint,
    TRAINING_RUN: training_fingerprint,
}


def fingerprint_for(key: dg.AssetKey) -> FingerprintFn | None:
    """The fingerprint function of asset ``key`` (``None``: planned only when missing)."""
    return FINGERPRINTS.get(key)
