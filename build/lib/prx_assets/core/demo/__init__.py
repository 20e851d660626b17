"""Demo tooling: the generated demo corpus and tiny offline models (not used by the pipeline)."""
