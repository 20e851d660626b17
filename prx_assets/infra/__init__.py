"""What runs around the asset graph: partitions and their orphans, staleness fingerprints and the
plan of what must run, stages run in-process or as SLURM jobs, pictures for the UI's metadata,
and the doctor (duplicates, orphans, leaked folders, stuck runs, integrity)."""
