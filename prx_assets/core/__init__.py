"""Dagster-free domain code: images, sources, batches, the Lance table, JPEG quality.

Everything here is importable and usable from a notebook without Dagster.
"""
