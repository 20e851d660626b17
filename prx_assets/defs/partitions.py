"""Partition definitions shared by the stages."""


import dagster as dg

#: One partition per ingest batch, keyed ``<source>-<seq>`` (e.g. ``photos-00003``).
#: Discovery (``raw_batch_sensor`` or ``prx-assets discover``) adds keys as new files arrive.
raw_batches = dg.DynamicPartitionsDefinition(name="raw_batches")

#: One partition per captioner id (``<name>-<hash>``) from models.yaml; registered by
#: discovery, so a new captioner adds a column of partitions to backfill.
captioner_partitions = dg.DynamicPartitionsDefinition(name="captioners")

#: recaptions: every ingest batch x every captioner (keys ``photos-00001|detailed-1a2b3c4d``).
recaption_partitions = dg.MultiPartitionsDefinition(
    {"batch": raw_batches, "captioner": captioner_partitions})

#: One partition per recipe in recipes.yaml; recipes added to the file appear as partitions.
recipe_partitions = dg.DynamicPartitionsDefinition(name="recipes")

#: One partition per mixture in mixtures.yaml.
mixture_partitions = dg.DynamicPartitionsDefinition(name="mixtures")
