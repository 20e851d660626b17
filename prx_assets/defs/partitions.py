"""Partition definitions shared by the stages."""


import dagster as dg

#: One partition per ingest batch, keyed ``<source>-<seq>`` (e.g. ``photos-00003``).
#: Discovery (``raw_batch_sensor`` or ``prx-assets discover``) adds keys as new files arrive.
raw_batches = dg.DynamicPartitionsDefinition(name="raw_batches")
