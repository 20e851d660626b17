"""Enrichment: incremental per-image captions and embeddings, caption quality."""
