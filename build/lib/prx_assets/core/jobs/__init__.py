"""Jobs on a cluster: the job-script renderer, SLURM output parsers, and executors (SLURM, local)."""
