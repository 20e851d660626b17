"""The one schema source of truth for the Lance tables (and, later, the MDS columns).

``images`` holds one row per accepted image; the JPEG bytes are written once, by
ingest. Later stages add columns (captions, embeddings) through Lance schema
evolution without rewriting these. ``rejects`` holds one row per file that was not
ingested, with the reason.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

IMAGES_TABLE = "images"
REJECTS_TABLE = "rejects"

#: Field metadata for columns of already-compressed bytes (JPEG, PNG, WebP): Lance writes their
#: pages as they are. Its default tries a general-purpose compression on every page, which gains
#: nothing on such bytes (the same size to 0.1%) and cost 0.08-0.10 s more CPU per 500 stored
#: photos (64 MB) on each append and 40% more time on a scan of the column (docs/benchmark-notes.md, the
#: ``lance_maintenance`` entry). New tables get it at creation;
#: :func:`~prx_assets.core.lab.table.apply_encodings` (run by ``lance_maintenance``) gives it to an
#: older table, whose later appends and updates then follow it. (Lance 14.0.2's compaction does
#: not: it writes the fragments it merges with its default encodings, whatever the field says.)
STORED_AS_IS = {"lance-encoding:compression": "none"}

IMAGES_SCHEMA = pa.schema([
    pa.field("image_id", pa.string(), nullable=False,
             metadata={"doc": "16 hex chars: blake2b-64 of the source name and the item's key relative "
                                "to the source's location"}),
    pa.field("source", pa.string(), nullable=False),
    pa.field("batch", pa.string(), nullable=False, metadata={"doc": "ingest partition key"}),
    pa.field("uri", pa.string(), nullable=False, metadata={"doc": "where the original lives"}),
    pa.field("jpeg", pa.large_binary(), nullable=False,
             metadata={"doc": "the stored image bytes: JPEG q92, or lossless (see stored_format)",
                       **STORED_AS_IS}),
    pa.field("jpeg_bytes", pa.int64(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("orig_width", pa.int32(), nullable=False),
    pa.field("orig_height", pa.int32(), nullable=False),
    pa.field("orig_format", pa.string(), nullable=False),
    pa.field("orig_mode", pa.string(), nullable=False),
    pa.field("orig_bytes", pa.int64(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False, metadata={"doc": "of the original bytes"}),
    pa.field("phash", pa.uint64(), nullable=False, metadata={"doc": "64-bit DCT perceptual hash"}),
    pa.field("aspect_ratio", pa.float32(), nullable=False),
    pa.field("aspect_bucket", pa.string(), nullable=False),
    pa.field("original_caption", pa.string()),
    pa.field("license", pa.string()),
    pa.field("extra", pa.string(), metadata={"doc": "JSON object of carried source fields"}),
    pa.field("ingest_config", pa.string(), nullable=False,
             metadata={"doc": "fingerprint of the normalization settings"}),
    # Added with content-aware storage (null on rows written before it: those hold JPEG).
    pa.field("stored_format", pa.string(),
             metadata={"doc": "format of the bytes in `jpeg`: jpeg, or png/webp when stored losslessly"}),
    pa.field("q92_psnr_db", pa.float32(),
             metadata={"doc": "first-generation PSNR of the image's JPEG at the configured quality"}),
    # Added with integrity checks (null on rows written before: `prx-assets migrate` fills it).
    pa.field("stored_sha256", pa.string(),
             metadata={"doc": "sha256 of the stored bytes (`jpeg`): publishing and doctor --verify check them"}),
])

REJECTS_SCHEMA = pa.schema([
    pa.field("image_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("batch", pa.string(), nullable=False),
    pa.field("uri", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("message", pa.string(), nullable=False),
    pa.field("orig_bytes", pa.int64(), nullable=False),
])


def image_id(source: str, key: str) -> str:
    """Stable id of an item: 16 hex chars of blake2b over its source's name and its key within the
    source (relative to the source's location: see :mod:`prx_assets.core.ingest.sources`), so
    re-pointing a source at a new mount or prefix holding the same files changes no id.

    >>> image_id("photos", "people/a.jpg") == image_id("photos", "people/a.jpg") != image_id("web", "people/a.jpg")
    True
    """
    return hashlib.blake2b(f"{source}\0{key}".encode(), digest_size=8).hexdigest()

CAPTIONS_TABLE = "captions"

CAPTIONS_SCHEMA = pa.schema([
    pa.field("image_id", pa.string(), nullable=False),
    pa.field("captioner_id", pa.string(), nullable=False,
             metadata={"doc": "<name>-<hash of model, prompt and generation settings>"}),
    pa.field("batch", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False, metadata={"doc": "of the captioned original"}),
    pa.field("caption", pa.string(), nullable=False),
    pa.field("tokens", pa.int32(), nullable=False),
    pa.field("seconds", pa.float32(), nullable=False, metadata={"doc": "generation time per image"}),
    pa.field("hit_max_tokens", pa.bool_(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
])


def embeddings_table(embedder_id: str) -> str:
    """Name of the table holding one embedder's vectors (dimension is fixed per table)."""
    return f"embeddings_{embedder_id}"


#: Stored precisions of embedding vectors (``EmbedderSpec.vector_dtype``).
VECTOR_DTYPES: dict[str, pa.DataType] = {"float32": pa.float32(), "float16": pa.float16()}


def embeddings_schema(dim: int, vector_dtype: str = "float32") -> pa.Schema:
    """Schema of an embeddings table with ``dim``-dimensional vectors stored as ``vector_dtype``."""
    return pa.schema([
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("embedder_id", pa.string(), nullable=False),
        pa.field("batch", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(VECTOR_DTYPES[vector_dtype], dim), nullable=False,
                 metadata={"doc": "L2-normalized image vector"}),
        pa.field("model", pa.string(), nullable=False),
    ])


#: MDS columns of a shard set, named after Photoroom's PRX training code so that trainer can
#: consume our shards unchanged: exact stored JPEG bytes in ``image``, captions in string
#: columns named by caption key, ``original_width`` / ``original_height``.
MDS_BASE_COLUMNS: dict[str, str] = {
    "image": "bytes",
    "image_id": "str",
    "source": "str",
    "width": "int32",
    "height": "int32",
    "original_width": "int32",
    "original_height": "int32",
    "aspect_bucket": "str",
}

#: Lab column feeding each MDS base column.
MDS_FROM_LAB: dict[str, str] = {
    "image": "jpeg", "image_id": "image_id", "source": "source", "width": "width", "height": "height",
    "original_width": "orig_width", "original_height": "orig_height", "aspect_bucket": "aspect_bucket",
}
