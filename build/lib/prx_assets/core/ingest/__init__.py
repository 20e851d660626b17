"""Ingest: source readers, batch manifests, image normalization, the JPEG q92 experiment."""
